"""Ensembles as pytrees with a leading member axis: build, index, stack, unstack and apply.

An ensemble of M models is one pytree whose every leaf has a leading axis of length M (member/lane ``i`` is
``leaf[i]``), so it trains and evaluates in one vmapped program. The helpers work on any pytree (params, optimizer
states, model states, configs) and on both numpy and JAX leaves.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def _check_count(name: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be a positive int, got {value!r}.")
  return int(value)


def ensemble_size(tree: Any) -> int:
  """The common length of the leading axis of every leaf of ``tree``; ValueError naming a leaf that disagrees."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  if not leaves:
    raise ValueError("ensemble_size needs a pytree with at least one array leaf.")
  sizes = {}
  for path, leaf in leaves:
    if np.ndim(leaf) < 1:
      raise ValueError(f"leaf {jax.tree_util.keystr(path) or '<root>'} is a scalar; ensemble leaves need a leading "
                       "member axis.")
    sizes.setdefault(np.shape(leaf)[0], jax.tree_util.keystr(path))
  if len(sizes) > 1:
    detail = ", ".join(f"{leaf or '<root>'} has {n}" for n, leaf in sizes.items())
    raise ValueError(f"leaves disagree on the leading (member) axis: {detail}.")
  return next(iter(sizes))


def ensemble_init(init_fn: Callable[[jax.Array], Any], key: jax.Array, n: int) -> Any:
  """N replicas of ``init_fn(key)`` (any pytree output) built by vmapping it over ``jax.random.split(key, n)``.

  Replica ``i`` equals ``init_fn(jax.random.split(key, n)[i])``; every output leaf gets a leading axis of length n.
  """
  n = _check_count("n", n)
  return jax.vmap(init_fn)(jax.random.split(key, n))


def tree_take(tree: Any, i: Any) -> Any:
  """Member/lane ``i`` of a pytree whose leaves share a leading axis: ``leaf[i]`` for every leaf.

  ``i`` is a Python int (negative counts from the end; out of range raises IndexError, where plain JAX indexing
  would clamp silently) or an integer array (traced indices and index vectors gather as `jnp.take` does).
  """
  if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
    n = ensemble_size(tree)
    if not -n <= i < n:
      raise IndexError(f"member index {i} is out of range for an ensemble of {n}.")
    i = operator.index(i) % n
  return jax.tree.map(lambda x: x[i], tree)


def tree_stack(trees: Sequence[Any]) -> Any:
  """Stacks same-structured pytrees along a new leading axis (the inverse of `tree_unstack`).

  Leaves stay numpy when all inputs are numpy, else become JAX arrays.
  """
  trees = list(trees)
  if not trees:
    raise ValueError("tree_stack needs at least one tree.")
  first = jax.tree.structure(trees[0])
  for k, tree in enumerate(trees[1:], start=1):
    if jax.tree.structure(tree) != first:
      raise ValueError(f"tree {k} has structure {jax.tree.structure(tree)}, but tree 0 has {first}.")

  def stack(*xs):
    return np.stack(xs) if all(isinstance(x, np.ndarray) for x in xs) else jnp.stack(xs)

  return jax.tree.map(stack, *trees)


def tree_unstack(tree: Any) -> List[Any]:
  """The list of members ``[tree_take(tree, 0), ..., tree_take(tree, n - 1)]``."""
  return [tree_take(tree, i) for i in range(ensemble_size(tree))]


def ensemble_apply(fn: Callable[..., Any], members: Any, *args: Any) -> Any:
  """``fn(member_i, *args)`` for every member in one vmapped call; ``args`` are shared (not split) across members.

  Outputs get a leading member axis, e.g. per-member predictions ``f32[M, B, C]`` for a shared batch.
  """
  return jax.vmap(fn, in_axes=(0,) + (None,) * len(args))(members, *args)
