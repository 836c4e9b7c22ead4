"""`learned_optimization.tasks.datasets.base`: metafam's `Datasets` and `dataset_lru_cache`.

metafam's `Datasets` takes the same four split iterators, ``extra_info`` and ``abstract_batch``. Differences: the
cache of `dataset_lru_cache` is bounded (least recently used out), and vectorized training needs splits that are
`ArraySplit`s (seeded, sampled on the device). There are no TFDS-backed builders.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

from metafam.datasets.base import ArraySplit, Datasets, dataset_lru_cache

Batch = Any

__all__ = ["Batch", "Datasets", "dataset_lru_cache", "ArraySplit", "ThreadSafeIterator"]


class ThreadSafeIterator:
  """Wraps an iterator so that several threads may call ``next`` on it (one at a time)."""

  def __init__(self, iterator: Iterator[Any]):
    self._iterator = iterator
    self._lock = threading.Lock()

  def __iter__(self) -> "ThreadSafeIterator":
    return self

  def __next__(self) -> Any:
    with self._lock:
      return next(self._iterator)
