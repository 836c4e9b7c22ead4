"""`learned_optimization.tree_utils`: the pytree helpers LO code commonly imports, over `jax.tree`.

Arithmetic (`tree_add`, `tree_sub`, `tree_mul`, `tree_div` take a tree or a scalar second argument), reductions
(`tree_dot`, `tree_norm` (global L2), `tree_mean`, `tree_mean_abs`: means over all elements), stacking
(`tree_zip_jnp` / `tree_zip_onp`: a list of like trees -> one tree with a new leading axis), `first_dim`,
`match_type`, `map_named` (``fn(path, leaf)`` with "/"-joined key paths), `strip_weak_type`, and `partition` /
`partition_unflatten` (split the leaves by predicates ``fn(name, leaf)`` and put them back).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["tree_add", "tree_sub", "tree_mul", "tree_div", "tree_dot", "tree_norm", "tree_mean", "tree_mean_abs",
           "tree_zip_jnp", "tree_zip_onp", "first_dim", "match_type", "map_named", "strip_weak_type",
           "PartitionUnflatten", "partition", "partition_unflatten", "FilterFN"]


def _is_scalar(x: Any) -> bool:
  return not isinstance(x, (dict, list, tuple)) and np.ndim(x) == 0 and not dataclasses.is_dataclass(x)


def _binary(op: Callable, treea: Any, scalar_or_treeb: Any) -> Any:
  if _is_scalar(scalar_or_treeb):
    return jax.tree.map(lambda a: op(a, scalar_or_treeb), treea)
  return jax.tree.map(op, treea, scalar_or_treeb)


def tree_add(treea: Any, treeb: Any) -> Any:
  return _binary(jnp.add, treea, treeb)


def tree_sub(treea: Any, scalar_or_treeb: Any) -> Any:
  return _binary(jnp.subtract, treea, scalar_or_treeb)


def tree_mul(treea: Any, scalar_or_treeb: Any) -> Any:
  return _binary(jnp.multiply, treea, scalar_or_treeb)


def tree_div(treea: Any, scalar_or_treeb: Any) -> Any:
  return _binary(jnp.divide, treea, scalar_or_treeb)


def tree_dot(treea: Any, treeb: Any) -> jax.Array:
  return sum(jnp.sum(a * b) for a, b in zip(jax.tree.leaves(treea), jax.tree.leaves(treeb)))


def tree_norm(val: Any) -> jax.Array:
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(val)))


def _mean_of(tree: Any, fn: Callable) -> jax.Array:
  leaves = jax.tree.leaves(tree)
  return sum(jnp.sum(fn(x)) for x in leaves) / sum(jnp.size(x) for x in leaves)


def tree_mean(val: Any) -> jax.Array:
  return _mean_of(val, lambda x: x)


def tree_mean_abs(val: Any) -> jax.Array:
  return _mean_of(val, jnp.abs)


def tree_zip_jnp(xs: Sequence[Any]) -> Any:
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *xs)


def tree_zip_onp(xs: Sequence[Any]) -> Any:
  return jax.tree.map(lambda *leaves: np.stack(leaves), *xs)


def first_dim(a: Any) -> int:
  return jax.tree.leaves(a)[0].shape[0]


def match_type(struct1: Any, struct2: Any) -> Any:
  """``struct1`` with every leaf cast to the dtype of the matching leaf of ``struct2``."""
  return jax.tree.map(lambda x, y: jnp.asarray(x, jnp.asarray(y).dtype), struct1, struct2)


def _path_name(path) -> str:
  parts = []
  for entry in path:
    for attr in ("key", "name", "idx"):
      if hasattr(entry, attr):
        parts.append(str(getattr(entry, attr)))
        break
  return "/".join(parts)


def map_named(function: Callable[[str, Any], Any], val: Any, key: str = "") -> Any:
  """``function(name, leaf)`` on every leaf; ``name`` is the "/"-joined key path (prefixed by ``key``)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: function("/".join(p for p in (key, _path_name(path)) if p), x), val)


def strip_weak_type(pytree: Any) -> Any:
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.asarray(x).dtype) + jnp.zeros((), jnp.asarray(x).dtype), pytree)


FilterFN = Callable[[str, Any], bool]


@dataclasses.dataclass(frozen=True)
class PartitionUnflatten:
  """Puts partitioned leaves back into the original tree (`partition_unflatten`)."""
  data: Any

  def __call__(self, partitioned_values):
    return partition_unflatten(self, partitioned_values)


def partition(functions: Sequence[Callable[[str, Any], bool]], values: Any, strict: bool = False):
  """``(partitions, unflattener)``: each leaf goes to the first ``functions[i](name, leaf)`` that is true
  (``name``: the leaf's index as a string); with ``strict=False`` an extra last partition takes the rest, with
  ``strict=True`` a leaf no function takes raises ValueError."""
  leaves, treedef = jax.tree.flatten(values)
  functions = list(functions) + ([] if strict else [lambda name, leaf: True])
  partitions = [[] for _ in functions]
  owners = []
  for index, leaf in enumerate(leaves):
    name = str(index)
    slot = next((i for i, fn in enumerate(functions) if fn(name, leaf)), None)
    if slot is None:
      raise ValueError(f"partition: no function takes leaf {name}.")
    partitions[slot].append(leaf)
    owners.append(slot)
  return partitions, PartitionUnflatten((tuple(owners), treedef))


def partition_unflatten(unflattener: PartitionUnflatten, part_values: Sequence[Sequence[Any]]) -> Any:
  owners, treedef = unflattener.data
  iterators = [iter(part) for part in part_values]
  return jax.tree.unflatten(treedef, [next(iterators[slot]) for slot in owners])
