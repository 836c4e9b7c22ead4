"""`HyperV2`: the hypernetwork learned optimizer behind VeLO (Metz et al. 2022, "VeLO: Training Versatile Learned
Optimizers by Scaling Up"), in plain JAX with the reference library's theta layout, so its published weights run
unchanged.

A per-tensor LSTM reads summary statistics of every parameter tensor and emits, per tensor, ``param_inits`` mixing
coefficients ``c`` and a step multiplier ``s``; the tensor's per-parameter MLP has the weights
``100 * mean_k(c_k * W_k)`` over a learned bank of ``param_inits`` MLPs ``W_k``, and it maps per-element features to
a direction ``d`` and a log-magnitude ``m``:

    p <- p - s * d * (rms(p) * exp(exp_mult * m)) * step_mult          rms(p) = sqrt(mean(p^2) + 1e-9)

Accumulators (float32, one trailing axis per decay): momenta ``m_k`` (``initial_momentum_decays``, M of them),
second moments ``v_r`` of ``g`` (``initial_rms_decays``, R) and Adafactor-style factored second moments of
``g^2 + 1e-30`` (``initial_adafactor_decays``, F; over the two largest axes of tensors of rank >= 2, full otherwise).
Gradients are clipped to ``[-1000, 1000]`` first.

Per-element MLP inputs (30 by default, ``3 + 2M + 3R + 6F``), each normalized to root-mean-square 1 over the tensor
(``x / sqrt(mean(x^2) + 1e-5)``), in this order: ``g``, ``clip(g, -0.1, 0.1)``, ``p``, ``m``, ``v``,
``m / sqrt(v + 1e-6)``, ``1 / sqrt(v + 1e-6)``, the Adafactor-preconditioned ``g``, ``g / sqrt(v + 1e-6)``, then
the row and column factors, their reciprocal square roots and ``m`` times the factored preconditioner (for tensors
that are not factored: the full accumulator twice, its reciprocal square root twice and ``m / sqrt(v_full)``).
The MLP has ``ff_hidden_layers`` ReLU layers of ``ff_hidden_size`` and 3 outputs (the third is unused).

Per-tensor LSTM inputs (30 by default), computed from the state *before* this step's accumulator update, with
``p``, ``m`` and ``v`` scaled by ``1 / rms(p)``: ``tanh(10 (t / T - f))`` for the 9 fractions ``f`` of
`TIME_FRACTIONS` (``t`` the iteration, ``T`` the ``num_steps`` given to ``init``), 9 loss features (where the
smoothed loss lies between its running minimum and maximum, from `LossBuffer`), ``clip(log|10 mean v|)/2`` (R),
a one-hot of the number of axes longer than 1 (5), ``clip(log|10 var m|)/2`` (M) and the same of the spread of
``v`` around the momenta's mean (M; the reference's formula, kept so its weights mean the same). With
``mix_layers`` the inputs pass ``x -> W2 x + max_tensors relu(W1 x)`` (a DeepSets-style pooling over tensors) before
the LSTM, whose state (``[num_tensors, lstm_hidden_size]``) lives in the optimizer state and starts from the learned
``theta["lstm_init_state"]``.

``theta`` is the reference's tree: ``{"lstm_init_state": {"hidden", "cell"}, "rnn_params": {"linear", "linear_1",
"linear_2", "rnn/linear", "rnn_to_controls", "step_size"} (each {"w", "b"}), "ff_mod_stack": {"~": {"w0__0", ...,
"b0", "w1", "b1", ..., "b{L}"}}}``; ``rnn_params["linear"]`` is created and never read, as in the reference.
Meta-parameters: 2,320,385 for VeLO's size (``lstm_hidden_size=512, param_inits=256``) and 162,305
for the class default (128, 64). The registry's ``hyper_v2`` entry is a small one for meta-training on a laptop:
``lstm_hidden_size=8, param_inits=4`` with ``descent_init`` (``hyper_v2``): 1,985.

``descent_init`` (off by default, as in the reference) starts the optimizer as per-tensor-normalized Adam-like
descent: every bank member carries ``m / sqrt(v)`` of the 0.9 momentum through two ReLU units to the direction, the
mixing coefficients are ``0.01`` (so the mixed MLP is the bank's mean) and the step multiplier is 1. Without it,
initialization follows the reference (haiku's truncated normals of scale ``1 / sqrt(fan_in)``, zero biases).

Without a ``loss`` (``update(state, grad)``), the loss features see a constant loss of 1, the reference's
``constant_loss`` mode. Without ``num_steps`` at ``init``, ``default_num_steps`` is used.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metafam.optimizers import _features as F
from metafam.optimizers._hyper_v2_features import (NUM_LOSS_DECAYS, _clip_log_abs, factored_dims,  # noqa: F401
                                                   loss_buffer_features, loss_buffer_init, loss_buffer_update,
                                                   safe_rsqrt)
from metafam.optimizers.learned import LearnedOptimizer

TIME_FRACTIONS = (0.03, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1)
_BANK = "~"  # haiku's module name for parameters created outside a module (the reference's ff_mod_stack key)


class _Contract:
  """`HyperV2`'s side of the learned-optimizer contract (`metafam.optimizers.contract`): per tensor the
  accumulators ``{"mom": [*shape, M], "rms": [*shape, R], "v_row", "v_col", "v_diag"}`` (factored ones for rank >=
  2, the full one otherwise, the unused ones ``[0, F]``), in the compute dtype; extras: int32 ``num_steps``,
  ``lstm_hidden_state = {"hidden", "cell"}`` (``[num_tensors, H]`` each) and the ``loss_buffer``."""

  has_extras = True

  def init_accumulators(self, p: jax.Array) -> dict:
    m, r, f = self.num_decays
    dtype = F.compute_dtype(p)
    row, col, diag = _factored_shapes(jnp.shape(p))
    zeros = lambda shape, k: jnp.zeros(tuple(shape) + (k,), dtype)  # noqa: E731
    return {"mom": zeros(jnp.shape(p), m), "rms": zeros(jnp.shape(p), r), "v_row": zeros(row, f),
            "v_col": zeros(col, f), "v_diag": zeros(diag, f)}

  def init_extras(self, theta: dict, params: Any, num_steps: Any) -> dict:
    num_steps = self.default_num_steps if num_steps is None else num_steps
    leaves = jax.tree.leaves(params)
    dtype = F.compute_dtype(jnp.result_type(*leaves)) if leaves else jnp.float32
    tile = lambda x: jnp.tile(jnp.asarray(x), (len(leaves), 1))  # noqa: E731
    init_state = theta["lstm_init_state"]
    return {"num_steps": jnp.asarray(num_steps, jnp.int32),
            "lstm_hidden_state": {"hidden": tile(init_state["hidden"]), "cell": tile(init_state["cell"])},
            "loss_buffer": loss_buffer_init(10 if self.use_bugged_loss_features else num_steps, dtype)}

  def prepare_step(self, theta, count, params, grads, accumulators, extras, loss):
    """The per-step hook: the loss features, one LSTM step over every tensor's statistics (from the accumulators
    before this step's update) and every tensor's mixed MLP."""
    loss = 1.0 if self.constant_loss or loss is None else loss
    buffer = loss_buffer_update(extras["loss_buffer"], jnp.asarray(loss, extras["loss_buffer"]["means"].dtype))
    fraction = count / extras["num_steps"].astype(jnp.float32)
    shared = _shared_features(self, fraction, loss_buffer_features(buffer))
    stack = jnp.stack([_tensor_features(self, p.astype(a["mom"].dtype), a["mom"], a["rms"], shared)
                       for p, a in zip(params, accumulators)])
    old_h, old_c = extras["lstm_hidden_state"]["hidden"], extras["lstm_hidden_state"]["cell"]
    controls, lr_mult, (h, c) = self._rnn(theta, stack, old_h, old_c)
    h, c = h.astype(old_h.dtype), c.astype(old_c.dtype)
    if self.use_bugged_next_lstm_state:
      h, c = old_h, old_c
    if self.rnn_state_decay > 0.0:
      h, c = h * (1.0 - self.rnn_state_decay), c * (1.0 - self.rnn_state_decay)
    mixed = self._mixed_mlps(theta, controls)

    def leaf(i, p, g, acc):
      dtype = acc["mom"].dtype
      p, g = jnp.asarray(p, dtype), jnp.clip(jnp.asarray(g, dtype), -1000.0, 1000.0)
      mom, rms, row, col, diag, precondition = _accumulate(
          self, g, acc["mom"], acc["rms"], acc["v_row"], acc["v_col"], acc["v_diag"])
      mlp = {k: v[i] for k, v in mixed.items()}
      step = self._step(mlp, lr_mult[i], p, g, mom, rms, precondition, row, col, diag)
      return step, {"mom": mom, "rms": rms, "v_row": row, "v_col": col, "v_diag": diag}
    return leaf, {"num_steps": extras["num_steps"], "lstm_hidden_state": {"hidden": h, "cell": c},
                  "loss_buffer": buffer}

  def _rnn(self, theta: dict, x: jax.Array, h: jax.Array, c: jax.Array):
    """Mixing layer, one LSTM step and the two heads over the ``[num_tensors, inputs]`` batch ``x``."""
    rnn = theta["rnn_params"]
    dense = lambda name, v: v @ rnn[name]["w"] + rnn[name]["b"]  # noqa: E731
    if self.mix_layers:
      x = dense("linear_2", x) + jnp.max(jax.nn.relu(dense("linear_1", x)), axis=0, keepdims=True)
    h, c = F.lstm_step(rnn["rnn/linear"], x, h, c, haiku_layout=True)
    return dense("rnn_to_controls", h), dense("step_size", h)[:, 0], (h, c)

  def _mixed_mlps(self, theta: dict, controls: jax.Array) -> Dict[str, jax.Array]:
    """Every tensor's MLP, ``100 * mean_k(controls[t, k] * bank[k])``, as ``{"w0": [T, inputs, H], "b0", ...}``."""
    bank = theta["ff_mod_stack"][_BANK]
    weights = {"w0": jnp.concatenate([bank[f"w0__{i}"] for i in range(len(self.input_widths))], axis=1)}
    weights.update({k: v for k, v in bank.items() if not k.startswith("w0__")})
    return {k: jnp.tensordot(controls, v, axes=1) * np.float32(100.0 / self.param_inits) for k, v in weights.items()}

  def _step(self, mlp, lr_mult, p, g, mom, rms, precondition, row, col, diag) -> jax.Array:
    """The step of one tensor from its mixed per-element MLP."""
    shape = p.shape
    if p.ndim == 0:  # the reference runs scalars as 1-vectors
      p, g, mom, rms, precondition, diag = (x[None] for x in (p, g, mom, rms, precondition, diag))
    x = _leaf_inputs(p, g, mom, rms, precondition, row, col, diag)
    x = F.rsqrt_eps(jnp.mean(jnp.square(x), axis=tuple(range(p.ndim)), keepdims=True), 1e-5) * x
    o = x @ mlp["w0"] + mlp["b0"]
    for layer in range(1, self.ff_hidden_layers + 1):
      o = jax.nn.relu(o) @ mlp[f"w{layer}"] + mlp[f"b{layer}"]
    direction, magnitude = o[..., 0], jnp.exp(o[..., 1] * self.exp_mult)
    if self.param_scale_mult:
      scale = jnp.sqrt(jnp.mean(jnp.square(p)) + 1e-9)
      if self.clip_param_scale_amount is not None:
        scale = jnp.minimum(scale, np.float32(self.clip_param_scale_amount * np.sqrt(np.prod(p.shape))))
      magnitude = scale * magnitude
    step = lr_mult * (direction * magnitude * self.step_mult)
    if self.precondition_output:
      step = step * jax.lax.rsqrt(rms[..., -1] + 1e-6)
    return step.reshape(shape)


class HyperV2(_Contract, LearnedOptimizer):
  """VeLO's per-tensor-LSTM hypernetwork learned optimizer; see the module docstring.

  Args (the reference's names and defaults):
    lstm_hidden_size, ff_hidden_size, ff_hidden_layers, param_inits: network sizes.
    initial_momentum_decays, initial_rms_decays, initial_adafactor_decays: accumulator decays (``initial_rms_decays``
      has one entry or as many as the momenta, and the Adafactor ones as many as the momenta, or the reference's
      feature formulas do not broadcast).
    mix_layers: the cross-tensor pooling layer before the LSTM.
    exp_mult, step_mult: output scales.
    use_bugged_next_lstm_state: keep the LSTM state at its initial value (checkpoints trained that way).
    use_bugged_loss_features: loss half-lives built for 10 steps whatever ``num_steps`` (the reference's default).
    param_scale_mult: multiply steps by ``rms(p)``.
    precondition_output: divide steps by ``sqrt(v + 1e-6)`` of the last second moment.
    rnn_state_decay: shrink the LSTM state by ``1 - rnn_state_decay`` each step.
    constant_loss: feed a loss of 1 to the loss features.
    clip_param_scale_amount: cap ``rms(p)`` at this times ``sqrt(size)``.
    with_validation_feature_dim, validation_mode: one more LSTM input holding ``float(validation_mode)``.
    descent_init: metafam's descent initialization (see the module docstring); off in the reference.
    default_num_steps: the ``num_steps`` used when ``init`` is given none.
  """

  def __init__(self, lstm_hidden_size: int = 128, ff_hidden_size: int = 4, ff_hidden_layers: int = 2,
               initial_momentum_decays: Sequence[float] = (0.9, 0.99, 0.999),
               initial_rms_decays: Sequence[float] = (0.999,),
               initial_adafactor_decays: Sequence[float] = (0.9, 0.99, 0.999), param_inits: int = 64,
               mix_layers: bool = True, exp_mult: float = 0.001, step_mult: float = 0.001,
               use_bugged_next_lstm_state: bool = False, use_bugged_loss_features: bool = True,
               param_scale_mult: bool = True, precondition_output: bool = False, rnn_state_decay: float = 0.0,
               constant_loss: bool = False, clip_param_scale_amount: Optional[float] = None,
               with_validation_feature_dim: bool = False, validation_mode: bool = False,
               descent_init: bool = False, default_num_steps: int = 10_000):
    self.lstm_hidden_size = F.check_size("lstm_hidden_size", lstm_hidden_size)
    self.ff_hidden_size = F.check_size("ff_hidden_size", ff_hidden_size, minimum=2 if descent_init else 1)
    self.ff_hidden_layers = F.check_size("ff_hidden_layers", ff_hidden_layers)
    self.param_inits = F.check_size("param_inits", param_inits)
    self.initial_momentum_decays = F.check_decays("initial_momentum_decays", initial_momentum_decays)
    self.initial_rms_decays = F.check_decays("initial_rms_decays", initial_rms_decays)
    self.initial_adafactor_decays = F.check_decays("initial_adafactor_decays", initial_adafactor_decays)
    m, r, f = self.num_decays
    if r not in (1, m) or f != m:
      raise ValueError(f"initial_rms_decays must have 1 or {m} entries and initial_adafactor_decays {m} (as many as "
                       f"initial_momentum_decays), got {r} and {f}.")
    self.exp_mult = F.check_positive_float("exp_mult", exp_mult, allow_zero=True)
    self.step_mult = F.check_positive_float("step_mult", step_mult)
    self.rnn_state_decay = F.check_positive_float("rnn_state_decay", rnn_state_decay, allow_zero=True)
    self.clip_param_scale_amount = (None if clip_param_scale_amount is None
                                    else F.check_positive_float("clip_param_scale_amount", clip_param_scale_amount))
    self.default_num_steps = F.check_size("default_num_steps", default_num_steps)
    self.mix_layers, self.use_bugged_next_lstm_state = bool(mix_layers), bool(use_bugged_next_lstm_state)
    self.use_bugged_loss_features, self.param_scale_mult = bool(use_bugged_loss_features), bool(param_scale_mult)
    self.precondition_output, self.constant_loss = bool(precondition_output), bool(constant_loss)
    self.with_validation_feature_dim, self.validation_mode = bool(with_validation_feature_dim), bool(validation_mode)
    self.descent_init = bool(descent_init)

  @property
  def name(self) -> str:
    return f"HyperV2(lstm={self.lstm_hidden_size}, inits={self.param_inits})"

  @property
  def num_decays(self) -> Tuple[int, int, int]:
    return (len(self.initial_momentum_decays), len(self.initial_rms_decays), len(self.initial_adafactor_decays))

  @property
  def input_widths(self) -> Tuple[int, ...]:
    """Widths of the per-element input groups, in the module docstring's order (each group has its own ``w0__i``)."""
    m, r, f = self.num_decays
    return (1, 1, 1, m, r, m, r, f, r, f, f, f, f, max(m, f))

  @property
  def num_lstm_inputs(self) -> int:
    m, r, _ = self.num_decays
    return len(TIME_FRACTIONS) + NUM_LOSS_DECAYS - 1 + r + 5 + m + max(m, r) + int(self.with_validation_feature_dim)

  def _direction_input(self) -> int:
    """The input column of ``m / sqrt(v)`` for the momentum decay closest to 0.9 (the descent-init pathway)."""
    m, r, _ = self.num_decays
    return 3 + m + r + int(np.argmin(np.abs(np.asarray(self.initial_momentum_decays) - 0.9)))

  # -- theta ------------------------------------------------------------------------------------------------------
  def init(self, key: jax.Array) -> dict:
    """theta in the reference's layout (see the module docstring). Weights are haiku's default initialization,
    truncated normals of scale ``1 / sqrt(fan_in)`` (all drawn at once), biases are 0."""
    h, n_in, k = self.lstm_hidden_size, self.num_lstm_inputs, self.param_inits
    widths, sizes = self.input_widths, [self.ff_hidden_size] * self.ff_hidden_layers + [3]
    # (group, name, weight shape, fan_in) of every weight, then one draw for all of them.
    specs = [("rnn", name, (fan_in, fan_out), fan_in) for name, fan_in, fan_out in
             ([("linear", n_in, h), ("linear_1", n_in, h), ("linear_2", n_in, h)] if self.mix_layers else [])
             + [("rnn/linear", (h if self.mix_layers else n_in) + h, 4 * h), ("rnn_to_controls", h, k),
                ("step_size", h, 1)]]
    fan_in = sum(widths)
    for layer, width in enumerate(sizes):
      names = [(f"w0__{i}", w) for i, w in enumerate(widths)] if layer == 0 else [(f"w{layer}", fan_in)]
      specs += [("bank", name, (k, rows, width), fan_in) for name, rows in names]
      fan_in = width
    total = sum(int(np.prod(shape)) for _, _, shape, _ in specs)
    z = jax.random.truncated_normal(key, -2.0, 2.0, (total,), jnp.float32)
    rnn, bank, offset = {}, {}, 0
    for group, name, shape, fan_in in specs:
      size = int(np.prod(shape))
      w = z[offset:offset + size].reshape(shape) * np.float32(1.0 / np.sqrt(fan_in))
      offset += size
      if group == "rnn":
        rnn[name] = {"w": w, "b": jnp.zeros((shape[1],), jnp.float32)}
      else:
        bank[name] = w
    for layer, width in enumerate(sizes):
      bank[f"b{layer}"] = jnp.zeros((k, width), jnp.float32)
    if self.descent_init:
      rnn, bank = self._descent(rnn, bank, sizes)
    zeros = jnp.zeros((1, h), jnp.float32)
    return {"lstm_init_state": {"hidden": zeros, "cell": zeros}, "rnn_params": rnn, "ff_mod_stack": {_BANK: bank}}

  def _descent(self, rnn: dict, bank: dict, sizes: Sequence[int]) -> Tuple[dict, dict]:
    rnn = dict(rnn, rnn_to_controls={"w": jnp.zeros_like(rnn["rnn_to_controls"]["w"]),
                                     "b": jnp.full_like(rnn["rnn_to_controls"]["b"], 0.01)},
               step_size={"w": jnp.zeros_like(rnn["step_size"]["w"]), "b": jnp.ones_like(rnn["step_size"]["b"])})
    column, group = self._direction_input(), 0
    while column >= self.input_widths[group]:
      column, group = column - self.input_widths[group], group + 1
    bank = dict(bank)
    last = len(sizes) - 1
    for layer in range(len(sizes)):
      names = [f"w0__{i}" for i in range(len(self.input_widths))] if layer == 0 else [f"w{layer}"]
      for name in names:
        w = np.zeros(bank[name].shape[1:], np.float32)
        mask = np.zeros_like(w, bool)
        if layer == last:
          mask[:2, :], w[:2, 0] = True, (1.0, -1.0)
        else:
          mask[:, :2] = True
          if layer > 0:
            w[0, 0] = w[1, 1] = 1.0
          elif name == f"w0__{group}":
            w[column, :2] = (1.0, -1.0)
        scale = 1e-2 if layer == last else 1.0
        bank[name] = jnp.where(mask, w, bank[name] * scale)
    return rnn, bank


def _accumulate(lopt: HyperV2, g: jax.Array, mom, rms, row, col, diag):
  """One update of a leaf's accumulators; returns them and the Adafactor preconditioner ``[*shape, F]`` (or
  broadcastable to it) that multiplies ``g``."""
  dm, dr, df = (jnp.asarray(d, jnp.float32) for d in (lopt.initial_momentum_decays, lopt.initial_rms_decays,
                                                      lopt.initial_adafactor_decays))
  gx = g[..., None]
  mom = dm * mom + (1 - dm) * gx
  dr, df = jnp.clip(dr, 0.0, 1.0), jnp.clip(df, 0.0, 1.0)
  rms = dr * rms + (1 - dr) * (gx * gx)
  g2 = g * g + 1e-30
  dims = factored_dims(g.shape)
  if dims is None:
    diag = df * diag + (1 - df) * g2[..., None]
    return mom, rms, row, col, diag, safe_rsqrt(diag + 1e-9)
  d1, d0 = dims
  row = df * row + (1 - df) * jnp.mean(g2, axis=d0)[..., None]
  col = df * col + (1 - df) * jnp.mean(g2, axis=d1)[..., None]
  return mom, rms, row, col, diag, _factored_scale(row, col, dims)


def _factored_scale(row: jax.Array, col: jax.Array, dims: Tuple[int, int]) -> jax.Array:
  d1, d0 = dims
  reduced_d1 = d1 - 1 if d1 > d0 else d1
  row_factor = safe_rsqrt(row / (jnp.mean(row, axis=reduced_d1, keepdims=True) + 1e-9))
  return jnp.expand_dims(row_factor, d0) * jnp.expand_dims(safe_rsqrt(col), d1)


def _factored_shapes(shape: Tuple[int, ...]) -> Tuple[Tuple[int, ...], ...]:
  """Shapes (without the decay axis) of a leaf's ``v_row``, ``v_col`` and ``v_diag``; ``(0,)`` where unused."""
  dims = factored_dims(shape)
  if dims is None:
    return (0,), (0,), tuple(shape)
  d1, d0 = dims
  return tuple(np.delete(shape, d0).tolist()), tuple(np.delete(shape, d1).tolist()), (0,)


def _shared_features(lopt: HyperV2, fraction: jax.Array, loss_feats: jax.Array) -> jax.Array:
  """The LSTM inputs every tensor shares: the 9 training-fraction embeddings and the 9 loss features."""
  return jnp.concatenate([jnp.tanh((fraction - jnp.asarray(TIME_FRACTIONS, jnp.float32)) * 10), loss_feats])


def _tensor_features(lopt: HyperV2, p, m, rms, shared) -> jax.Array:
  """The LSTM's inputs for one tensor (from the accumulators before this step's update)."""
  scale = jax.lax.rsqrt(jnp.maximum(1e-9, jnp.mean(p ** 2)))
  m, rms = m * scale, rms * scale
  axes = tuple(range(p.ndim))
  mean_m = jnp.mean(m, axis=axes, keepdims=True)
  var_m = jnp.mean(jnp.square(m - mean_m), axis=axes)
  mean_rms = jnp.mean(rms, axis=axes).reshape(-1)
  spread_rms = jnp.mean(jnp.square(rms - mean_m), axis=axes)
  stats = _clip_log_abs(jnp.concatenate([mean_rms, var_m, spread_rms]))
  r = mean_rms.shape[0]
  rank = np.eye(5, dtype=np.float32)[int(np.sum(np.asarray(p.shape) > 1))]  # one-hot of the axes longer than 1
  parts = [shared.astype(stats.dtype), stats[:r], rank, stats[r:]]
  if lopt.with_validation_feature_dim:
    parts.append(jnp.full((1,), float(lopt.validation_mode), jnp.float32))
  return jnp.concatenate(parts)


def _leaf_inputs(p, g, m, rms, precondition, row, col, diag) -> jax.Array:
  """``[*shape, 30]``: the per-element inputs of one tensor (rank >= 1), unnormalized."""
  rsqrt = jax.lax.rsqrt(rms + 1e-6)
  gx = g[..., None]
  parts = [gx, jnp.clip(gx, -0.1, 0.1), p[..., None], m, rms, m * rsqrt, rsqrt, gx * precondition, gx * rsqrt]
  dims = factored_dims(g.shape)
  if dims is None:
    parts += [diag, diag, jax.lax.rsqrt(diag + 1e-8), jax.lax.rsqrt(diag + 1e-8), m * diag ** -0.5]
  else:
    d1, d0 = dims
    full = g.shape + (row.shape[-1],)
    row_feat = jnp.broadcast_to(jnp.expand_dims(row, d0), full)
    col_feat = jnp.broadcast_to(jnp.expand_dims(col, d1), full)
    parts += [row_feat, col_feat, jax.lax.rsqrt(row_feat + 1e-8), jax.lax.rsqrt(col_feat + 1e-8), m * precondition]
  return jnp.concatenate(parts, axis=-1)
