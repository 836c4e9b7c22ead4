"""Paired comparisons of two optimizers scored on the same (task, seed) runs: is A better than B, and by how much?

Two overlapping confidence intervals of separate aggregates say little: both intervals carry the spread of the
tasks, which the two optimizers share. These statistics compare the optimizers directly.

* `probability_of_improvement`: P(A > B) as rliable defines it (Agarwal et al., 2021): for each task m, the
  Mann-Whitney statistic ``P(X_m > Y_m) = mean over all run pairs (i, j) of S(a[i, m], b[j, m])`` with ``S = 1`` if
  ``a > b``, ``1/2`` on a tie and 0 otherwise; then the mean over tasks. 0.5 means no difference; the interval is a
  stratified percentile bootstrap that redraws, for every task separately, the runs of A and the runs of B
  (rliable's ``StratifiedIndependentBootstrap``). An interval whose low end is above 0.5 says A beats B more often
  than not on a random task of the suite.
* `difference`: ``statistic(A) - statistic(B)`` (IQM by default) of the pooled scores, with a *paired* stratified
  bootstrap: each resample draws, per task, R run indices once and uses them for both A and B, so seed s of A stays
  matched with seed s of B (they started from the same initialization and saw the same batches). An interval that
  excludes 0 is the finding "A's IQM is higher (lower) than B's".

Scores are matrices ``[R runs, N tasks]`` where higher is better (e.g. the per-seed speedups of
`metafam.benchmark.heldout`). A task where either matrix has a non-finite score is left out of both (and counted).
Each result is an `Aggregate` whose ``statistic`` is ``"probability_of_improvement"`` or ``"<statistic> difference"``
and whose ``value`` is P(A > B) in [0, 1] or A's statistic minus B's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from metafam.evaluation.metrics import RUN_STATISTICS, Aggregate, _run_statistic


def _check(a, b, same_runs: bool):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  for name, x in (("a", a), ("b", b)):
    if x.ndim != 2 or x.shape[0] == 0:
      raise ValueError(f"{name} must be a [runs, tasks] score matrix with at least one run, got shape {x.shape}.")
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"a and b must score the same tasks: a has {a.shape[1]} columns, b has {b.shape[1]}.")
  if same_runs and a.shape != b.shape:
    raise ValueError(f"a paired comparison needs the same runs of both: a is {a.shape}, b is {b.shape}.")
  keep = np.all(np.isfinite(a), axis=0) & np.all(np.isfinite(b), axis=0)
  return a[:, keep], b[:, keep], int((~keep).sum())


def _check_level(confidence: float, num_resamples: int) -> int:
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}.")
  if int(num_resamples) < 1:
    raise ValueError(f"num_resamples must be a positive integer, got {num_resamples!r}.")
  return int(num_resamples)


def _interval(stats: np.ndarray, confidence: float):
  alpha = (1.0 - confidence) / 2.0
  low, high = np.quantile(stats, [alpha, 1.0 - alpha])
  return float(low), float(high)


def _mann_whitney(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """``[..., N]``: per task, the fraction of run pairs with ``a > b`` (ties count 1/2), from ``a [..., R, N]`` and
  ``b [..., K, N]``."""
  diff = a[..., :, None, :] - b[..., None, :, :]
  return np.mean((diff > 0) + 0.5 * (diff == 0), axis=(-3, -2))


def probability_of_improvement(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]],
                               num_resamples: int = 2000, confidence: float = 0.95,
                               seed: int = 0) -> Aggregate:
  """P(A > B) of score matrices ``a [R, N]`` and ``b [K, N]`` (higher is better), rliable's definition, with a
  stratified independent percentile-bootstrap interval (module docstring)."""
  num_resamples = _check_level(confidence, num_resamples)
  a, b, excluded = _check(a, b, same_runs=False)
  tasks = a.shape[1]
  if tasks == 0:
    nan = float("nan")
    return Aggregate("probability_of_improvement", nan, nan, nan, 0, excluded, confidence)
  point = float(np.mean(_mann_whitney(a, b)))
  rng = np.random.default_rng(seed)
  ia = rng.integers(0, a.shape[0], size=(num_resamples, a.shape[0], tasks))
  ib = rng.integers(0, b.shape[0], size=(num_resamples, b.shape[0], tasks))
  ra = np.take_along_axis(np.broadcast_to(a, (num_resamples,) + a.shape), ia, axis=1)
  rb = np.take_along_axis(np.broadcast_to(b, (num_resamples,) + b.shape), ib, axis=1)
  stats = np.mean(_mann_whitney(ra, rb), axis=-1)
  return Aggregate("probability_of_improvement", point, *_interval(stats, confidence), tasks, excluded,
                          confidence)


def difference(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], statistic: str = "iqm",
               num_resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
               gamma: float = 1.0) -> Aggregate:
  """``statistic(a) - statistic(b)`` of score matrices ``[R, N]`` whose run r of task m is the same seed for both,
  with a paired stratified percentile-bootstrap interval (module docstring). ``statistic`` is one of
  `metafam.evaluation.metrics.RUN_STATISTICS` (``gamma``: the optimality gap's target)."""
  if statistic not in RUN_STATISTICS:
    raise ValueError(f"statistic must be one of {RUN_STATISTICS}, got {statistic!r}.")
  num_resamples = _check_level(confidence, num_resamples)
  a, b, excluded = _check(a, b, same_runs=True)
  runs, tasks = a.shape
  name = f"{statistic} difference"
  if tasks == 0:
    nan = float("nan")
    return Aggregate(name, nan, nan, nan, 0, excluded, confidence)
  point = float(_run_statistic(statistic, a, gamma) - _run_statistic(statistic, b, gamma))
  rng = np.random.default_rng(seed)
  rows = rng.integers(0, runs, size=(num_resamples, runs, tasks))  # one draw per task, shared by A and B

  def resampled(x):
    return np.take_along_axis(np.broadcast_to(x, (num_resamples, runs, tasks)), rows, axis=1)

  stats = _run_statistic(statistic, resampled(a), gamma) - _run_statistic(statistic, resampled(b), gamma)
  return Aggregate(name, point, *_interval(stats, confidence), tasks, excluded, confidence)
