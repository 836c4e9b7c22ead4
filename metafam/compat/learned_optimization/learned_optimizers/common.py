"""`learned_optimization.learned_optimizers.common`: the gradient accumulators LO's learned optimizers are built from.

Each ``rolling_*(decay)`` / ``factored_rolling(decay_rate)`` returns an ``(init, update)`` pair of pure functions:

* ``rolling_mom(b)``: ``MomAccumulator(m, t)`` with ``m <- b m + (1 - b) g`` (``m_0 = 0``) and ``t`` counting updates.
* ``rolling_rms(b)``: ``RMSAccumulator(rms, t)`` with ``rms <- c rms + (1 - c) g^2``, ``c = clip(b, 0, 1)``.
* ``factored_rolling(b, epsilon)``: Adafactor's statistics. For a tensor of rank >= 2 the two largest dimensions
  ``(d1, d0) = factored_dims(shape)`` are factored: ``v_row <- c v_row + (1 - c) mean(g^2 + eps, axis=d0)`` and
  ``v_col <- c v_col + (1 - c) mean(g^2 + eps, axis=d1)``; the update also returns the preconditioned gradient
  ``g * rsqrt(v_row / mean(v_row over d1)) * rsqrt(v_col)`` (each broadcast back). Other tensors keep a full
  ``v_diag <- c v_diag + (1 - c) (g^2 + eps)`` and return ``g * rsqrt(v_diag + 1e-9)``. Unused slots are empty
  float32 arrays, so every leaf has the three fields; ``update`` returns ``(state, preconditioned)``.
* ``vec_rolling_mom(decays)``, ``vec_rolling_rms(decays)``, ``vec_factored_rolling(decays)``: the same for a vector
  of ``K`` decays at once, the decay axis last on every accumulator leaf (``jax.vmap`` with ``out_axes=-1``).

``safe_rsqrt(x) = rsqrt(max(x, 1e-9))``.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Tuple

import jax
import jax.numpy as jnp
import numpy as onp

from metafam.optimizers.hyper_v2 import factored_dims, safe_rsqrt  # the one definition of each

__all__ = ["MomAccumulator", "RMSAccumulator", "rolling_mom", "rolling_rms", "vec_rolling_mom", "vec_rolling_rms",
           "safe_rsqrt", "FactoredAccum", "factored_dims", "factored_rolling", "vec_factored_rolling"]

MomAccumulator = collections.namedtuple("MomAccumulator", ["m", "t"])
RMSAccumulator = collections.namedtuple("RMSAccumulator", ["rms", "t"])
_InitUpdate = collections.namedtuple("_InitUpdate", ["init", "update"])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FactoredAccum:
  """Adafactor statistics per leaf: ``v_col``, ``v_row`` (factored leaves) and ``v_diag`` (the others)."""
  v_col: Any
  v_row: Any
  v_diag: Any

  def replace(self, **changes) -> "FactoredAccum":
    return dataclasses.replace(self, **changes)


def _zeros_tree(p: Any) -> Any:
  return jax.tree.map(jnp.zeros_like, p)


def rolling_mom(decay: float) -> _InitUpdate:
  """Exponential moving average of the gradients (see the module docstring)."""

  def init(p: Any) -> MomAccumulator:
    return MomAccumulator(m=_zeros_tree(p), t=jnp.asarray(0, jnp.int32))

  def update(state: MomAccumulator, grad: Any) -> MomAccumulator:
    m = jax.tree.map(lambda m_, g: decay * m_ + (1 - decay) * g, state.m, grad)
    return MomAccumulator(m=m, t=state.t + 1)

  return _InitUpdate(init, update)


def rolling_rms(decay: float) -> _InitUpdate:
  """Exponential moving average of the squared gradients, with the decay clipped to [0, 1]."""

  def init(p: Any) -> RMSAccumulator:
    return RMSAccumulator(rms=_zeros_tree(p), t=jnp.asarray(0, jnp.int32))

  def update(state: RMSAccumulator, grad: Any) -> RMSAccumulator:
    c = jnp.clip(decay, 0.0, 1.0)
    rms = jax.tree.map(lambda v, g: c * v + (1 - c) * jnp.square(g), state.rms, grad)
    return RMSAccumulator(rms=rms, t=state.t + 1)

  return _InitUpdate(init, update)


def _vmap_accumulator(accumulator: Callable[[Any], _InitUpdate], decays: Any) -> _InitUpdate:
  """``accumulator`` for each of ``decays`` at once; the decay axis is last on every state leaf."""
  decays = jnp.asarray(decays)
  if decays.ndim != 1:
    raise ValueError(f"decays must be a 1-d array of decay rates, got shape {decays.shape}.")

  def init(p):
    return jax.vmap(lambda d: accumulator(d).init(p), out_axes=-1)(decays)

  def update(state, grad):
    return jax.vmap(lambda s, d: accumulator(d).update(s, grad), in_axes=-1, out_axes=-1)(state, decays)

  return _InitUpdate(init, update)


def vec_rolling_mom(decays: Any) -> _InitUpdate:
  """`rolling_mom` for a vector of decays."""
  return _vmap_accumulator(rolling_mom, decays)


def vec_rolling_rms(decays: Any) -> _InitUpdate:
  """`rolling_rms` for a vector of decays."""
  return _vmap_accumulator(rolling_rms, decays)


def factored_rolling(decay_rate: float, epsilon: float = 1e-30) -> _InitUpdate:
  """Adafactor-style factored second moments and the gradient they precondition (see the module docstring)."""
  empty = lambda: jnp.zeros((0,), jnp.float32)

  def init_one(p):
    dims = factored_dims(p.shape)
    if dims is None:
      return empty(), empty(), jnp.zeros(p.shape, jnp.float32)
    d1, d0 = dims
    return (jnp.zeros(onp.delete(p.shape, d1), jnp.float32), jnp.zeros(onp.delete(p.shape, d0), jnp.float32),
            empty())

  def init(params: Any) -> FactoredAccum:
    leaves, treedef = jax.tree.flatten(params)
    cols, rows, diags = zip(*[init_one(p) for p in leaves]) if leaves else ((), (), ())
    unflat = lambda xs: jax.tree.unflatten(treedef, list(xs))
    return FactoredAccum(v_col=unflat(cols), v_row=unflat(rows), v_diag=unflat(diags))

  def update_one(v_col, v_row, v_diag, g):
    c = jnp.clip(decay_rate, 0.0, 1.0)
    g2 = jnp.square(g) + epsilon
    dims = factored_dims(g.shape)
    if dims is None:
      new_diag = c * v_diag + (1 - c) * g2
      return v_col, v_row, new_diag, g * safe_rsqrt(new_diag + 1e-9)
    d1, d0 = dims
    new_row = c * v_row + (1 - c) * jnp.mean(g2, axis=d0)
    new_col = c * v_col + (1 - c) * jnp.mean(g2, axis=d1)
    row_axis = d1 - 1 if d1 > d0 else d1  # d1's position once d0 is reduced away
    row_factor = safe_rsqrt(new_row / (jnp.mean(new_row, axis=row_axis, keepdims=True) + 1e-9))
    col_factor = safe_rsqrt(new_col)
    out = g * jnp.expand_dims(row_factor, d0) * jnp.expand_dims(col_factor, d1)
    return new_col, new_row, v_diag, out

  def update(state: FactoredAccum, grad: Any) -> Tuple[FactoredAccum, Any]:
    g_leaves, treedef = jax.tree.flatten(grad)
    cols, rows, diags = (treedef.flatten_up_to(x) for x in (state.v_col, state.v_row, state.v_diag))
    results = [update_one(*args) for args in zip(cols, rows, diags, g_leaves)]
    unflat = lambda i: jax.tree.unflatten(treedef, [r[i] for r in results])
    return FactoredAccum(v_col=unflat(0), v_row=unflat(1), v_diag=unflat(2)), unflat(3)

  return _InitUpdate(init, update)


def vec_factored_rolling(decays: Any) -> _InitUpdate:
  """`factored_rolling` for a vector of decays (the preconditioned gradients get the decay axis last too)."""
  return _vmap_accumulator(factored_rolling, decays)
