"""`RNNMLPLOpt`: a hierarchical learned optimizer: a per-tensor LSTM conditions a per-parameter MLP.

In the spirit of Wichrowska et al. 2017 and Metz et al. 2020 ("Tasks, stability, architecture, and compute"): a
small LSTM runs once per tensor (parameter leaf) on aggregated statistics of that tensor and emits a context vector;
the per-parameter MLP sees that context as extra inputs, so its per-element rule can adapt to the tensor, the
training phase and (through a cross-tensor mean) the whole model.

Accumulators (zero-initialized, float32): momenta ``m_k <- b_k m_k + (1 - b_k) g`` for ``decays`` (default
``(0.5, 0.9, 0.99, 0.999)``) and a second moment ``v <- b v + (1 - b) g^2`` (``b = rms_decay = 0.999``).

Per-tensor LSTM inputs (``K = 4``: 39): ``0.1 * log rms`` of ``g``, ``p`` and each ``m_k``; ``0.1 * 0.5 * log
mean(v)``; ``cos(g, m)`` for the momentum nearest 0.9; shape flags and ``0.1 * log(size)`` (4); the 11 step features
``tanh(t / tau - 1)``; and the mean over all tensors of the LSTM's previous hidden state (16), which lets tensors
exchange information (a DeepSets-style pooling). The LSTM state (``[num_tensors, 16]`` each for ``h`` and ``c``)
lives in the optimizer state. A linear map of the new ``h`` gives the tensor's context ``ctx`` (8 values).

Per-element MLP inputs: the gradient, the parameter, the momenta and ``m_k / sqrt(v + eps)`` (``2 + 2K = 10``),
each RMS-normalized over the tensor; then the step features and the tensor's ``ctx`` (constant over the tensor, so
they enter the first layer as a per-tensor bias; 29 inputs in all). The MLP (``29 -> 32 -> 32 -> 2``, ReLU) outputs
a direction ``d`` and a log-magnitude ``s``: ``p <- p - d * exp(exp_mult * s) * step_mult``.

Meta-parameters (default config): 5,802 = LSTM 3,584 (``(39 + 16) * 64 + 64``) + context map 136 (``16 x 8 + 8``)
+ MLP 2,082. ``theta = {"lstm": {"w", "b"}, "context": {"w", "b"}, "mlp": {"w0", "b0", ..., "b2"}}``.

Init (``descent_init``): as in `MLPLOpt`, two hidden units per layer pass the normalized 0.9-momentum to the
direction output, so the optimizer starts as per-tensor-normalized momentum descent with steps of about
``step_mult = 1e-3`` per element, while the context still reaches the other units (every meta-parameter gets a
gradient).

Per-step cost: an `MLPLOpt`-sized MLP per element plus one LSTM step over the tensors (measured in
docs/performance/inner-loop.md).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam.optimizers import _features as F
from metafam.optimizers.learned import LearnedOptimizer
from metafam.optimizers.mlp_lopt import DEFAULT_TIME_SCALES, rms_normalize, time_features

DEFAULT_DECAYS = (0.5, 0.9, 0.99, 0.999)


class RNNMLPLOpt(LearnedOptimizer):
  """Per-tensor LSTM + per-parameter MLP learned optimizer; see the module docstring.

  Args:
    hidden_sizes: widths of the per-parameter MLP's ReLU hidden layers (each >= 2 with ``descent_init``).
    lstm_hidden: the per-tensor LSTM's hidden size.
    context_size: the number of context values the LSTM passes to the MLP of each tensor.
    decays: momentum decays.
    rms_decay: the decay of the second moment.
    time_scales: the ``tau`` of the step features.
    step_mult, exp_mult: ``step = d * exp(exp_mult * s) * step_mult``.
    eps: added to ``v`` inside the reciprocal square root.
    norm_eps: the ``eps`` of the per-tensor RMS normalization.
    out_init_scale: output weights start as ``N(0, out_init_scale^2 / fan_in)``.
    descent_init: start as normalized momentum descent.
  """

  def __init__(self, hidden_sizes: Sequence[int] = (32, 32), lstm_hidden: int = 16, context_size: int = 8,
               decays: Sequence[float] = DEFAULT_DECAYS, rms_decay: float = 0.999,
               time_scales: Sequence[float] = DEFAULT_TIME_SCALES, step_mult: float = 1e-3, exp_mult: float = 1e-3,
               eps: float = 1e-12, norm_eps: float = 1e-12, out_init_scale: float = 1e-2, descent_init: bool = True):
    self.hidden_sizes = F.check_sizes("hidden_sizes", hidden_sizes, 2 if descent_init else 1)
    self.lstm_hidden = F.check_size("lstm_hidden", lstm_hidden)
    self.context_size = F.check_size("context_size", context_size)
    self.decays = F.check_decays("decays", decays)
    self.rms_decay = F.check_unit_interval("rms_decay", rms_decay)
    self.time_scales = F.check_time_scales(time_scales)
    self.step_mult = F.check_positive_float("step_mult", step_mult)
    self.exp_mult = F.check_positive_float("exp_mult", exp_mult, allow_zero=True)
    self.eps, self.norm_eps = F.check_positive_float("eps", eps), F.check_positive_float("norm_eps", norm_eps)
    self.out_init_scale = F.check_positive_float("out_init_scale", out_init_scale, allow_zero=True)
    self.descent_init = bool(descent_init)
    self._decay = np.asarray(self.decays, np.float32)
    self._one_minus_decay = (1.0 - np.asarray(self.decays, np.float64)).astype(np.float32)
    self._momentum_09 = int(np.argmin(np.abs(np.asarray(self.decays) - 0.9)))

  @property
  def name(self) -> str:
    return f"RNNMLPLOpt({'x'.join(map(str, self.hidden_sizes))}, lstm={self.lstm_hidden})"

  @property
  def num_leaf_features(self) -> int:
    return 2 + 2 * len(self.decays)

  @property
  def num_mlp_inputs(self) -> int:
    return self.num_leaf_features + len(self.time_scales) + self.context_size

  @property
  def num_stats(self) -> int:
    return 4 + len(self.decays)

  @property
  def num_lstm_inputs(self) -> int:
    return self.num_stats + F.NUM_SHAPE_FEATURES + len(self.time_scales) + self.lstm_hidden

  @property
  def num_layers(self) -> int:
    return len(self.hidden_sizes) + 1

  def init(self, key: jax.Array) -> dict:
    k_lstm, k_ctx, k_mlp = jax.random.split(key, 3)
    sizes = (self.num_mlp_inputs,) + self.hidden_sizes + (2,)
    pathway = 2 + self._momentum_09 if self.descent_init else None
    ctx_w = jax.random.normal(k_ctx, (self.lstm_hidden, self.context_size), jnp.float32)
    return {"lstm": F.init_lstm(k_lstm, self.num_lstm_inputs, self.lstm_hidden),
            "context": {"w": ctx_w * np.float32(1.0 / np.sqrt(self.lstm_hidden)),
                        "b": jnp.zeros((self.context_size,), jnp.float32)},
            "mlp": F.init_mlp(k_mlp, sizes, self.out_init_scale, pathway)}

  def tensor_statistics(self, p: jax.Array, g: jax.Array, m: jax.Array, v: jax.Array) -> jax.Array:
    """``[num_stats + 4]``: the value statistics and shape features of one tensor (momenta already updated)."""
    dt = v.dtype
    g, p = g.astype(dt), p.astype(dt)
    logs = jnp.stack([F.log_rms(g), F.log_rms(p)] + [F.log_rms(m[k]) for k in range(len(self.decays))]
                     + [0.5 * jnp.log(jnp.mean(v) + 1e-16)])
    return jnp.concatenate([0.1 * logs, F.cosine(g, m[self._momentum_09])[None],
                            jnp.asarray(F.shape_features(jnp.shape(p)), dt)])

  def tensor_step(self, mlp: dict, bias0: jax.Array, p: jax.Array, g: jax.Array, m: jax.Array,
                  v: jax.Array) -> jax.Array:
    """The step of one tensor (``m: [K, *shape]``, ``v`` updated), in the accumulators' dtype."""
    dt = v.dtype
    g, p_c = g.astype(dt), p.astype(dt)
    x = jnp.concatenate([g[None], p_c[None], m, m * F.rsqrt_eps(v, self.eps)[None]], axis=0)
    x = rms_normalize(x, range(1, x.ndim), self.norm_eps)
    out = F.mlp_columns(mlp, x.reshape(x.shape[0], -1), bias0, self.num_layers)
    return (out[0] * jnp.exp(self.exp_mult * out[1]) * self.step_mult).reshape(jnp.shape(p))

  # -- the contract: per tensor ``{"momenta": [K, *shape], "v": shape}``; extras: the LSTM state ``"h", "c"`` ----
  has_extras = True

  def init_accumulators(self, p: jax.Array) -> dict:
    return {"momenta": F.zeros_like_in(p, (len(self.decays),)), "v": F.zeros_like_in(p)}

  def init_extras(self, theta: dict, params, num_steps) -> dict:
    return F.init_lstm_extras(theta, params, self.lstm_hidden)

  def prepare_step(self, theta, count, params, grads, accumulators, extras, loss):
    """The per-step hook: every tensor's accumulators, then one LSTM step over all tensors gives their contexts."""
    new_acc = []
    for p, g, a in zip(params, grads, accumulators):
      m, v = a["momenta"], a["v"]
      gc = g.astype(v.dtype)
      shape = F.decay_shape(self._decay, jnp.ndim(p))
      new_acc.append({"momenta": (shape * m + F.decay_shape(self._one_minus_decay, jnp.ndim(p)) * gc[None]
                                  ).astype(m.dtype),
                      "v": (self.rms_decay * v + (1.0 - self.rms_decay) * jnp.square(gc)).astype(v.dtype)})

    # The per-tensor LSTM: one step over all tensors as a batch.
    h, c = extras["h"], extras["c"]
    dt = h.dtype
    num = len(params)
    tf = time_features(count, self.time_scales).astype(dt)
    stats = jnp.stack([self.tensor_statistics(p, g, a["momenta"], a["v"]).astype(dt)
                       for p, g, a in zip(params, grads, new_acc)])
    pooled = jnp.broadcast_to(jnp.mean(h, axis=0), (num, self.lstm_hidden))
    x = jnp.concatenate([stats, jnp.broadcast_to(tf, (num, tf.shape[0])), pooled], axis=1)
    h_new, c_new = F.lstm_step(theta["lstm"], x, h, c)
    ctx = h_new @ theta["context"]["w"] + theta["context"]["b"]

    mlp, nlf, nt = theta["mlp"], self.num_leaf_features, len(self.time_scales)
    bias0 = mlp["b0"] + tf @ mlp["w0"][nlf:nlf + nt] + ctx @ mlp["w0"][nlf + nt:]  # [T, hidden]

    def leaf(i, p, g, acc):
      a = new_acc[i]
      return self.tensor_step(mlp, bias0[i], p, g, a["momenta"], a["v"]), a
    return leaf, {"h": h_new.astype(h.dtype), "c": c_new.astype(c.dtype)}
