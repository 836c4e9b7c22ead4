"""`NNAdam`: Adam whose per-tensor hyper-parameters are set every step by a small learned LSTM.

Each step, every tensor (parameter leaf) is summarized by 10 statistics, computed from the gradient ``g``, the
parameter ``p`` and the first / second moments ``m``, ``v`` *before* this step's update (all logs are floored,
see `metafam.optimizers._features`):

  ====  ==================================================================================================
  0     ``0.1 * log rms(g)``
  1     ``0.1 * log mean |g|``
  2     ``0.1 * log rms(p)``
  3     ``0.1 * log rms(m)``
  4     ``0.1 * 0.5 * log mean(v)`` (the log RMS of the gradient history)
  5     ``cos(g, m)``: ``mean(g m) / (rms(g) rms(m))``, in [-1, 1]
  6-9   shape: +-1 flags (scalar, vector, rank >= 2) and ``0.1 * log(size)``
  ====  ==================================================================================================

plus the 11 step features ``tanh(t / tau - 1)`` (`metafam.optimizers.mlp_lopt.time_features`): 21 inputs. One LSTM
(hidden size 16, its state per tensor in the optimizer state) runs over the tensors as a batch; a linear head maps
its output to 4 controls ``c`` per tensor, which offset the base hyper-parameters in unconstrained coordinates::

    lr    = exp(log_lr + c0)                       1 - beta1 = sigmoid(logit_one_minus_beta1 + c1)
    eps   = exp(log_epsilon + c3)                  1 - beta2 = sigmoid(logit_one_minus_beta2 + c2)

The update is then Adam with these per-tensor values: ``m <- beta1 m + (1 - beta1) g``, ``v <- beta2 v + (1 -
beta2) g^2`` and ``p <- p - lr * (m / z1) / (sqrt(v / z2) + eps)``, where the bias corrections ``z <- beta z + (1 -
beta)`` (from 0) are exact for hyper-parameters that change over time (``z = 1 - beta^t`` for constant ``beta``).
``sqrt`` is `safe_sqrt` (zero slope at 0), so exact-zero gradient entries keep meta-gradients finite.

The head starts at zero, so at init ``NNAdam`` *is* Adam with the base hyper-parameters (default lr 1e-3, betas 0.9
and 0.999, eps 1e-8); the base values are meta-parameters too.

Meta-parameters (default config): 2,504 = LSTM 2,432 (``(21 + 16) * 64`` weights + 64 biases) + head 68 (``16 x
4`` + 4) + 4 base hyper-parameters. ``theta = {"lstm": {"w", "b"}, "head": {"w", "b"}, "log_lr",
"logit_one_minus_beta1", "logit_one_minus_beta2", "log_epsilon"}``.

Per-step cost: Adam's elementwise work plus a few reductions per tensor and one LSTM step over the tensors, whose
cost does not grow with tensor size (measured in docs/performance/inner-loop.md).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam.optimizers import _features as F
from metafam.optimizers.learned import LearnedOptimizer
from metafam.optimizers.mlp_lopt import DEFAULT_TIME_SCALES, time_features

NUM_STATS = 6


def tensor_statistics(p: jax.Array, g: jax.Array, m: jax.Array, v: jax.Array) -> jax.Array:
  """The 6 value statistics of one tensor (rows 0-5 of the module docstring's table), in ``m``'s dtype."""
  dt = m.dtype
  g, p = g.astype(dt), p.astype(dt)
  logs = jnp.stack([F.log_rms(g), F.log_mean_abs(g), F.log_rms(p), F.log_rms(m), 0.5 * jnp.log(jnp.mean(v) + 1e-16)])
  return jnp.concatenate([0.1 * logs, F.cosine(g, m)[None]])


class NNAdam(LearnedOptimizer):
  """Adam with per-tensor hyper-parameters from a learned LSTM; see the module docstring.

  Args:
    initial_lr, beta1, beta2, epsilon: the base hyper-parameters (and Adam's at init).
    lstm_hidden: the LSTM's hidden size.
    time_scales: the ``tau`` of the step features.
  """

  def __init__(self, initial_lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
               lstm_hidden: int = 16, time_scales: Sequence[float] = DEFAULT_TIME_SCALES):
    self.initial_lr, self.epsilon = F.check_positive_float("initial_lr", initial_lr), F.check_positive_float("epsilon", epsilon)
    self.beta1, self.beta2 = F.check_unit_interval("beta1", beta1), F.check_unit_interval("beta2", beta2)
    self.lstm_hidden = F.check_size("lstm_hidden", lstm_hidden)
    self.time_scales = F.check_time_scales(time_scales)

  @property
  def name(self) -> str:
    return f"NNAdam(lr0={self.initial_lr:g}, lstm={self.lstm_hidden})"

  @property
  def num_inputs(self) -> int:
    return NUM_STATS + F.NUM_SHAPE_FEATURES + len(self.time_scales)

  def init(self, key: jax.Array) -> dict:
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return {"lstm": F.init_lstm(key, self.num_inputs, self.lstm_hidden),
            "head": {"w": jnp.zeros((self.lstm_hidden, 4), jnp.float32), "b": jnp.zeros((4,), jnp.float32)},
            "log_lr": f32(np.log(self.initial_lr)), "log_epsilon": f32(np.log(self.epsilon)),
            "logit_one_minus_beta1": f32(F.logit(1.0 - self.beta1)),
            "logit_one_minus_beta2": f32(F.logit(1.0 - self.beta2))}

  def controls(self, theta: dict, stats: jax.Array, iteration: jax.Array, h: jax.Array, c: jax.Array):
    """``(controls [T, 4], h, c)`` from the per-tensor inputs ``stats: [T, 10]`` and the LSTM state ``[T, H]``."""
    tf = jnp.broadcast_to(time_features(iteration, self.time_scales), (stats.shape[0], len(self.time_scales)))
    x = jnp.concatenate([stats, tf.astype(stats.dtype)], axis=1)
    h_new, c_new = F.lstm_step(theta["lstm"], x, h, c)
    return h_new @ theta["head"]["w"] + theta["head"]["b"], h_new.astype(h.dtype), c_new.astype(c.dtype)

  # -- the contract: per tensor ``{"m", "v", "z1", "z2"}`` (compute dtype); extras: the LSTM state ``"h", "c"``
  has_extras = True

  def init_accumulators(self, p: jax.Array) -> dict:
    scalar = jnp.zeros((), F.compute_dtype(p))
    return {"m": F.zeros_like_in(p), "v": F.zeros_like_in(p), "z1": scalar, "z2": scalar}

  def init_extras(self, theta: dict, params, num_steps) -> dict:
    return F.init_lstm_extras(theta, params, self.lstm_hidden)

  def prepare_step(self, theta, count, params, grads, accumulators, extras, loss):
    """The per-step hook: one LSTM step over every tensor's statistics gives each tensor's Adam hyper-parameters."""
    dt = extras["h"].dtype
    stats = jnp.stack([jnp.concatenate([tensor_statistics(p, g, a["m"], a["v"]).astype(dt),
                                        jnp.asarray(F.shape_features(jnp.shape(p)), dt)])
                       for p, g, a in zip(params, grads, accumulators)])
    ctrl, h, c = self.controls(theta, stats, count, extras["h"], extras["c"])
    lr = jnp.exp(theta["log_lr"] + ctrl[:, 0])
    omb1 = jax.nn.sigmoid(theta["logit_one_minus_beta1"] + ctrl[:, 1])
    omb2 = jax.nn.sigmoid(theta["logit_one_minus_beta2"] + ctrl[:, 2])
    eps = jnp.exp(theta["log_epsilon"] + ctrl[:, 3])

    def leaf(i, p, g, acc):
      m, v, z1, z2 = acc["m"], acc["v"], acc["z1"], acc["z2"]
      adt = m.dtype
      g = g.astype(adt)
      a1, a2 = omb1[i].astype(adt), omb2[i].astype(adt)
      m = ((1 - a1) * m + a1 * g).astype(adt)
      v = ((1 - a2) * v + a2 * jnp.square(g)).astype(adt)
      z1, z2 = ((1 - a1) * z1 + a1).astype(adt), ((1 - a2) * z2 + a2).astype(adt)
      step = lr[i] * F.safe_div(m, z1) / (F.safe_sqrt(F.safe_div(v, z2)) + eps[i])  # z = 0 only if 1 - beta underflows
      return step, {"m": m, "v": v, "z1": z1, "z2": z2}
    return leaf, {"h": h, "c": c}
