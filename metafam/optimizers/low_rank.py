"""Low-rank matrices and low-rank-perturbed weights, the representation behind low-rank ES perturbations.

A `LowRank` ``(a, b)`` stands for the matrix ``a @ b.T`` (``a: [..., m, r]``, ``b: [..., n, r]``, any leading axes,
e.g. one per antithetic pair) without forming it. A `Perturbed` ``(w, delta)`` is the weight ``w + delta`` of one
lane: the shared ``w [m, n]`` and that lane's ``delta`` (a `LowRank`). Through `matmul` a product with a perturbed
weight costs the shared product plus two rank-``r`` ones:

    x @ (w + a b^T) = x @ w + (x @ a) @ b^T,

so under `jax.vmap` over lanes with ``w`` not batched (`lane_axes`), ``x @ w`` is one large product for every lane
instead of one small product per lane with its own weights.

A theta whose 2-D leaves are `Perturbed` reaches only learned optimizers that declare
``LearnedOptimizer.low_rank_weights = True`` (they read their matrices through `matmul` and `rows`);
`TruncatedStep` hands every other learned optimizer `dense` weights.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp


@functools.partial(jax.tree_util.register_dataclass, data_fields=["a", "b"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class LowRank:
  """The matrix ``a @ b.T`` (``a: [..., m, r]``, ``b: [..., n, r]``; leading axes are batch axes)."""
  a: jax.Array
  b: jax.Array

  def dense(self) -> jax.Array:
    """``[..., m, n]``: the matrix itself."""
    return jnp.einsum("...mr,...nr->...mn", self.a, self.b)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["w", "delta"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class Perturbed:
  """The weight ``w + delta.a @ delta.b.T`` of one lane (``w: [m, n]`` shared by the lanes, ``delta`` a `LowRank`)."""
  w: jax.Array
  delta: LowRank


def _is_node(x: Any) -> bool:
  return isinstance(x, (LowRank, Perturbed))


def dense(w: Any) -> jax.Array:
  """A weight as a plain array (`Perturbed`: ``w + a @ b.T``; `LowRank`: ``a @ b.T``; an array: itself)."""
  if isinstance(w, Perturbed):
    return w.w + w.delta.dense().astype(w.w.dtype)
  if isinstance(w, LowRank):
    return w.dense()
  return w


def dense_tree(tree: Any) -> Any:
  """``tree`` with every `Perturbed` / `LowRank` node replaced by its `dense` matrix."""
  return jax.tree.map(dense, tree, is_leaf=_is_node)


def matmul(x: jax.Array, w: Any) -> jax.Array:
  """``x @ w`` for ``x: [..., m]`` and a weight ``w: [m, n]`` (array or `Perturbed`)."""
  if not isinstance(w, Perturbed):
    return x @ w
  return x @ w.w + (x @ w.delta.a) @ w.delta.b.T


def rows(w: Any, start: Optional[int], stop: Optional[int]) -> Any:
  """``w[start:stop]`` (rows of a weight; a `Perturbed` weight stays one)."""
  if not isinstance(w, Perturbed):
    return w[start:stop]
  return Perturbed(w.w[start:stop], LowRank(w.delta.a[start:stop], w.delta.b))


def lane_axes(theta: Any) -> Any:
  """The `jax.vmap` ``in_axes`` of a per-lane theta: 0 for every leaf except the shared ``w`` of `Perturbed` weights
  (None), so their products with the lanes' inputs are batched over the inputs only."""
  return jax.tree.map(lambda x: Perturbed(None, LowRank(0, 0)) if isinstance(x, Perturbed) else 0, theta,
                      is_leaf=_is_node)


def map_lane_leaves(fn, theta: Any) -> Any:
  """``fn`` applied to the per-lane leaves of a per-lane theta (not to the shared ``w`` of `Perturbed` weights)."""
  def one(x):
    if isinstance(x, Perturbed):
      return Perturbed(x.w, jax.tree.map(fn, x.delta))
    return fn(x)
  return jax.tree.map(one, theta, is_leaf=_is_node)
