"""Building blocks shared by the learned optimizers of this package (private).

Numerics: every square root, reciprocal square root, logarithm and division here is differentiable at exact-zero
inputs (exact-zero gradient entries are common: dead ReLUs, constant input pixels), so meta-gradients through an
unroll stay finite:

  * `safe_sqrt` uses the double-``where`` pattern (value and derivative 0 at 0);
  * `rsqrt_eps`, `log_rms` and `log_mean_abs` add a positive floor inside the root or log;
  * `safe_div` divides by a denominator replaced by 1 where it is 0 (and returns 0 there).

Dtypes: optimizers compute in `compute_dtype` (float32, or float64 for float64 inputs) and cast the new params back
to their stored dtype; accumulators are allocated in the compute dtype at init, so the state's dtypes never change.

Networks: `init_mlp` / `mlp_columns` are a ReLU MLP evaluated feature-major (``w.T @ x`` on ``[features, n]``, one
matmul per layer over a whole leaf; element-major for low-rank-perturbed weights, see `mlp_columns`); `init_lstm` / `lstm_step` are a plain LSTM cell (gates i, f, g, o; forget bias
1) run on a ``[num_tensors, features]`` batch.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metafam._checks import check_number
from metafam.optimizers import low_rank


def compute_dtype(x: Any) -> jnp.dtype:
  """float32 for float32 and narrower floats (bf16, f16), float64 for float64."""
  return jnp.promote_types(jnp.result_type(x), jnp.float32)


def zeros_like_in(x: Any, leading: Tuple[int, ...] = (), dtype: Any = None) -> jax.Array:
  """Zeros of shape ``leading + x.shape`` in ``dtype`` (default: the compute dtype of ``x``)."""
  return jnp.zeros(tuple(leading) + jnp.shape(x), compute_dtype(x) if dtype is None else dtype)


def safe_sqrt(x: jax.Array) -> jax.Array:
  """``sqrt(x)`` for ``x >= 0`` whose value and derivative are 0 at ``x == 0`` (instead of an infinite slope)."""
  positive = x > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
  """``num / den`` where ``den != 0``, else 0; differentiable everywhere."""
  nonzero = den != 0
  return jnp.where(nonzero, num / jnp.where(nonzero, den, 1.0), 0.0)


def rsqrt_eps(x: jax.Array, eps: float) -> jax.Array:
  """``1 / sqrt(x + eps)`` for ``x >= 0``; its slope is bounded by ``0.5 * eps ** -1.5`` (finite at 0)."""
  return jax.lax.rsqrt(x + eps)


def log_rms(x: jax.Array, floor: float = 1e-8) -> jax.Array:
  """``0.5 * log(mean(x^2) + floor^2)``: the log root-mean-square of ``x``, at least ``log(floor)``."""
  return 0.5 * jnp.log(jnp.mean(jnp.square(x)) + floor ** 2)


def log_mean_abs(x: jax.Array, floor: float = 1e-8) -> jax.Array:
  """``log(mean(|x|) + floor)``."""
  return jnp.log(jnp.mean(jnp.abs(x)) + floor)


def cosine(a: jax.Array, b: jax.Array, floor: float = 1e-8) -> jax.Array:
  """``mean(a * b) / (rms(a) rms(b))`` with each rms at least ``floor``: in [-1, 1], 0 when either is 0."""
  ra = jnp.sqrt(jnp.mean(jnp.square(a)) + floor ** 2)
  rb = jnp.sqrt(jnp.mean(jnp.square(b)) + floor ** 2)
  return jnp.mean(a * b) / (ra * rb)


def shape_features(shape: Sequence[int]) -> np.ndarray:
  """Static per-tensor features: +-1 flags (scalar, vector, rank >= 2) and ``0.1 * log(size)``."""
  rank, size = len(shape), int(np.prod(shape, dtype=np.int64))
  flags = [1.0 if rank == 0 else -1.0, 1.0 if rank == 1 else -1.0, 1.0 if rank >= 2 else -1.0]
  return np.asarray(flags + [0.1 * np.log(max(size, 1))], np.float32)


NUM_SHAPE_FEATURES = 4


def decay_shape(x: jax.Array, rank: int) -> jax.Array:
  """``x: [K]`` reshaped to ``[K, 1, ..., 1]`` to broadcast against ``[K, *shape]`` with ``len(shape) == rank``."""
  return jnp.reshape(x, (-1,) + (1,) * rank)


def logit(x: float) -> float:
  """``log(x / (1 - x))`` in float64."""
  return float(np.log(x) - np.log1p(-x))


def check_positive_float(name: str, value: float, allow_zero: bool = False) -> float:
  """``float(value)`` if it is a finite number ``> 0`` (``>= 0`` with ``allow_zero``), by
  `metafam._checks.check_number`."""
  return float(check_number(name, value, low=0.0, low_open=not allow_zero))


def check_unit_interval(name: str, value: float) -> float:
  """``float(value)`` if it lies in the open interval (0, 1): `metafam._checks.check_number`."""
  return float(check_number(name, value, low=0.0, high=1.0, low_open=True, high_open=True))


def check_decays(name: str, decays: Sequence[float]) -> Tuple[float, ...]:
  """``decays`` as a non-empty tuple of floats in (0, 1), or ValueError naming ``name``."""
  decays = tuple(decays)
  if not decays:
    raise ValueError(f"{name} must be a non-empty sequence of values in (0, 1), got {decays!r}.")
  return tuple(check_unit_interval(f"{name}[{i}]", d) for i, d in enumerate(decays))


def check_time_scales(time_scales: Sequence[float]) -> Tuple[float, ...]:
  """``time_scales`` as a tuple of positive floats (possibly empty: no step features)."""
  return tuple(check_positive_float(f"time_scales[{i}]", t) for i, t in enumerate(time_scales))


def check_sizes(name: str, sizes: Sequence[int], minimum: int = 1) -> Tuple[int, ...]:
  """``sizes`` as a non-empty tuple of ints >= ``minimum``, or ValueError naming ``name``."""
  sizes = tuple(sizes)
  ok = bool(sizes) and all(isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_)) and s >= minimum
                           for s in sizes)
  if not ok:
    raise ValueError(f"{name} must be a non-empty sequence of ints >= {minimum}, got {sizes!r}.")
  return tuple(int(s) for s in sizes)


def check_size(name: str, size: int, minimum: int = 1) -> int:
  """``int(size)`` if it is an int >= ``minimum`` (`metafam._checks.check_number`)."""
  return int(check_number(name, size, low=minimum, integer=True))


def map_leaves(fn, params: Any, *trees: Any, num_outputs: int) -> Tuple[Any, ...]:
  """Applies ``fn(param_leaf, *leaves_or_subtrees)`` leaf by leaf; returns ``num_outputs`` trees shaped like params.

  Each of ``trees`` is flattened up to the params' structure, so its "leaves" may be whole subtrees (e.g. a dict of
  accumulators per parameter).
  """
  p_leaves, treedef = jax.tree.flatten(params)
  args = [treedef.flatten_up_to(t) for t in trees]
  outs = [fn(p, *xs) for p, *xs in zip(p_leaves, *args)]
  return tuple(treedef.unflatten([o[i] for o in outs]) for i in range(num_outputs))


# -- MLP -------------------------------------------------------------------------------------------------------
class PerElementMLP:
  """The sizes of a per-element MLP learned optimizer, from what the class defines: ``num_leaf_features`` (its
  per-element inputs), ``time_scales`` (one training-progress feature each) and ``hidden_sizes``."""

  @property
  def num_features(self) -> int:
    """Every input of the MLP: the per-element features, then one per time scale."""
    return self.num_leaf_features + len(self.time_scales)

  @property
  def num_layers(self) -> int:
    return len(self.hidden_sizes) + 1


def init_mlp(key: jax.Array, sizes: Sequence[int], out_scale: float, pathway: Optional[int] = None) -> dict:
  """ReLU MLP weights ``{"w{i}": f32[fan_in, fan_out], "b{i}": f32[fan_out]}`` for layer sizes ``sizes``.

  Hidden weights are ``N(0, 2 / fan_in)``, output weights ``N(0, out_scale^2 / fan_in)`` (``out_scale = 0`` gives a
  zero output layer), biases 0. With ``pathway = j`` two units per hidden layer carry ``relu(x_j)`` and
  ``relu(-x_j)`` of input feature ``j`` unchanged to output 0, which reads ``relu(x_j) - relu(-x_j) = x_j``; no other
  output reads them. Needs hidden widths >= 2.
  """
  shapes = list(zip(sizes[:-1], sizes[1:]))
  z = jax.random.normal(key, (sum(a * b for a, b in shapes),), jnp.float32)  # one draw, one kernel to compile
  theta, offset, last = {}, 0, len(shapes) - 1
  for i, (fan_in, fan_out) in enumerate(shapes):
    w = z[offset:offset + fan_in * fan_out].reshape(fan_in, fan_out)
    w = w * np.float32((out_scale if i == last else np.sqrt(2.0)) / np.sqrt(fan_in))
    offset += fan_in * fan_out
    if pathway is not None:
      mask, value = np.zeros((fan_in, fan_out), bool), np.zeros((fan_in, fan_out), np.float32)
      if i == 0 and i != last:
        mask[:, :2] = True
        value[pathway, :2] = (1.0, -1.0)
      elif i != last:
        mask[:, :2] = True
        value[0, 0] = value[1, 1] = 1.0
      else:
        mask[:2, :] = True
        value[:2, 0] = (1.0, -1.0)
      w = jnp.where(mask, value, w)
    theta[f"w{i}"], theta[f"b{i}"] = w, jnp.zeros((fan_out,), jnp.float32)
  return theta


def mlp_columns(theta: dict, x: jax.Array, bias0: jax.Array, num_layers: int) -> jax.Array:
  """The MLP on the columns of ``x: [F, n]`` -> ``[out, n]``.

  Layer 0 uses only the first ``F`` rows of ``w0``; the remaining inputs (the same for every column, e.g. step or
  context features) are folded into ``bias0`` (`mlp_bias0`).

  The weights may be `low_rank.Perturbed` (weights shared by the lanes of a `vmap` plus one lane's low-rank
  perturbation): each layer is then the shared product plus a rank-r one, computed element-major (``h: [n, width]``,
  ``h @ w``), the layout in which a product of every lane's ``h`` with the shared ``w`` is one matrix product with no
  transposes (feature-major, XLA would transpose each ``[lanes, width, n]`` hidden tensor around it). Plain weights
  keep the feature-major layout, the faster one for per-lane weights (a product batched over lanes).
  """
  w0 = low_rank.rows(theta["w0"], None, x.shape[0])
  if not any(isinstance(theta[f"w{i}"], low_rank.Perturbed) for i in range(num_layers)):
    h = w0.T @ x + bias0[:, None]
    for i in range(1, num_layers):
      h = theta[f"w{i}"].T @ jax.nn.relu(h) + theta[f"b{i}"][:, None]
    return h
  h = low_rank.matmul(x.T, w0) + bias0
  for i in range(1, num_layers):
    h = low_rank.matmul(jax.nn.relu(h), theta[f"w{i}"]) + theta[f"b{i}"]
  return h.T


def mlp_bias0(theta: dict, rest: jax.Array, start: int) -> jax.Array:
  """``b0 + rest @ w0[start:]``: layer 0's bias with the inputs shared by every column (``rest``) folded in."""
  return theta["b0"] + low_rank.matmul(rest, low_rank.rows(theta["w0"], start, None))


# -- LSTM ------------------------------------------------------------------------------------------------------
def init_lstm(key: jax.Array, num_inputs: int, hidden: int) -> dict:
  """``{"w": f32[num_inputs + hidden, 4 * hidden], "b": f32[4 * hidden]}``; w ~ N(0, 1 / fan_in), forget bias 1."""
  w = jax.random.normal(key, (num_inputs + hidden, 4 * hidden), jnp.float32) * np.float32(
      1.0 / np.sqrt(num_inputs + hidden))
  b = np.zeros((4 * hidden,), np.float32)
  b[hidden:2 * hidden] = 1.0
  return {"w": w, "b": jnp.asarray(b)}


def lstm_step(params: dict, x: jax.Array, h: jax.Array, c: jax.Array,
              haiku_layout: bool = False) -> Tuple[jax.Array, jax.Array]:
  """One LSTM step on a batch: ``x: [B, num_inputs]``, ``h, c: [B, hidden]`` -> new ``(h, c)``.

  Gate columns are ``(i, f, g, o)`` with the forget bias inside ``params["b"]``; with ``haiku_layout`` they are
  haiku's ``hk.LSTM`` order ``(i, g, f, o)`` and 1 is added to the forget gate's pre-activation (haiku's constant
  forget bias), so weights trained with ``hk.LSTM`` run unchanged.
  """
  z = jnp.concatenate([x, h], axis=-1) @ params["w"] + params["b"]
  if haiku_layout:
    i, g, f, o = jnp.split(z, 4, axis=-1)
    f = f + 1.0
  else:
    i, f, g, o = jnp.split(z, 4, axis=-1)
  c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
  return jax.nn.sigmoid(o) * jnp.tanh(c), c


def init_lstm_extras(theta: Any, params: Any, hidden: int) -> dict:
  """A per-tensor LSTM's zero state ``{"h", "c": [num tensors, hidden]}``, in the widest dtype of float32, the
  params' compute dtypes and theta's (the `init_extras` of the learned optimizers that run one LSTM over tensors)."""
  leaves = jax.tree.leaves(params)
  dt = jnp.result_type(jnp.float32, *[compute_dtype(x) for x in leaves + jax.tree.leaves(theta)])
  state = jnp.zeros((len(leaves), hidden), dt)
  return {"h": state, "c": state}


def num_lstm_params(num_inputs: int, hidden: int) -> int:
  return (num_inputs + hidden) * 4 * hidden + 4 * hidden


def num_mlp_params(sizes: Sequence[int]) -> int:
  return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
