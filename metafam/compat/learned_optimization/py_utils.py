"""`learned_optimization.py_utils`: ``threaded_tqdm_map``, a thread-pool map that keeps the input order."""

from __future__ import annotations

from concurrent import futures
from typing import Any, Callable, Sequence

__all__ = ["threaded_tqdm_map"]


def threaded_tqdm_map(threads: int, func: Callable[[Any], Any], data: Sequence[Any]) -> Sequence[Any]:
  """``[func(x) for x in data]`` computed on ``threads`` threads (results in input order; a progress bar when
  tqdm is installed). An exception in ``func`` propagates."""
  if not isinstance(threads, int) or threads < 1:
    raise ValueError(f"threaded_tqdm_map: threads must be a positive int, got {threads!r}.")
  try:
    from tqdm import tqdm as progress  # pylint: disable=g-import-not-at-top
  except ImportError:
    progress = lambda items, **kwargs: items
  with futures.ThreadPoolExecutor(threads) as executor:
    pending = [executor.submit(func, x) for x in data]
    return [f.result() for f in progress(pending, total=len(pending))]
