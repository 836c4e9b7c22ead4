"""`learned_optimization.training`: `vec_get_batch` / `get_batches`, host-side batch stacking as LO code calls it.

``vec_get_batch(task_family, n_tasks, split, numpy=False)`` takes ``n_tasks`` batches from the family's (or task's)
``datasets.<split>`` iterator and stacks them on a new leading axis (``()`` for data-free families);
``get_batches(task_family, batch_shape, split)`` does that for leading shapes of one to three axes;
``save_state`` / ``load_state`` are `checkpoints`' (metafam's ``.npz``). metafam's own
hot loops sample batches on the device instead (`metafam.datasets.DeviceData`); these are for code that feeds
batches itself.
"""

from __future__ import annotations

from typing import Any, Sequence

from metafam.compat.learned_optimization import tree_utils

__all__ = ["vec_get_batch", "get_batches", "save_state", "load_state"]


def save_state(path: str, state: Any) -> None:
  """`checkpoints.save_state`: ``state`` to ``path`` in metafam's ``.npz`` format (atomic; no pickle)."""
  from metafam.compat.learned_optimization import checkpoints  # pylint: disable=g-import-not-at-top
  checkpoints.save_state(path, state)


def load_state(path: str, state: Any) -> Any:
  """`checkpoints.load_state`: the values saved at ``path``, in the structure of ``state``."""
  from metafam.compat.learned_optimization import checkpoints  # pylint: disable=g-import-not-at-top
  return checkpoints.load_state(path, state)


def vec_get_batch(task_family: Any, n_tasks: int, split: str, numpy: bool = False) -> Any:
  if task_family.datasets is None:
    return ()
  iterator = task_family.datasets.split(split)
  batches = [next(iterator) for _ in range(n_tasks)]
  return tree_utils.tree_zip_onp(batches) if numpy else tree_utils.tree_zip_jnp(batches)


def get_batches(task_family: Any, batch_shape: Sequence[int], split: str, numpy: bool = False) -> Any:
  batch_shape = list(batch_shape)
  if not 1 <= len(batch_shape) <= 3:
    raise NotImplementedError(f"get_batches: batch_shape of 1 to 3 axes, got {batch_shape}.")
  if len(batch_shape) == 1:
    return vec_get_batch(task_family, batch_shape[0], split, numpy=numpy)
  if task_family.datasets is None:
    return ()
  parts = [get_batches(task_family, batch_shape[1:], split, numpy=numpy) for _ in range(batch_shape[0])]
  return tree_utils.tree_zip_onp(parts) if numpy else tree_utils.tree_zip_jnp(parts)
