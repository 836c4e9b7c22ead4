"""`learned_optimization.time_filter.timings`: wall-clock cost of a task family's vectorized inner training.

``time_for_task_family_vmap_unroll_func(task_family, num_tasks, unroll_steps, opt, lopt)`` returns a function that
runs ``unroll_steps`` inner steps of ``num_tasks`` task instances with ``opt`` (default: SGD) or the learned
optimizer ``lopt`` (its ``init(PRNGKey(0))`` theta, shared by the lanes) on metafam's engine -- a
`VectorizedLOptTruncatedStep` whose trajectories never end, unrolled from the same starting state on every call --
and returns the mean loss (a device array). ``time_jax_fn(fn, n)`` times ``n`` calls after a warm-up call
(compilation excluded) and returns ``(mean, standard error)`` in seconds; ``time_for_task_family_vmap_unroll``
divides them by ``num_tasks * unroll_steps`` (seconds per inner step; NaN for an out-of-memory error);
``timing_for_iterator`` times ``next`` of a data iterator; ``task_family_runtime_stats`` collects these for 1 to
32 tasks. ``scan_unroll`` is accepted (metafam compiles the whole unroll as one scan) and ``clear_buffers`` does
not delete live device buffers (that would invalidate the caller's arrays).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as onp

from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.optimizers import optax_opts
from metafam.compat.learned_optimization.outer_trainers import lopt_truncated_step, truncation_schedule

__all__ = ["PRNGKey", "PyTree", "time_jax_fn", "time_for_task_family_vmap_unroll_func",
           "time_for_task_family_vmap_unroll", "timing_for_iterator", "task_family_runtime_stats"]

PRNGKey = jax.Array
PyTree = Any


def _ready(tree: Any) -> None:
  jax.tree.map(lambda x: x.block_until_ready() if hasattr(x, "block_until_ready") else x, tree)


def time_jax_fn(fn: Callable[[], PyTree], time_measurements: int = 10) -> Tuple[float, float]:
  """``(mean, standard error)`` of the seconds one call of ``fn`` takes, over ``time_measurements`` calls after
  a first, untimed call (which compiles)."""
  if not isinstance(time_measurements, int) or time_measurements < 1:
    raise ValueError(f"time_measurements must be a positive int, got {time_measurements!r}.")
  _ready(fn())
  times = []
  for _ in range(time_measurements):
    start = time.perf_counter()
    _ready(fn())
    times.append(time.perf_counter() - start)
  return float(onp.mean(times)), float(onp.std(times) / onp.sqrt(len(times)))


def time_for_task_family_vmap_unroll_func(task_family: Any, num_tasks: int, unroll_steps: int,
                                          opt: Optional[Any] = None, lopt: Optional[Any] = None,
                                          scan_unroll: int = 1) -> Callable[[], jax.Array]:
  """A function running ``unroll_steps`` steps of ``num_tasks`` lanes and returning their mean loss."""
  del scan_unroll
  for name, value in (("num_tasks", num_tasks), ("unroll_steps", unroll_steps)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be a positive int, got {value!r}.")
  if lopt is None:
    lopt = lopt_base.learned_optimizer_from_opt(opt if opt is not None else optax_opts.SGD())
  step = lopt_truncated_step.VectorizedLOptTruncatedStep(
      task_family, lopt, truncation_schedule.NeverEndingTruncationSchedule(), num_tasks)
  key = jax.random.PRNGKey(0)
  theta = lopt.init(key)
  state = step.init_step_state(theta, key)

  def run():
    _, out = step.unroll(theta, state, key, unroll_steps)
    return jnp.mean(out.loss)

  return run


def time_for_task_family_vmap_unroll(task_family: Any, num_tasks: int, unroll_steps: int,
                                     num_time_estimates: int = 10, opt: Optional[Any] = None,
                                     lopt: Optional[Any] = None, scan_unroll: int = 1) -> Tuple[float, float]:
  """``(mean, standard error)`` seconds per inner step (one lane, one step) of the vectorized unroll; NaNs when
  the device runs out of memory."""
  try:
    fn = time_for_task_family_vmap_unroll_func(task_family, num_tasks, unroll_steps, opt=opt, lopt=lopt,
                                               scan_unroll=scan_unroll)
    mean, stderr = time_jax_fn(fn, time_measurements=num_time_estimates)
  except RuntimeError as e:  # XLA reports out-of-memory as a RuntimeError
    if "RESOURCE_EXHAUSTED" in str(e) or "Resource exhausted" in str(e):
      return float("nan"), float("nan")
    raise
  return mean / (num_tasks * unroll_steps), stderr / (num_tasks * unroll_steps)


def timing_for_iterator(it: Iterator[Any], secs: float = 8.0) -> Tuple[float, float]:
  """``(mean, standard error)`` seconds per ``next(it)``, measured for about ``secs`` seconds after one untimed
  call and about ``secs`` seconds of warm-up (at most 20000 calls each)."""
  next(it)
  for _ in range(2):  # a warm-up pass, then the measured one
    stamps = [time.perf_counter()]
    for _ in range(20000):
      next(it)
      stamps.append(time.perf_counter())
      if stamps[-1] - stamps[0] > secs:
        break
  gaps = onp.diff(stamps)
  return float(onp.mean(gaps)), float(onp.std(gaps) / onp.sqrt(len(gaps)))


def task_family_runtime_stats(task_family: Any, opt: Optional[Any] = None, lopt: Optional[Any] = None,
                              data: bool = True, scan_unroll: int = 1, num_time_estimates: int = 30,
                              num_tasks_list: Optional[list] = None,
                              clear_buffers: bool = True) -> Mapping[str, Optional[Tuple[float, float]]]:
  """``{"data": seconds per batch or None, "unroll_<n>x10": seconds per inner step}`` for each ``n`` of
  ``num_tasks_list`` (default 1, 2, 4, 8, 16, 32); the values are also printed in milliseconds."""
  del clear_buffers
  stats: dict = {"data": None}
  datasets = getattr(task_family, "datasets", None)
  if datasets is not None and data:
    stats["data"] = timing_for_iterator(datasets.train)
    print("Data (ms)]", onp.asarray(stats["data"]) * 1000)
  for num_tasks in (num_tasks_list or [1, 2, 4, 8, 16, 32]):
    stats[f"unroll_{num_tasks}x10"] = time_for_task_family_vmap_unroll(
        task_family, num_tasks, 10, num_time_estimates=num_time_estimates, opt=opt, lopt=lopt,
        scan_unroll=scan_unroll)
    print(f"unroll_{num_tasks}x10 (ms)]", tuple(onp.asarray(stats[f"unroll_{num_tasks}x10"]) * 1000))
  return stats
