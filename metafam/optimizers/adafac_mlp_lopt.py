"""`AdafacMLPLOpt`: a small per-parameter MLP fed with momenta and Adafactor-style factored second moments.

This is the "small_fc" / adafac MLP learned optimizer family of Metz et al. 2022 ("Practical tradeoffs between
memory, compute, and performance in learned optimizers"): a tiny MLP (default two hidden layers of width 4) applied
to every scalar parameter, whose inputs include factored (row / column) second-moment statistics, so the optimizer
state costs ``K`` momenta plus ``O(rows + columns)`` per matrix instead of another full copy per decay.

Accumulators, one per decay ``b_k`` (default ``(0.9, 0.99, 0.999)``, learned; all zero-initialized, float32):

  * momenta ``m_k <- b_k m_k + (1 - b_k) g``;
  * for a tensor of rank >= 2, factors over its last two dims (``g2 = g^2``): row ``R_k <- b_k R_k + (1 - b_k)
    mean(g2, axis=-1)`` and column ``C_k <- b_k C_k + (1 - b_k) mean(g2, axis=-2)``, and the Adafactor estimate
    ``v_k = R_k C_k / mean(R_k)`` (0 where ``mean(R_k) == 0``); for vectors and scalars the full second moment
    ``v_k <- b_k v_k + (1 - b_k) g2`` (and ``R_k = C_k = v_k`` below).

Per-element features (``K = 3``: 17), each RMS-normalized over its tensor (and vmapped lane):

  =========================  ===================================================================================
  0, 1                       the gradient ``g`` and the parameter ``p``
  2 .. 1+K                   momenta ``m_k``
  2+K .. 1+2K, 2+2K .. 1+3K  row and column factors ``R_k``, ``C_k`` broadcast over the tensor
  2+3K .. 1+4K               Adafactor-normalized gradient ``g / sqrt(v_k + eps)``
  2+4K .. 1+5K               Adafactor-normalized momentum ``m_k / sqrt(v_k + eps)``
  =========================  ===================================================================================

With ``orthogonal_momentum=True`` (registered as ``adafac_muon_mlp_lopt``) one more feature, 2+5K, follows: Muon's
update direction (Jordan et al. 2024), the momentum ``m_k`` of the decay nearest 0.9 orthogonalized by Muon's
Newton-Schulz iteration (`metafam.optimizers.newton_schulz.orthogonalize`: bit for bit the direction of
`optax.contrib.scale_by_muon` without its own momentum; a tensor of rank >= 2 as the matrix
``[prod(shape[:-1]), shape[-1]]``), and for vectors and scalars the Adafactor-normalized momentum ``m_k /
sqrt(v_k + eps)`` of that decay, as Muon pairs with Adam for those. It is the direction of steepest descent under
the spectral norm, a non-diagonal preconditioner no per-element feature can express (how the descent init below on
it alone compares with tuned Adam: docs/results/ablations.md).

With ``unit_rms_step=True`` the network chooses only the step's direction: ``u = d * exp(exp_mult * s)`` is
normalized to unit RMS over each tensor (and lane) and the step is ``step_mult * u / rms(u)``, so every tensor moves by
exactly ``step_mult`` in RMS, and ``step_mult`` acts as a learning rate; it may be an optax schedule of the update
count (``step_mult`` may be a callable for every variant). Registered with the orthogonalized momentum and without
step features (``time_scales=()``: nothing about the horizon is built in) as ``adafac_muon_rms_lopt``, the
generalist recipe's optimizer (`metafam.runs.recipes`, pretrained as `metafam.pretrained`'s
``generalist_v1``). Its features are normalized per tensor, so a step's direction does not depend on the scale of
the tensor and its gradient, and its size is the learning rate's: like Adam's, it is chosen for the
parameterization (reparameterized as ``w = s * w'``, the same rate moves ``w`` by ``s`` times more). The
direction's invariance to the gradient's scale holds while every feature's RMS is well above ``sqrt(norm_eps)``
(1e-6): the row and column factors scale like ``(1 - b_k) g^2``, so for the slowest decay (0.999) they reach that floor
once gradients are below ~0.03 per element, and the network then sees them shrunk. ``fan_in_power`` adds a
µP-style step scale ``(base_fan_in / fan_in) ** fan_in_power`` for matrices (off by default; its effect on the
heldout suite: `docs/results/heldout.md`).

The per-element features are joined by the 11 step features ``tanh(t / tau - 1)`` of
`metafam.optimizers.mlp_lopt.time_features` (not normalized). The MLP outputs a direction ``d`` and log-magnitude
``s``; ``p <- p - d * exp(exp_mult * s) * step_mult``.

Meta-parameters (default config): 149 = MLP ``28 -> 4 -> 4 -> 2`` (146) + 3 decay logits; with
``orthogonal_momentum=True`` (``adafac_muon_mlp_lopt``): 153 (MLP ``29 -> 4 -> 4 -> 2``); that without step
features (``adafac_muon_rms_lopt``): 109 (MLP ``18 -> 4 -> 4 -> 2``). ``theta = {"mlp": {"w0",
"b0", "w1", "b1", "w2", "b2"}, "decay_logits": f32[K]}`` with ``1 - b_k = sigmoid(decay_logits[k])``.

Init (``descent_init``): two hidden units per layer pass one normalized feature to the direction output: ``m_k /
sqrt(v_k)`` for the decay nearest 0.9, so the optimizer starts as per-tensor-normalized Adafactor-momentum descent,
or with ``orthogonal_momentum`` the orthogonalized momentum (Muon on matrices, Adafactor momentum on vectors); steps
are about ``step_mult`` per element (1e-3 by default: small steps), and every meta-parameter gets a gradient.

The feature construction dominates an update (the width-4 MLP is cheap); ``orthogonal_momentum`` adds 5
Newton-Schulz iterations (small matrix products) per matrix and step (costs: docs/performance/inner-loop.md). The
state holds ``K`` momenta plus the factors (``K`` full second moments only for vectors and scalars).
"""

from __future__ import annotations

from typing import Any, Sequence, TypedDict, Union

import jax
import jax.numpy as jnp
import numpy as np

from metafam._checks import check_bool, check_positive_int
from metafam.optimizers import _features as F
from metafam.optimizers.contract import LearnedOptState
from metafam.optimizers.learned import LearnedOptimizer
from metafam.optimizers.mlp_lopt import DEFAULT_TIME_SCALES, rms_normalize, time_features
from metafam.optimizers.newton_schulz import orthogonalize


class AdafacTheta(TypedDict):
  """The meta-parameters: the per-element MLP's layers and one decay logit per accumulator (``1 - b_k =
  sigmoid(logit)``)."""
  mlp: Any
  decay_logits: jax.Array


class FactoredAccumulators(TypedDict):
  """A tensor of rank >= 2: ``K`` momenta and ``K`` row and column factors of the second moment."""
  momenta: jax.Array
  row: jax.Array
  col: jax.Array


class VectorAccumulators(TypedDict):
  """A vector or scalar: ``K`` momenta and ``K`` second moments."""
  momenta: jax.Array
  v: jax.Array


Accumulators = Union[FactoredAccumulators, VectorAccumulators]

DEFAULT_DECAYS = (0.9, 0.99, 0.999)


class AdafacMLPLOpt(F.PerElementMLP, LearnedOptimizer):
  """Per-parameter MLP with momenta and factored second moments; see the module docstring.

  Args:
    hidden_sizes: widths of the ReLU hidden layers (each >= 2 with ``descent_init``).
    decays: initial decays of the momenta and second-moment accumulators (learned via ``decay_logits``).
    time_scales: the ``tau`` of the step features.
    step_mult, exp_mult: ``step = d * exp(exp_mult * s) * step_mult``; ``step_mult`` may be a schedule
      ``iteration -> scale`` (e.g. an optax schedule).
    eps: added to ``v_k`` inside the reciprocal square root (1e-12: gradients below ~1e-6 lose scale invariance).
    norm_eps: the ``eps`` of the per-tensor RMS normalization.
    out_init_scale: output weights start as ``N(0, out_init_scale^2 / fan_in)``.
    descent_init: start as normalized Adafactor-momentum descent, or orthogonalized-momentum descent with
      ``orthogonal_momentum`` (see the module docstring).
    orthogonal_momentum: add the Newton-Schulz-orthogonalized momentum (Muon's direction) as a feature.
    unit_rms_step: normalize each tensor's step to RMS ``step_mult`` (the network sets only its direction).
    fan_in_power, base_fan_in: µP-style width scaling: the step of a tensor of rank >= 2 is multiplied by
      ``(base_fan_in / fan_in) ** fan_in_power`` with ``fan_in = prod(shape[:-1])`` (the rows of the matrix view
      that `orthogonalize` uses: a dense layer's inputs, a conv kernel's ``H * W * C_in``); vectors and scalars are
      not scaled. 0 (the default) turns it off; 1 is µP's rule for Adam-like updates of hidden weights.
  """

  low_rank_weights = True  # its matrices are read by F.mlp_columns / F.mlp_bias0 only

  def __init__(self, hidden_sizes: Sequence[int] = (4, 4), decays: Sequence[float] = DEFAULT_DECAYS,
               time_scales: Sequence[float] = DEFAULT_TIME_SCALES, step_mult: float = 1e-3, exp_mult: float = 1e-3,
               eps: float = 1e-12, norm_eps: float = 1e-12, out_init_scale: float = 1e-2, descent_init: bool = True,
               orthogonal_momentum: bool = False, unit_rms_step: bool = False, fan_in_power: float = 0.0,
               base_fan_in: int = 64):
    self.hidden_sizes = F.check_sizes("hidden_sizes", hidden_sizes, 2 if descent_init else 1)
    self.decays = F.check_decays("decays", decays)
    self.time_scales = F.check_time_scales(time_scales)
    self.step_mult = step_mult if callable(step_mult) else F.check_positive_float("step_mult", step_mult)
    self.exp_mult = F.check_positive_float("exp_mult", exp_mult, allow_zero=True)
    self.eps, self.norm_eps = F.check_positive_float("eps", eps), F.check_positive_float("norm_eps", norm_eps)
    self.out_init_scale = F.check_positive_float("out_init_scale", out_init_scale, allow_zero=True)
    self.descent_init = bool(descent_init)
    self.orthogonal_momentum = check_bool("orthogonal_momentum", orthogonal_momentum)
    self.unit_rms_step = check_bool("unit_rms_step", unit_rms_step)
    self.fan_in_power = F.check_positive_float("fan_in_power", fan_in_power, allow_zero=True)
    self.base_fan_in = check_positive_int("base_fan_in", base_fan_in)

  @property
  def name(self) -> str:
    options = (", orthogonal" if self.orthogonal_momentum else "") + (", unit RMS" if self.unit_rms_step else "")
    if self.fan_in_power:
      options += f", fan-in^-{self.fan_in_power:g} from {self.base_fan_in}"
    return f"AdafacMLPLOpt({'x'.join(map(str, self.hidden_sizes))}{options})"

  @property
  def num_leaf_features(self) -> int:
    return 2 + 5 * len(self.decays) + int(self.orthogonal_momentum)

  @property
  def momentum_index(self) -> int:
    """``k`` of the decay closest to 0.9 (of the initial decays)."""
    return int(np.argmin(np.abs(np.asarray(self.decays) - 0.9)))

  @property
  def direction_feature(self) -> int:
    """The feature the descent init passes through: ``m_k / sqrt(v_k + eps)`` for the decay closest to 0.9, or its
    orthogonalized momentum with ``orthogonal_momentum``."""
    k = len(self.decays)
    return 2 + 5 * k if self.orthogonal_momentum else 2 + 4 * k + self.momentum_index

  def init(self, key: jax.Array) -> AdafacTheta:
    sizes = (self.num_features,) + self.hidden_sizes + (2,)
    mlp = F.init_mlp(key, sizes, self.out_init_scale, self.direction_feature if self.descent_init else None)
    logits = np.asarray([F.logit(1.0 - d) for d in self.decays], np.float32)
    return AdafacTheta(mlp=mlp, decay_logits=jnp.asarray(logits))

  # -- one tensor ---------------------------------------------------------------------------------------------
  def init_accumulators(self, p: jax.Array) -> Accumulators:
    """Zero accumulators of one tensor: `FactoredAccumulators` for rank >= 2, else `VectorAccumulators`."""
    k, shape = len(self.decays), jnp.shape(p)
    momenta = F.zeros_like_in(p, (k,))
    if len(shape) >= 2:
      dt = F.compute_dtype(p)
      return FactoredAccumulators(momenta=momenta, row=jnp.zeros((k,) + shape[:-1], dt),
                                  col=jnp.zeros((k,) + shape[:-2] + shape[-1:], dt))
    return VectorAccumulators(momenta=momenta, v=F.zeros_like_in(p, (k,)))

  def step_scale(self, iteration: jax.Array) -> Any:
    """``step_mult`` at ``iteration``: the learning rate of the update about to be applied (a float, or the
    schedule's value)."""
    return self.step_mult(iteration) if callable(self.step_mult) else self.step_mult

  def leaf_step(self, theta: AdafacTheta, iteration: jax.Array):
    """``(p, g, accumulators) -> (step, new accumulators)`` for the update at ``iteration`` with ``theta``
    (the contract, `metafam.optimizers.contract`, subtracts the step)."""
    mlp, omd = theta["mlp"], jax.nn.sigmoid(theta["decay_logits"])
    bias0 = F.mlp_bias0(mlp, time_features(iteration, self.time_scales), self.num_leaf_features)
    scale = self.step_scale(iteration)
    return lambda p, g, acc: self.leaf_update(mlp, omd, bias0, p, g, acc, scale)

  def leaf_update(self, mlp: dict, one_minus_decay: jax.Array, bias0: jax.Array, p: jax.Array, g: jax.Array,
                  acc: Accumulators, scale: Any):
    """``(step, new accumulators)`` for one tensor (the step in the compute dtype); ``scale`` is `step_scale` of
    this update."""
    dt = acc["momenta"].dtype
    g, p_c, rank = g.astype(dt), p.astype(dt), jnp.ndim(p)
    omd = one_minus_decay.astype(dt)
    ema = lambda old, new, r: ((1 - F.decay_shape(omd, r)) * old + F.decay_shape(omd, r) * new).astype(dt)
    m = ema(acc["momenta"], g[None], rank)
    g2 = jnp.square(g)
    if rank >= 2:
      row = ema(acc["row"], jnp.mean(g2, axis=-1)[None], rank - 1)
      col = ema(acc["col"], jnp.mean(g2, axis=-2)[None], rank - 1)
      row_b, col_b = row[..., :, None], col[..., None, :]
      v = F.safe_div(row_b * col_b, jnp.mean(row, axis=-1)[..., None, None])
      row_f, col_f = jnp.broadcast_to(row_b, m.shape), jnp.broadcast_to(col_b, m.shape)
      new_acc = FactoredAccumulators(momenta=m, row=row, col=col)
    else:
      v = ema(acc["v"], g2[None], rank)
      row_f = col_f = v
      new_acc = VectorAccumulators(momenta=m, v=v)
    r = F.rsqrt_eps(v, self.eps)
    features = [g[None], p_c[None], m, row_f, col_f, g[None] * r, m * r]
    if self.orthogonal_momentum:
      k = self.momentum_index
      features.append(orthogonalize(m[k])[None] if rank >= 2 else m[k:k + 1] * r[k:k + 1])
    x = jnp.concatenate(features, axis=0)
    x = rms_normalize(x, range(1, x.ndim), self.norm_eps)
    out = F.mlp_columns(mlp, x.reshape(x.shape[0], -1), bias0, self.num_layers)
    step = out[0] * jnp.exp(self.exp_mult * out[1])
    if self.unit_rms_step:  # the network sets the direction only; the magnitude is the learning rate's
      step = step * jax.lax.rsqrt(jnp.mean(jnp.square(step)) + self.norm_eps)
    if self.fan_in_power and rank >= 2:  # static: the tensor's shape is known at trace time
      step = step * (self.base_fan_in / int(np.prod(jnp.shape(p)[:-1]))) ** self.fan_in_power
    return (step * jnp.asarray(scale, dt)).reshape(jnp.shape(p)), new_acc


AdafacOptaxState = LearnedOptState  # the optax state of `AdafacMLPLOpt.as_optax` (count, accumulators, extras {})
