"""`MLPLOpt`: a small per-parameter MLP learned optimizer (in the style of the standard "LOLv2" MLP optimizer).

Every scalar parameter is updated by the same MLP, applied to features of that element. For a leaf ``p`` with
gradient ``g`` at iteration ``t`` (updates applied so far), the 19 default features, in this order, are:

  ====  ==========================================================================================================
  0     the gradient ``g``
  1     the parameter value ``p``
  2-7   momenta ``m_k <- decay_k * m_k + (1 - decay_k) * g`` (updated with the current ``g`` before use), decays
        ``(0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)``, zero-initialized
  8-18  training-step features ``tanh(t / tau - 1)`` for ``tau`` in ``(1, 3, 10, ..., 30000, 100000)``, the same
        for every element
  ====  ==========================================================================================================

Features 0-7 are normalized per leaf (per tensor, and per vmapped lane): ``x / sqrt(mean(x^2) + norm_eps)`` with the
mean over all elements of that leaf, so each has root-mean-square 1 over its tensor whatever the gradient's scale.

The MLP (``19 -> 32 -> 32 -> 2``, ReLU hidden layers) outputs a direction ``d`` and a log-magnitude ``m`` and
``p <- p - d * exp(exp_mult * m) * step_mult``. Meta-parameters: ``theta = {"w0": f32[19, 32], "b0": f32[32],
"w1": f32[32, 32], "b1": f32[32], "w2": f32[32, 2], "b2": f32[2]}`` (1,762 scalars); layer ``i`` computes
``x @ w{i} + b{i}``.

Implementation: the update works leaf by leaf in a feature-major layout: the 8 per-element features of a leaf form
one ``[8, n]`` array (momenta are stored as ``[6, *leaf.shape]``, so no transposes are needed), the step features
enter the first layer as a per-step bias ``b0 + time_features @ w0[8:]``, and each layer is one ``w.T @ h`` matmul
``[out, in] @ [in, n]`` over the leaf (measured faster than `einsum` under `vmap` with batched ``theta``). This is
exactly the MLP on the ``[n, 19]`` feature matrix (`MLPLOpt.features` and `MLPLOpt.apply_mlp`, the reference path)
at a lower cost.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam.optimizers import _features as F
from metafam._checks import check_number
from metafam.optimizers.learned import LearnedOptimizer

DEFAULT_DECAYS = (0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)
DEFAULT_TIME_SCALES = (1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0, 30000.0, 100000.0)


def rms_normalize(x: jax.Array, axes: Sequence[int], eps: float = 1e-12) -> jax.Array:
  """``x / sqrt(mean(x^2 over axes) + eps)``; with ``eps > 0`` finite, with a finite derivative, also at ``x = 0``."""
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=tuple(axes), keepdims=True) + eps)


def time_features(iteration: jax.Array, time_scales: Sequence[float] = DEFAULT_TIME_SCALES) -> jax.Array:
  """``f32[len(time_scales)]``: ``tanh(iteration / tau - 1)`` for each ``tau``."""
  t = jnp.asarray(iteration).astype(jnp.float32)
  return jnp.tanh(t / jnp.asarray(time_scales, jnp.float32) - 1.0)


class MLPLOpt(F.PerElementMLP, LearnedOptimizer):
  """Per-parameter MLP learned optimizer; see the module docstring for the features and the update.

  Args:
    hidden_sizes: widths of the ReLU hidden layers (each at least 2 when ``descent_init``).
    decays: momentum decays; one feature each.
    time_scales: the ``tau`` of the step features.
    step_mult, exp_mult: ``step = d * exp(exp_mult * m) * step_mult``.
    norm_eps: the ``eps`` of the per-leaf RMS normalization.
    out_init_scale: the output layer's weights start as ``N(0, out_init_scale^2 / fan_in)``.
    descent_init: start as normalized-momentum descent (see `init`); otherwise all weights are random.
  """

  low_rank_weights = True  # its matrices are read by F.mlp_columns / F.mlp_bias0 only
  lane_chunk = 16  # see LearnedOptimizer; measured: docs/performance/inner-loop.md ("Flat lane scaling")

  def __init__(self, hidden_sizes: Sequence[int] = (32, 32), decays: Sequence[float] = DEFAULT_DECAYS,
               time_scales: Sequence[float] = DEFAULT_TIME_SCALES, step_mult: float = 1e-3, exp_mult: float = 1e-3,
               norm_eps: float = 1e-12, out_init_scale: float = 1e-2, descent_init: bool = True):
    hidden_sizes, decays, time_scales = tuple(hidden_sizes), tuple(decays), tuple(time_scales)
    if not hidden_sizes or not decays:
      raise ValueError(f"hidden_sizes and decays must be non-empty, got {hidden_sizes!r} and {decays!r}.")
    min_width = 2 if descent_init else 1
    self.hidden_sizes = tuple(int(check_number(f"hidden_sizes[{i}]", h, low=min_width, integer=True))
                              for i, h in enumerate(hidden_sizes))
    self.decays = tuple(float(check_number(f"decays[{i}]", d, low=0.0, high=1.0, high_open=True))
                        for i, d in enumerate(decays))
    self.time_scales = tuple(float(check_number(f"time_scales[{i}]", t, low=0.0, low_open=True))
                             for i, t in enumerate(time_scales))
    self.step_mult = float(check_number("step_mult", step_mult, low=0.0, low_open=True))
    self.exp_mult = float(check_number("exp_mult", exp_mult, low=0.0))
    # norm_eps > 0 also keeps the normalization (and its derivative) finite for an all-zero leaf.
    self.norm_eps = float(check_number("norm_eps", norm_eps, low=0.0, low_open=True))
    self.out_init_scale = float(check_number("out_init_scale", out_init_scale, low=0.0))
    self.descent_init = descent_init
    # (decay, 1 - decay) as float32 constants; 1 - decay is computed in float64 first.
    self._decay = np.asarray(self.decays, np.float32)
    self._one_minus_decay = (1.0 - np.asarray(self.decays, np.float64)).astype(np.float32)

  @property
  def name(self) -> str:
    return f"MLPLOpt({'x'.join(map(str, self.hidden_sizes))})"

  @property
  def num_leaf_features(self) -> int:
    """Per-element features: gradient, parameter, one per momentum."""
    return 2 + len(self.decays)

  @property
  def direction_feature(self) -> int:
    """The feature the descent init passes through: the momentum whose decay is closest to 0.9."""
    return 2 + int(np.argmin(np.abs(np.asarray(self.decays) - 0.9)))

  def init(self, key: jax.Array) -> dict:
    """Meta-parameters ``{"w{i}": f32[fan_in, fan_out], "b{i}": f32[fan_out]}`` (`F.init_mlp`).

    Hidden weights are ``N(0, 2 / fan_in)`` (He), output weights ``N(0, out_init_scale^2 / fan_in)``, biases 0.
    With ``descent_init`` two units per hidden layer are set to carry ``relu(x)`` and ``relu(-x)`` of the normalized
    0.9-momentum ``x`` unchanged to the output, where the direction output reads ``relu(x) - relu(-x) = x`` and the
    magnitude output ignores them. So initially ``d = x + small noise`` and ``m ~ 0``: the optimizer starts as
    per-tensor normalized momentum descent with steps of about ``step_mult`` per element, which decreases the loss,
    and every meta-parameter still gets a gradient.
    """
    sizes = (self.num_features,) + self.hidden_sizes + (2,)
    return F.init_mlp(key, sizes, self.out_init_scale, self.direction_feature if self.descent_init else None)

  # -- the contract: one tensor's momenta ``[num_decays, *shape]`` (the param's dtype) and step -----------------
  def init_accumulators(self, p: jax.Array) -> jax.Array:
    return jnp.zeros((len(self.decays),) + jnp.shape(p), jnp.result_type(p))

  def leaf_step(self, theta: dict, count: jax.Array):
    bias0 = F.mlp_bias0(theta, time_features(count, self.time_scales), self.num_leaf_features)

    def leaf(p, g, m):
      shape = (-1,) + (1,) * jnp.ndim(p)
      m = self._decay.reshape(shape) * m + self._one_minus_decay.reshape(shape) * g[None]
      m = m.astype(jnp.result_type(p))
      return self._leaf_step(theta, self.leaf_inputs(p, g, m), bias0).reshape(jnp.shape(p)), m
    return leaf

  # -- features and the MLP -----------------------------------------------------------------------------------
  def leaf_inputs(self, param: jax.Array, grad: jax.Array, momenta: jax.Array) -> jax.Array:
    """``f32[num_leaf_features, *shape]``: normalized gradient, parameter and momenta (``momenta: [K, *shape]``)."""
    x = jnp.concatenate([grad[None], param[None], momenta], axis=0).astype(jnp.float32)
    return rms_normalize(x, range(1, x.ndim), self.norm_eps)

  def features(self, param: jax.Array, grad: jax.Array, momenta: jax.Array, iteration: jax.Array) -> jax.Array:
    """``f32[*shape, num_features]``: all features of one leaf (momenta already updated with ``grad``)."""
    x = jnp.moveaxis(self.leaf_inputs(param, grad, momenta), 0, -1)
    tf = jnp.broadcast_to(time_features(iteration, self.time_scales), param.shape + (len(self.time_scales),))
    return jnp.concatenate([x, tf], axis=-1)

  def apply_mlp(self, theta: dict, x: jax.Array) -> jax.Array:
    """``f32[..., 2]`` (direction, log-magnitude) for features ``x: f32[..., num_features]``."""
    for i in range(self.num_layers):
      x = x @ theta[f"w{i}"] + theta[f"b{i}"]
      if i < self.num_layers - 1:
        x = jax.nn.relu(x)
    return x

  def step_from_outputs(self, out: jax.Array) -> jax.Array:
    """``d * exp(exp_mult * m) * step_mult`` for ``out[..., 0] = d``, ``out[..., 1] = m``."""
    return out[..., 0] * jnp.exp(self.exp_mult * out[..., 1]) * self.step_mult

  def _leaf_step(self, theta: dict, x: jax.Array, bias0: jax.Array) -> jax.Array:
    """``f32[n]``: the step for leaf inputs ``x: f32[num_leaf_features, *shape]`` (feature-major MLP)."""
    h = F.mlp_columns(theta, x.reshape(x.shape[0], -1), bias0, self.num_layers)
    return h[0] * jnp.exp(self.exp_mult * h[1]) * self.step_mult
