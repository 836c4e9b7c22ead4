"""Curves of training runs and the metrics computed from them, shared by `metafam.evaluation` (the held-out
comparison with tuned Adam) and `metafam.benchmark` (whose package face exports the most used).

* `RunCurves`: the recorded curves of one (task, optimizer) pair over S seeds.
* `final_and_best`: final and best (lowest) normalized loss of a seed-mean curve.
* `speedup_over_baseline`: how many steps a baseline (tuned Adam) needs to reach an optimizer's end-of-run loss,
  divided by the optimizer's run length; `paired_speedups` applies it to seed-mean curves and seed by seed.
* `iqm`, `median`, `aggregate`: across-task aggregates with seeded percentile-bootstrap confidence intervals.

Everything here is plain numpy on host arrays; nothing depends on JAX except `normalize`, which calls the task's
(jax) normalizer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence

import numpy as np


def normalize(task: Any, losses: np.ndarray) -> np.ndarray:
  """``task.normalizer`` applied to a host array of raw losses (any shape); returns float64 numpy."""
  import jax.numpy as jnp  # local: this module stays importable (and cheap) without touching JAX
  return np.asarray(task.normalizer(jnp.asarray(losses, jnp.float32)), np.float64)


@dataclasses.dataclass(frozen=True)
class RunCurves:
  """The curves of one optimizer on one task, over S seeds (vmapped lanes).

  Attributes:
    task: the task's name (the registry name when the task was given by name).
    optimizer: the optimizer's name in the benchmark.
    train_losses: ``f32[S, T]``, the training-batch loss before update t, per seed.
    eval_steps: ``i32[E]``, updates done at each evaluation (0, ..., T).
    eval_losses: ``{split: f32[S, E]}`` raw mean losses of the evaluated splits.
    normalized_eval_losses: ``{split: f64[S, E]}``, the same through ``task.normalizer``.
    wall_time: seconds spent producing these curves (compilation included; for tuned baselines, the whole sweep).
    learning_rate: the selected learning rate of a tuned baseline, else None.
  """
  task: str
  optimizer: str
  train_losses: np.ndarray
  eval_steps: np.ndarray
  eval_losses: Dict[str, np.ndarray]
  normalized_eval_losses: Dict[str, np.ndarray]
  wall_time: float
  learning_rate: Optional[float] = None

  @property
  def num_seeds(self) -> int:
    return int(self.train_losses.shape[0])

  @property
  def num_steps(self) -> int:
    return int(self.eval_steps[-1])

  def mean_curve(self, split: str, normalized: bool = True) -> np.ndarray:
    """``f64[E]``: the seed-mean eval curve of ``split`` (NaN wherever any seed is non-finite)."""
    table = self.normalized_eval_losses if normalized else self.eval_losses
    if split not in table:
      raise KeyError(f"split {split!r} was not evaluated; evaluated splits: {sorted(table)}.")
    return np.mean(np.asarray(table[split], np.float64), axis=0)

  def truncated(self, num_steps: int) -> "RunCurves":
    """The curves up to step ``num_steps`` (which must be an eval step)."""
    num_steps = int(num_steps)
    if num_steps not in self.eval_steps:
      raise ValueError(f"num_steps={num_steps} is not an eval step of {self.task}/{self.optimizer} "
                       f"(eval steps {self.eval_steps.tolist()}).")
    keep = self.eval_steps <= num_steps
    return dataclasses.replace(
        self, train_losses=self.train_losses[:, :num_steps], eval_steps=self.eval_steps[keep],
        eval_losses={s: v[:, keep] for s, v in self.eval_losses.items()},
        normalized_eval_losses={s: v[:, keep] for s, v in self.normalized_eval_losses.items()})


# -- per-run metrics ----------------------------------------------------------------------------------------------
def running_min(losses: np.ndarray) -> np.ndarray:
  """``f64[E]``: best-so-far loss; non-finite entries count as +inf, so they never improve the minimum."""
  x = np.asarray(losses, np.float64)
  x = np.where(np.isfinite(x), x, np.inf)
  return np.minimum.accumulate(x)


def final_and_best(curve: np.ndarray) -> tuple:
  """``(final, best)`` of a 1-D curve: its last value (NaN if non-finite) and its lowest finite value (NaN if none)."""
  curve = np.asarray(curve, np.float64)
  final = float(curve[-1]) if np.isfinite(curve[-1]) else float("nan")
  finite = curve[np.isfinite(curve)]
  return final, (float(finite.min()) if finite.size else float("nan"))


@dataclasses.dataclass(frozen=True)
class Speedup:
  """Result of `speedup_over_baseline`.

  Attributes:
    value: baseline steps needed to reach ``target``, divided by the optimizer's run length T. When the baseline
      never reaches the target, ``value`` is the cap ``baseline_length / T`` (a lower bound) and ``reached`` is False.
    reached: whether the baseline reached the target within its run.
    target: the optimizer's end-of-run loss (its running minimum at T).
    baseline_steps_needed: the (interpolated) step at which the baseline first reaches ``target``; NaN if never.
  """
  value: float
  reached: bool
  target: float
  baseline_steps_needed: float


def _crossing_step(s0: float, s1: float, b0: float, b1: float, target: float) -> float:
  """Step in ``[s0, s1]`` where a curve going from ``b0 > target`` to ``b1 <= target`` hits ``target``.

  Interpolates log-linearly when ``b1, target > 0`` (exact for exponential decay), else linearly; a non-finite
  ``b0`` (no finite value before) gives ``s1``.
  """
  if not np.isfinite(b0):
    return s1
  if b1 > 0 and target > 0:
    frac = (np.log(b0) - np.log(target)) / (np.log(b0) - np.log(b1))
  else:
    frac = (b0 - target) / (b0 - b1)
  return float(s0 + np.clip(frac, 0.0, 1.0) * (s1 - s0))


def speedup_over_baseline(steps: np.ndarray, losses: np.ndarray, baseline_steps: np.ndarray,
                          baseline_losses: np.ndarray) -> Speedup:
  """How much faster an optimizer is than a baseline, from their loss curves.

  Both curves are first smoothed by a running minimum (`running_min`; non-finite values never count). The target is
  the optimizer's smoothed loss at its last step T = ``steps[-1]``; the result is the first step at which the
  baseline's smoothed curve reaches the target (interpolated between eval points by `_crossing_step`) divided by T.
  So an optimizer whose loss at T the baseline only reaches at 2T scores 2.0, and identical strictly decreasing
  curves score 1.0. If the baseline never reaches the target, the value is capped at ``baseline_steps[-1] / T`` and
  flagged ``reached=False``: run the baseline longer than the optimizer to resolve speedups above 1.

  Args:
    steps: ``[E]`` ascending eval steps of the optimizer (``steps[-1] > 0``).
    losses: ``[E]`` its loss at those steps (e.g. the seed-mean normalized test loss).
    baseline_steps, baseline_losses: the same for the baseline (any grid).
  """
  steps, baseline_steps = np.asarray(steps, np.float64), np.asarray(baseline_steps, np.float64)
  losses, baseline_losses = np.asarray(losses, np.float64), np.asarray(baseline_losses, np.float64)
  if steps.ndim != 1 or steps.shape != losses.shape or baseline_steps.ndim != 1 or \
     baseline_steps.shape != baseline_losses.shape:
    raise ValueError(f"steps/losses must be 1-D and of equal length, got {steps.shape}/{losses.shape} and "
                     f"{baseline_steps.shape}/{baseline_losses.shape}.")
  if np.any(np.diff(steps) <= 0) or np.any(np.diff(baseline_steps) <= 0) or steps[-1] <= 0:
    raise ValueError("steps must be strictly increasing with a positive last step.")
  run_length = steps[-1]
  target = running_min(losses)[-1]
  needed = steps_to_reach(baseline_steps, baseline_losses, target)
  if not np.isfinite(needed):
    return Speedup(float(baseline_steps[-1] / run_length), False, float(target), float("nan"))
  return Speedup(needed / run_length, True, float(target), needed)


def steps_to_reach(steps: np.ndarray, losses: np.ndarray, target: float) -> float:
  """The first (interpolated, `_crossing_step`) step at which the running minimum of ``losses`` (at ascending
  ``steps``) is at most ``target``; inf if it never is."""
  base = running_min(losses)
  hits = np.nonzero(base <= target)[0]
  if hits.size == 0:
    return float("inf")
  i = int(hits[0])
  if i == 0:
    return float(steps[0])
  return _crossing_step(steps[i - 1], steps[i], base[i - 1], base[i], target)


PROFILE_MAX = 4.0  # AlgoPerf's performance profiles stop at a time ratio of 4 to the fastest


def time_ratio(steps: np.ndarray, curve: np.ndarray, pool: Sequence[np.ndarray]) -> float:
  """The performance ratio of one run against a pool of runs (AlgoPerf's ratio with the run's own result as target).

  The target is the run's result, the running minimum of ``curve`` at its last step T; the ratio is T over the
  fewest steps any curve of ``pool`` (the run itself included) needs to reach it (`steps_to_reach`). It is at least
  1 (the run reaches its own result by T), finite, and 1 when no run got there sooner: 2 means the pool's fastest
  way to this result took half the budget. A run whose curve ends non-finite scores inf (it has no result), and so
  does one that never improved on the starting loss (the pool "reaches" it at step 0). All curves share ``steps``
  (strictly increasing, ``steps[-1] > 0``).
  """
  steps = np.asarray(steps, np.float64)
  curve = np.asarray(curve, np.float64)
  if not np.isfinite(curve[-1]):
    return float("inf")
  target = running_min(curve)[-1]
  fastest = min(steps_to_reach(steps, np.asarray(c, np.float64), target) for c in (curve, *pool))
  return float(steps[-1] / fastest) if fastest > 0 else float("inf")


def profile_score(ratios: np.ndarray, max_ratio: float = PROFILE_MAX) -> np.ndarray:
  """``(max_ratio - clip(ratio, 1, max_ratio)) / (max_ratio - 1)``, in [0, 1]: a run's share of the area under the
  performance profile from 1 to ``max_ratio``. The mean over runs is AlgoPerf's score B of their pooled profile
  (the normalized area of the fraction of runs within tau of the fastest, tau from 1 to 4); inf or NaN scores 0."""
  r = np.asarray(ratios, np.float64)
  r = np.where(np.isfinite(r), r, max_ratio)
  return (max_ratio - np.clip(r, 1.0, max_ratio)) / (max_ratio - 1.0)

def paired_speedups(steps: np.ndarray, curves: np.ndarray, baseline_steps: np.ndarray, baseline_curves: np.ndarray,
                    *, axis: int = 0, per_seed: bool = True) -> tuple:
  """`speedup_over_baseline` of the seed-mean curve against the baseline's seed-mean curve, and of each seed against
  the baseline's same seed (same initialization and batches): the one comparison of curves behind every speedup
  (`metafam.evaluation.comparison`, `metafam.benchmark.heldout`).

  Args:
    steps, baseline_steps: ``[E]`` and ``[E']`` eval steps.
    curves, baseline_curves: losses with seeds along ``axis`` and the eval steps along the other axis.
    per_seed: also compare seed by seed (both must then have as many seeds).

  Returns:
    ``(Speedup of the means, tuple of per-seed Speedups)`` (the tuple is empty without ``per_seed``).
  """
  curves, baseline_curves = np.asarray(curves, np.float64), np.asarray(baseline_curves, np.float64)
  if curves.ndim != 2 or baseline_curves.ndim != 2 or axis not in (0, 1):
    raise ValueError(f"curves must be 2-D with seeds along axis 0 or 1, got {curves.shape} and "
                     f"{baseline_curves.shape} with axis={axis!r}.")
  mean = speedup_over_baseline(steps, np.mean(curves, axis=axis), baseline_steps, np.mean(baseline_curves, axis=axis))
  if not per_seed:
    return mean, ()
  if curves.shape[axis] != baseline_curves.shape[axis]:
    raise ValueError(f"per-seed speedups pair seed s with the baseline's seed s: got {curves.shape[axis]} and "
                     f"{baseline_curves.shape[axis]} seeds.")
  return mean, tuple(speedup_over_baseline(steps, np.take(curves, i, axis), baseline_steps,
                                           np.take(baseline_curves, i, axis)) for i in range(curves.shape[axis]))

# -- aggregates ---------------------------------------------------------------------------------------------------
def _iqm_sorted(sorted_values: np.ndarray) -> np.ndarray:
  """IQM along the last axis of already sorted values: the mean after cutting ``floor(n / 4)`` from each end."""
  n = sorted_values.shape[-1]
  k = n // 4
  return sorted_values[..., k:n - k].mean(axis=-1)


def iqm(values: Sequence[float]) -> float:
  """Interquartile mean: the mean of the values left after dropping the lowest and highest ``floor(n / 4)``.

  This is ``scipy.stats.trim_mean(values, 0.25)`` (as in rliable): 8 values keep the middle 4, 1-3 values keep all.
  """
  x = np.sort(np.asarray(values, np.float64).ravel())
  if x.size == 0:
    return float("nan")
  return float(_iqm_sorted(x))


def median(values: Sequence[float]) -> float:
  x = np.asarray(values, np.float64).ravel()
  return float(np.median(x)) if x.size else float("nan")


STATISTICS = ("median", "iqm")


@dataclasses.dataclass(frozen=True)
class Aggregate:
  """An across-task statistic with a percentile-bootstrap confidence interval.

  Attributes:
    statistic: ``"median"`` or ``"iqm"``.
    value: the statistic of the finite values.
    low, high: the bootstrap confidence interval (``confidence`` level, resampling tasks with replacement).
    num_tasks: finite values used.
    num_excluded: non-finite values dropped (e.g. a task whose baseline diverged).
    confidence: the interval's level, e.g. 0.95.
  """
  statistic: str
  value: float
  low: float
  high: float
  num_tasks: int
  num_excluded: int
  confidence: float


def aggregate(values: Sequence[float], statistic: str = "iqm", num_resamples: int = 1000, confidence: float = 0.95,
              seed: int = 0) -> Aggregate:
  """``statistic`` of the finite ``values`` (one per task) with a seeded percentile-bootstrap CI.

  The bootstrap draws ``num_resamples`` resamples of the n tasks with replacement from ``np.random.default_rng(seed)``
  and reports the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` percentiles of the statistic. One task gives
  a zero-width interval; none gives NaNs.
  """
  if statistic not in STATISTICS:
    raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}.")
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}.")
  x = np.asarray(values, np.float64).ravel()
  finite = x[np.isfinite(x)]
  excluded, n = int(x.size - finite.size), int(finite.size)
  if n == 0:
    nan = float("nan")
    return Aggregate(statistic, nan, nan, nan, 0, excluded, confidence)
  point = median(finite) if statistic == "median" else iqm(finite)
  rng = np.random.default_rng(seed)
  resamples = np.sort(finite[rng.integers(0, n, size=(int(num_resamples), n))], axis=1)
  stats = np.median(resamples, axis=1) if statistic == "median" else _iqm_sorted(resamples)
  alpha = (1.0 - confidence) / 2.0
  low, high = np.quantile(stats, [alpha, 1.0 - alpha])
  return Aggregate(statistic, point, float(low), float(high), n, excluded, confidence)


# -- run-level aggregates (rliable's stratified bootstrap) ----------------------------------------------------------
RUN_STATISTICS = ("median", "iqm", "mean", "optimality_gap")


def optimality_gap(scores: np.ndarray, gamma: float = 1.0) -> np.ndarray:
  """``gamma - mean(min(scores, gamma))`` over the last axis: how far scores fall short of ``gamma`` on average
  (0 when every score reaches it; scores above ``gamma`` earn nothing extra)."""
  return gamma - np.mean(np.minimum(scores, gamma), axis=-1)


def _run_statistic(statistic: str, scores: np.ndarray, gamma: float) -> np.ndarray:
  """``statistic`` of ``scores [..., R, N]`` (R runs of N tasks) over the last two axes, as rliable defines them:
  the median of the per-task means; the IQM, mean and optimality gap of all R * N scores pooled."""
  pooled = scores.reshape(scores.shape[:-2] + (-1,))
  if statistic == "median":
    return np.median(scores.mean(axis=-2), axis=-1)
  if statistic == "iqm":
    return _iqm_sorted(np.sort(pooled, axis=-1))
  if statistic == "mean":
    return pooled.mean(axis=-1)
  return optimality_gap(pooled, gamma)


def stratified_aggregate(scores: Sequence[Sequence[float]], statistic: str = "iqm", num_resamples: int = 2000,
                         confidence: float = 0.95, seed: int = 0, gamma: float = 1.0) -> Aggregate:
  """``statistic`` of a score matrix ``[R runs, N tasks]`` with a stratified-bootstrap percentile interval.

  The method of rliable (Agarwal et al., 2021, "Deep RL at the edge of the statistical precipice"), written here
  with numpy so metafam needs no extra dependency: each of ``num_resamples`` resamples redraws, for every task
  separately, R runs with replacement from that task's runs (tasks are strata and are never dropped), and the
  interval is the ``(1 -+ confidence) / 2`` quantiles of the statistic over the resamples. ``statistic`` is one of
  `RUN_STATISTICS` (see `_run_statistic`; ``gamma`` is the optimality gap's target). A task with a non-finite
  score is left out whole and counted in ``num_excluded``; one run per task gives a zero-width interval.
  """
  if statistic not in RUN_STATISTICS:
    raise ValueError(f"statistic must be one of {RUN_STATISTICS}, got {statistic!r}.")
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}.")
  x = np.asarray(scores, np.float64)
  if x.ndim != 2:
    raise ValueError(f"scores must be a [runs, tasks] matrix, got shape {x.shape}.")
  keep = np.all(np.isfinite(x), axis=0)
  x = x[:, keep]
  excluded, (runs, tasks) = int((~keep).sum()), x.shape
  if tasks == 0 or runs == 0:
    nan = float("nan")
    return Aggregate(statistic, nan, nan, nan, 0, excluded, confidence)
  point = float(_run_statistic(statistic, x, gamma))
  rng = np.random.default_rng(seed)
  rows = rng.integers(0, runs, size=(int(num_resamples), runs, tasks))  # per task, its own draw of runs
  resampled = np.take_along_axis(np.broadcast_to(x, (int(num_resamples), runs, tasks)), rows, axis=1)
  stats = _run_statistic(statistic, resampled, gamma)
  alpha = (1.0 - confidence) / 2.0
  low, high = np.quantile(stats, [alpha, 1.0 - alpha])
  return Aggregate(statistic, point, float(low), float(high), tasks, excluded, confidence)


def performance_profile(values: Sequence[float], thresholds: Sequence[float]) -> np.ndarray:
  """``f64[K]``: the fraction of tasks whose value (e.g. speedup) is at least each threshold; NaN counts as below."""
  x = np.asarray(values, np.float64).ravel()
  t = np.asarray(thresholds, np.float64).ravel()
  if x.size == 0:
    return np.full(t.shape, np.nan)
  with np.errstate(invalid="ignore"):
    return np.mean(x[None, :] >= t[:, None], axis=1)
