"""`MLPNomLOpt`: a per-parameter MLP that learns corrections to a nominal Adam step.

A "nominal" hand-designed update is built in and the network only learns how to deviate from it (the idea behind
the nominal-term learned optimizers of Metz et al. 2022 and VeLO, here with Adam as the nominal term). With ``a`` the
bias-corrected Adam direction ``m_hat / (sqrt(v_hat) + eps)`` (``beta1``, ``beta2``, ``eps`` fixed, ``lr =
exp(log_lr)`` learned) and MLP outputs ``(o0, o1, o2)`` per element::

    p <- p - lr * a * exp(o0)  -  step_mult * o1 * exp(exp_mult * o2)

i.e. a learned multiplicative correction of the Adam step and a small learned additive step. The output layer starts
at zero (``out_init_scale = 0``), so at init ``o = 0`` and ``MLPNomLOpt`` *is* Adam with learning rate
``initial_lr`` (1e-3). Its weights get meta-gradients at once; the hidden layers from the first meta-update on.

Accumulators (zero-initialized, float32): momenta ``m_k`` for ``decays`` (default ``(0.9, 0.99, 0.999)``; Adam's
first moment is the momentum with decay ``beta1``, which must be one of them) and Adam's second moment ``v``.

Per-element features (``K = 3``: 7), each RMS-normalized over its tensor: the gradient, the parameter, the momenta,
``sqrt(v_hat)`` and the Adam direction ``a``; then the 11 step features ``tanh(t / tau - 1)`` (18 inputs). ``sqrt``
is `safe_sqrt` (zero slope at 0), so exact-zero gradient entries keep meta-gradients finite.

Meta-parameters (default config): 1,764 = MLP ``18 -> 32 -> 32 -> 3`` (1,763) + ``log_lr``. ``theta = {"mlp":
{"w0", "b0", "w1", "b1", "w2", "b2"}, "log_lr": f32[]}``.

Per-step cost: Adam plus an `MLPLOpt`-sized MLP per element (measured in docs/performance/inner-loop.md).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam.optimizers import _features as F
from metafam.optimizers.learned import LearnedOptimizer
from metafam.optimizers.mlp_lopt import DEFAULT_TIME_SCALES, rms_normalize, time_features

DEFAULT_DECAYS = (0.9, 0.99, 0.999)


class MLPNomLOpt(F.PerElementMLP, LearnedOptimizer):
  """Adam plus a learned per-parameter correction; see the module docstring.

  Args:
    initial_lr: Adam's initial learning rate (learned through ``log_lr``).
    beta1: Adam's first-moment decay; must be one of ``decays``.
    beta2, epsilon: Adam's second-moment decay and epsilon (fixed).
    decays: momentum decays (features; the one equal to ``beta1`` is Adam's first moment).
    hidden_sizes: widths of the ReLU hidden layers.
    time_scales: the ``tau`` of the step features.
    step_mult, exp_mult: scales of the additive term ``step_mult * o1 * exp(exp_mult * o2)``.
    norm_eps: the ``eps`` of the per-tensor RMS normalization.
    out_init_scale: output weights start as ``N(0, out_init_scale^2 / fan_in)`` (0: exactly Adam at init).
  """

  low_rank_weights = True  # its matrices are read by F.mlp_columns / F.mlp_bias0 only

  def __init__(self, initial_lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
               decays: Sequence[float] = DEFAULT_DECAYS, hidden_sizes: Sequence[int] = (32, 32),
               time_scales: Sequence[float] = DEFAULT_TIME_SCALES, step_mult: float = 1e-3, exp_mult: float = 1e-3,
               norm_eps: float = 1e-12, out_init_scale: float = 0.0):
    self.initial_lr, self.epsilon = F.check_positive_float("initial_lr", initial_lr), F.check_positive_float("epsilon", epsilon)
    self.decays = F.check_decays("decays", decays)
    self.beta2 = F.check_unit_interval("beta2", beta2)
    if F.check_unit_interval("beta1", beta1) not in self.decays:
      raise ValueError(f"beta1 must be one of decays={self.decays} (its momentum is Adam's), got {beta1!r}.")
    self.beta1 = float(beta1)
    self.hidden_sizes = F.check_sizes("hidden_sizes", hidden_sizes)
    self.time_scales = F.check_time_scales(time_scales)
    self.step_mult = F.check_positive_float("step_mult", step_mult)
    self.exp_mult = F.check_positive_float("exp_mult", exp_mult, allow_zero=True)
    self.norm_eps = F.check_positive_float("norm_eps", norm_eps)
    self.out_init_scale = F.check_positive_float("out_init_scale", out_init_scale, allow_zero=True)
    self._decay = np.asarray(self.decays, np.float32)
    self._one_minus_decay = (1.0 - np.asarray(self.decays, np.float64)).astype(np.float32)
    self._beta1_index = self.decays.index(self.beta1)

  @property
  def name(self) -> str:
    return f"MLPNomLOpt({'x'.join(map(str, self.hidden_sizes))}, lr0={self.initial_lr:g})"

  @property
  def num_leaf_features(self) -> int:
    return 4 + len(self.decays)

  def init(self, key: jax.Array) -> dict:
    sizes = (self.num_features,) + self.hidden_sizes + (3,)
    return {"mlp": F.init_mlp(key, sizes, self.out_init_scale),
            "log_lr": jnp.asarray(np.log(self.initial_lr), jnp.float32)}

  # -- the contract: per tensor ``{"momenta": [K, *shape], "v": shape}`` (compute dtype) ------------------------
  def init_accumulators(self, p: jax.Array) -> dict:
    return {"momenta": F.zeros_like_in(p, (len(self.decays),)), "v": F.zeros_like_in(p)}

  def leaf_step(self, theta: dict, count: jax.Array):
    bias0 = F.mlp_bias0(theta["mlp"], time_features(count, self.time_scales), self.num_leaf_features)
    t = (count + 1).astype(jnp.float32)
    # 1 - beta^t from log1p(-(1 - beta)), without cancellation for beta near 1.
    corr1 = -jnp.expm1(t * float(np.log1p(-(1.0 - self.beta1))))
    corr2 = -jnp.expm1(t * float(np.log1p(-(1.0 - self.beta2))))

    def leaf(p, g, acc):
      step, m, v = self.leaf_update(theta, bias0, corr1, corr2, p, g, acc["momenta"], acc["v"])
      return step, {"momenta": m, "v": v}
    return leaf

  def leaf_update(self, theta: dict, bias0: jax.Array, corr1: jax.Array, corr2: jax.Array, p: jax.Array,
                  g: jax.Array, m: jax.Array, v: jax.Array):
    """``(step, new momenta, new v)`` for one tensor; ``corr1, corr2``: Adam's bias corrections ``1 - beta^t``."""
    dt = v.dtype
    g, p_c, rank = g.astype(dt), p.astype(dt), jnp.ndim(p)
    m = (F.decay_shape(self._decay, rank) * m + F.decay_shape(self._one_minus_decay, rank) * g[None]).astype(dt)
    v = (self.beta2 * v + (1.0 - self.beta2) * jnp.square(g)).astype(dt)
    root = F.safe_sqrt(v / corr2)
    adam = (m[self._beta1_index] / corr1) / (root + self.epsilon)
    x = jnp.concatenate([g[None], p_c[None], m, root[None], adam[None]], axis=0)
    x = rms_normalize(x, range(1, x.ndim), self.norm_eps)
    o = F.mlp_columns(theta["mlp"], x.reshape(x.shape[0], -1), bias0, self.num_layers).reshape((3,) + jnp.shape(p))
    step = (jnp.exp(theta["log_lr"]) * adam * jnp.exp(o[0])
            + self.step_mult * o[1] * jnp.exp(self.exp_mult * o[2]))
    return step, m, v
