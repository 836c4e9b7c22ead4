"""The one scoring engine: an optimizer's seed curves on a task, scored against a pool and a tuned-Adam reference.

Every score metafam reports goes through `score_task` and `aggregate_scores`: the suites (`metafam.benchmark`:
`evaluate_suite`, `score`, the ``metafam benchmark`` command) and the main job's closing comparison on fresh
instances of a family (`metafam.evaluation.comparison.compare_with_tuned_adam`, where the instances are the seeds).

A task's *entry* (the layout of `metafam.benchmark.baselines`' shipped files) holds ``horizon`` T, ``eval_steps``,
``baselines`` (``{name: {"test_curves": [S, E]}}``; `REFERENCE` among them is tuned Adam) and ``reference`` (tuned
Adam's run to ``REFERENCE_FACTOR`` x T: ``{"eval_steps", "test_curves"}``). Per task, on the seed-mean curve and per
seed (seed s against every other optimizer's seed s: same initialization and batches):

* ``time_ratio``, the headline (AlgoPerf's): T over the fewest steps any optimizer of the pool needs to reach the
  candidate's result at T (`metafam.evaluation.metrics.time_ratio`; at least 1, never capped); its
  `metafam.evaluation.metrics.profile_score` (1: the pool's fastest, 0: four times slower or more) averaged over seeds and
  tasks is the profile score, AlgoPerf's B.
* ``speedup``, VeLO's speedup over tuned Adam (`metafam.evaluation.metrics.speedup_over_baseline` through
  `paired_speedups`): the steps the reference needs to reach the candidate's loss at T, over T (both curves smoothed
  by a running minimum). Values above ``REFERENCE_FACTOR`` cannot be resolved: they are reported at that cap and
  flagged ``speedup_capped``. A seed whose final loss is not finite scores 0.
* ``loss_ratio``: the candidate's final loss over tuned Adam's; ``seed_loss_gains``: per seed, tuned Adam's final
  loss (seed mean) over the seed's best loss by T (uncapped; 0 for a seed whose final loss is not finite).
* ``rank``: 1 + the number of baselines whose final loss is lower.

Across tasks (`aggregate_scores`): median, IQM and optimality gap (target 1: as fast as tuned Adam) of the per-seed
speedups, the IQM of the per-seed loss gains (``loss_gain_iqm``) and the mean profile score (``profile_score``), with
stratified-bootstrap 95% intervals (`metafam.evaluation.metrics.stratified_aggregate`); the fraction of tasks on
which the candidate's final loss beats each baseline; the number of tasks where it diverged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from metafam.evaluation.metrics import (Aggregate, Speedup, paired_speedups, profile_score, stratified_aggregate,
                                        time_ratio)

STATISTICS = ("median", "iqm", "optimality_gap")
LOSS_GAIN_IQM = "loss_gain_iqm"  # the aggregates' key of the loss gains' IQM
PROFILE_SCORE = "profile_score"  # the aggregates' key of the headline: the mean profile score, AlgoPerf's B
REFERENCE = "adam"  # the baseline the speedups, loss ratios and loss gains are measured against: tuned Adam
REFERENCE_FACTOR = 4  # the reference runs to this many times the horizon: the speedups' cap


@dataclasses.dataclass(frozen=True)
class TaskScore:
  """The candidate on one task (see the module docstring for the metrics).

  Attributes:
    task, horizon: the task and its T.
    speedup: VeLO metric of the seed-mean curve; ``speedup_capped`` if the reference never reached it.
    seed_speedups: the same per seed (0 for a seed whose final loss is not finite).
    seed_loss_gains: per seed, tuned Adam's final loss over the seed's best loss by T (0 if its final loss is not
      finite); uncapped.
    final_loss: seed-mean normalized test loss at T (NaN if not finite).
    loss_ratio: ``final_loss`` over tuned Adam's.
    rank: 1 + baselines with a lower final loss (of ``num_ranked``).
    beats: ``{baseline: final_loss < the baseline's}``.
    diverged: some seed's test curve is not finite.
    setting: the candidate's tuned setting (rate, schedule) when it was tuned, else None.
    time_ratio: the headline, `metafam.evaluation.metrics.time_ratio` of the seed-mean curve against the pool's
      seed-mean curves: T over the fewest steps any optimizer of ``pool`` needed to reach the candidate's result at
      T (at least 1, never capped).
    seed_time_ratios: the same per seed (seed s against every pool member's seed s).
    pool: the optimizers the ratio is measured against (the suite's baselines on this task, or the pool given).
  """
  task: str
  horizon: int
  speedup: float
  speedup_capped: bool
  seed_speedups: Tuple[float, ...]
  final_loss: float
  loss_ratio: float
  rank: int
  num_ranked: int
  beats: Dict[str, bool]
  diverged: bool
  setting: Optional[Dict[str, Any]] = None
  seed_loss_gains: Tuple[float, ...] = ()
  time_ratio: float = float("nan")
  seed_time_ratios: Tuple[float, ...] = ()
  pool: Tuple[str, ...] = ()

  @property
  def loss_gain(self) -> float:
    """The seeds' mean loss gain (NaN without any)."""
    return float(np.mean(self.seed_loss_gains)) if self.seed_loss_gains else float("nan")

  @property
  def seed_profile_scores(self) -> Tuple[float, ...]:
    """Per seed, `metafam.evaluation.metrics.profile_score` of the time ratio (1: the pool's fastest; 0: a ratio of
    4 or more): the runs whose mean is the headline score."""
    return tuple(float(v) for v in profile_score(np.asarray(self.seed_time_ratios, np.float64)))


@dataclasses.dataclass(frozen=True)
class SuiteEvaluation:
  """A candidate on the suite.

  Attributes:
    name: the candidate's label.
    scores: one `TaskScore` per evaluated task.
    curves: ``{task: (eval_steps [E], seed curves [S, E])}`` normalized test losses.
    aggregates: ``{statistic: Aggregate}`` of the per-seed speedups (`STATISTICS`), and the IQM of the per-seed loss
      gains under `LOSS_GAIN_IQM`.
    win_fraction: ``{baseline: fraction of tasks whose final loss the candidate beats}``.
    num_diverged: tasks on which the candidate diverged.
    pending: the suite's tasks without shipped baselines (not evaluated).
    wall_time: seconds spent training the candidate, summed over tasks (a task read from ``cache_dir`` counts the
      time it took when it was trained); 0 for shipped baselines.
    suite: ``"heldout"`` (development) or ``"test"``.
    evaluated_at: when the candidate was trained (UTC, ISO 8601): the time its last task finished training, also
      when tasks are read from a ``cache_dir`` (each cached task records it; a task cached before it did counts as
      trained at the call); for shipped baselines, the data file's generation is recorded in it instead, and this is
      empty.
  """
  name: str
  scores: Tuple[TaskScore, ...]
  curves: Dict[str, Tuple[np.ndarray, np.ndarray]]
  aggregates: Dict[str, Aggregate]
  win_fraction: Dict[str, float]
  num_diverged: int
  pending: Tuple[str, ...]
  wall_time: float
  suite: str = "heldout"
  evaluated_at: str = ""

  def seed_speedups(self, tasks: Optional[Sequence[str]] = None) -> np.ndarray:
    """``f64[S, N]``: the per-seed speedups (rows: seeds; columns: ``tasks``, default every scored task in order),
    the score matrix of the aggregates and of `metafam.benchmark.paired`."""
    return self._seed_matrix("seed_speedups", tasks)

  def seed_loss_gains(self, tasks: Optional[Sequence[str]] = None) -> np.ndarray:
    """``f64[S, N]``: the per-seed loss gains, laid out like `seed_speedups`."""
    return self._seed_matrix("seed_loss_gains", tasks)

  def seed_profile_scores(self, tasks: Optional[Sequence[str]] = None) -> np.ndarray:
    """``f64[S, N]``: the per-seed profile scores of the time ratios (the headline's runs), laid out like
    `seed_speedups`."""
    return self._seed_matrix("seed_profile_scores", tasks)

  def _seed_matrix(self, field: str, tasks: Optional[Sequence[str]]) -> np.ndarray:
    by_task = {s.task: getattr(s, field) for s in self.scores}
    tasks = list(by_task) if tasks is None else list(tasks)
    missing = [t for t in tasks if t not in by_task]
    if missing:
      raise ValueError(f"{self.name} was not scored on {missing}.")
    return np.array([by_task[t] for t in tasks], np.float64).T


def _final(curve: np.ndarray) -> float:
  v = float(curve[-1])
  return v if np.isfinite(v) else float("nan")


def task_pool(entry: Mapping[str, Any]) -> Dict[str, np.ndarray]:
  """``{baseline: seed curves [S, E]}`` of every baseline a task's entry holds (the default pool of `score_task`)."""
  return {o: np.asarray(b["test_curves"], np.float64) for o, b in entry["baselines"].items()}


def score_task(task: str, entry: Mapping[str, Any], curves: np.ndarray, exclude: Sequence[str] = (),
               setting: Optional[Dict[str, Any]] = None,
               pool: Optional[Mapping[str, np.ndarray]] = None) -> TaskScore:
  """`TaskScore` of seed curves ``[S, E]`` (normalized test loss at ``entry["eval_steps"]``) against one task's
  entry of the normalizer file; ``exclude`` leaves baselines out of the ranking (a baseline scored as candidate).
  ``pool``: ``{name: seed curves [S, E]}`` the time ratio is measured against (default `task_pool`, the shipped
  baselines; the candidate always belongs to it)."""
  steps = np.asarray(entry["eval_steps"], np.float64)
  curves = np.asarray(curves, np.float64)
  if curves.ndim != 2 or curves.shape[1] != steps.size:
    raise ValueError(f"{task}: curves must be [seeds, {steps.size}] at the suite's eval points, got {curves.shape}.")
  mean = curves.mean(axis=0)
  if "reference" in entry:
    ref_steps = np.asarray(entry["reference"]["eval_steps"], np.float64)
    ref_seeds = np.asarray(entry["reference"]["test_curves"], np.float64)
    if ref_seeds.shape[0] != curves.shape[0]:
      raise ValueError(f"{task}: {curves.shape[0]} seed curves, but the reference has {ref_seeds.shape[0]} seeds.")
    of_mean, of_seeds = paired_speedups(steps, curves, ref_steps, ref_seeds)
  else:  # a custom suite without baselines: no speedups
    of_mean = Speedup(float("nan"), True, float("nan"), float("nan"))
    of_seeds = (of_mean,) * curves.shape[0]

  def speedup(curve, s):  # a curve that ends non-finite scores 0
    return (s.value, not s.reached) if np.isfinite(curve[-1]) else (0.0, False)

  def loss_gain(curve):
    """Tuned Adam's final loss over the curve's best by T; 0 if it ends non-finite; NaN (the task is then left out
    of paired comparisons) if either loss is not positive."""
    if not np.isfinite(curve[-1]):
      return 0.0
    best = float(np.min(curve[np.isfinite(curve)]))
    return adam / best if adam > 0 and best > 0 else float("nan")

  value, capped = speedup(mean, of_mean)
  final = _final(mean)
  finals = {o: _final(np.mean(np.asarray(b["test_curves"], np.float64), axis=0))
            for o, b in entry["baselines"].items() if o not in exclude}
  adam = (_final(np.mean(np.asarray(entry["baselines"][REFERENCE]["test_curves"], np.float64), axis=0))
          if REFERENCE in entry["baselines"] else float("nan"))
  beats = {o: bool(np.isfinite(final) and (not np.isfinite(f) or final < f)) for o, f in finals.items()}
  rank = 1 + sum(1 for f in finals.values() if np.isfinite(f) and (not np.isfinite(final) or f < final))
  pool = task_pool(entry) if pool is None else {k: np.asarray(v, np.float64) for k, v in pool.items()}
  bad = [k for k, v in pool.items() if v.shape != curves.shape]
  if bad:
    raise ValueError(f"{task}: pool curves {bad} are not [{curves.shape[0]}, {steps.size}] like the candidate's.")
  ratio = time_ratio(steps, mean, [v.mean(axis=0) for v in pool.values()])
  seed_ratios = tuple(time_ratio(steps, c, [v[i] for v in pool.values()]) for i, c in enumerate(curves))
  return TaskScore(task=task, horizon=int(entry["horizon"]), speedup=float(value), speedup_capped=bool(capped),
                   seed_speedups=tuple(float(speedup(c, sp)[0]) for c, sp in zip(curves, of_seeds)),
                   final_loss=final,
                   loss_ratio=final / adam if np.isfinite(adam) and adam > 0 else float("nan"), rank=rank,
                   num_ranked=len(finals) + 1, beats=beats, diverged=not bool(np.all(np.isfinite(curves))),
                   setting=setting, seed_loss_gains=tuple(loss_gain(c) for c in curves), time_ratio=ratio,
                   seed_time_ratios=seed_ratios, pool=tuple(pool))


def aggregate_scores(scores: Sequence[TaskScore], num_resamples: int = 2000, confidence: float = 0.95,
                     seed: int = 0) -> Tuple[Dict[str, Aggregate], Dict[str, float], int]:
  """``(aggregates, win_fraction, num_diverged)`` over tasks (see the module docstring)."""
  matrix = np.array([s.seed_speedups for s in scores], np.float64).T if scores else np.zeros((1, 0))
  aggregates = {stat: stratified_aggregate(matrix, stat, num_resamples, confidence, seed) for stat in STATISTICS}
  gains = np.array([s.seed_loss_gains for s in scores], np.float64).T if scores else np.zeros((1, 0))
  aggregates[LOSS_GAIN_IQM] = stratified_aggregate(gains, "iqm", num_resamples, confidence, seed)
  profiles = np.array([s.seed_profile_scores for s in scores], np.float64).T if scores else np.zeros((1, 0))
  aggregates[PROFILE_SCORE] = stratified_aggregate(profiles, "mean", num_resamples, confidence, seed)
  names = sorted({o for s in scores for o in s.beats})
  wins = {o: float(np.mean([s.beats[o] for s in scores if o in s.beats])) for o in names}
  return aggregates, wins, sum(s.diverged for s in scores)


def suite_evaluation(name: str, scores: Sequence[TaskScore], curves: Mapping[str, Tuple[np.ndarray, np.ndarray]],
                     pending: Sequence[str] = (), wall_time: float = 0.0, suite: str = "heldout",
                     evaluated_at: str = "", **aggregate_options: Any) -> SuiteEvaluation:
  """The `SuiteEvaluation` of ``scores`` with their aggregates (`aggregate_scores`, given ``aggregate_options``:
  ``num_resamples``, ``confidence``, ``seed``)."""
  aggregates, wins, diverged = aggregate_scores(scores, **aggregate_options)
  return SuiteEvaluation(name=name, scores=tuple(scores), curves=dict(curves), aggregates=aggregates, win_fraction=wins,
                         num_diverged=diverged, pending=tuple(pending), wall_time=wall_time, suite=suite,
                         evaluated_at=evaluated_at)

