"""The self-tuning score: one learning rate (step scale) for every task of a suite, AlgoPerf's self-tuning rule.

The suites' default score tunes everyone per task: the candidate's step scale like a learning rate, each baseline's
rate and schedule (`metafam.benchmark.baselines`). The self-tuning score tunes nothing per task: the candidate runs
at its recipe's fixed step scale on every task, and each baseline runs at the one setting (schedule and learning
rate) that is best over the whole development suite. The two are compared per task, paired, with the suites'
statistics (`metafam.benchmark.report.paired_rows`).

**The best single setting** (`metafam.benchmark.single_rate.best_single_rate`): per baseline, the (schedule, rate)
with the lowest geometric-mean regret over the development suite's tasks, chosen from the shipped sweeps without
training (the rule is that module's docstring's).

**Its curves** (`baseline_curves`). Where a task's tuned setting is the single setting, the shipped curves are that
setting's; elsewhere the baseline trains at it through `metafam.benchmark.sweep.train_lanes`, exactly as one lane of
its tuning sweep (same seeds, keys, schedule, evaluation points and batches; a lane trained alone can differ from the
same lane of the sweep's vmap in float rounding). The result, `BaselineCurves`, is a frozen dataclass with a JSON form,
kept per task in an optional cache directory (`metafam.benchmark.heldout`'s cache files: a file written for another
setting is refused).

**Scores** (`score_curves`, `self_tuning_baselines`). Curves are scored per task by
`metafam.evaluation.scores.score_task` and across tasks by its `aggregate_scores`: the measuring stick stays tuned
Adam (the speedup's reference, tuned Adam's final loss in the loss gains), so the two scores share their units and
only the competitors lose their tuning. A score's rank and win fractions still count against the shipped (tuned)
baselines. `self_tuning_rows` pairs an untuned candidate with each single-setting baseline.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from metafam.benchmark import baseline_files as bf
from metafam.benchmark import baselines as bl
from metafam.benchmark import heldout, report, suite_cache
from metafam.benchmark.single_rate import SingleRate, best_single_rate, check_data, check_tasks, same_rate
from metafam.evaluation.scores import SuiteEvaluation, score_task, suite_evaluation


@dataclasses.dataclass(frozen=True)
class BaselineCurves:
  """One baseline at one setting on one task of a suite (`baseline_curves`).

  Attributes:
    suite, task, optimizer, schedule, learning_rate: what ran.
    eval_steps: the suite's evaluation points of the task.
    test_curves: ``[S][E]`` normalized ``test`` loss per seed (NaN where not finite).
    shipped: True where the curves are the shipped tuned ones (the setting is the task's tuned one), False where
      they were trained.
    wall_time: seconds of training (0 for shipped curves; a cached task's time when it was trained).
  """
  suite: str
  task: str
  optimizer: str
  schedule: str
  learning_rate: float
  eval_steps: Tuple[int, ...]
  test_curves: Tuple[Tuple[float, ...], ...]
  shipped: bool
  wall_time: float

  @property
  def curves(self) -> np.ndarray:
    """``f64[S, E]``: `test_curves` as an array."""
    return np.asarray(self.test_curves, np.float64)

  def to_json(self) -> Dict[str, Any]:
    d = dataclasses.asdict(self)
    d["test_curves"] = [[float(v) if np.isfinite(v) else None for v in row] for row in self.test_curves]
    return d

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "BaselineCurves":
    d = dict(d)
    d["eval_steps"] = tuple(int(v) for v in d["eval_steps"])
    d["test_curves"] = tuple(tuple(float("nan") if v is None else float(v) for v in row) for row in d["test_curves"])
    return cls(**d)


def baseline_curves(task: str, optimizer: str, learning_rate: float, schedule: str, *,
                    data: Optional[Mapping[str, Any]] = None, suite: str = "heldout",
                    cache_dir: Optional[str] = None, reuse_shipped: bool = True,
                    lane_chunk: Any = "auto") -> BaselineCurves:
  """Baseline ``optimizer`` on ``task`` of ``suite`` at one (``schedule``, ``learning_rate``), on the suite's seeds.

  Where the setting is the task's tuned one (and ``reuse_shipped``), the shipped curves; else one lane of the
  baseline's tuning sweep, trained through `metafam.benchmark.sweep.train_lanes` (module docstring). ``data``
  defaults to the suite's shipped baselines. ``cache_dir``: trained curves are kept in
  ``cache_dir/<optimizer>/<task>.json`` (`metafam.benchmark.heldout`'s cache files, identity = suite, task,
  optimizer, setting and evaluation points) and read from there by a later call; a file of another setting is
  refused. ``lane_chunk``: `metafam.benchmark.baselines.default_lane_chunk` of the optimizer by default ("auto").
  """
  from metafam.evaluation.metrics import normalize
  from metafam.optimizers.optax_zoo import OPTAX_FACTORIES
  spec = bf.suite_spec(suite)
  data = heldout.suite_data(None if data is None else check_data(data), suite)
  if task not in data["tasks"]:
    raise ValueError(f"task {task!r} has no baselines in the {suite} data; available: {list(data['tasks'])}.")
  if optimizer not in OPTAX_FACTORIES:
    raise ValueError(f"optimizer must be one of {sorted(OPTAX_FACTORIES)}, got {optimizer!r}.")
  if schedule not in bl.SCHEDULES:
    raise ValueError(f"schedule must be one of {bl.SCHEDULES}, got {schedule!r}.")
  if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float, np.floating)) or not (
      np.isfinite(learning_rate) and learning_rate > 0):
    raise ValueError(f"learning_rate must be a finite number > 0, got {learning_rate!r}.")
  learning_rate = float(learning_rate)
  entry = data["tasks"][task]
  steps = np.asarray(entry["eval_steps"], np.int32)
  tuned = entry["baselines"].get(optimizer)
  num_seeds = len(entry["reference"]["test_curves"])
  if (reuse_shipped and tuned is not None and tuned["schedule"] == schedule
      and same_rate(float(tuned["learning_rate"]), learning_rate)):
    curves = np.asarray(tuned["test_curves"], np.float64)
    return _curves(suite, task, optimizer, schedule, learning_rate, steps, curves, True, 0.0)
  if isinstance(lane_chunk, str) and lane_chunk == "auto":
    lane_chunk = bl.default_lane_chunk(optimizer)

  def train():
    from metafam.benchmark.sweep import train_lanes
    from metafam.tasks.registry import get_task
    t = get_task(task)
    horizon = int(entry["horizon"])
    eval_batches = int(entry.get("eval_batches", spec.eval_batches(t)))
    _, evals = train_lanes(t, bl.scheduled(bl.schedule_factory(OPTAX_FACTORIES[optimizer]), horizon),
                           {"learning_rate": [learning_rate], "cosine": [float(bl.SCHEDULES.index(schedule))]},
                           num_seeds=num_seeds, points=steps, eval_batches=eval_batches, key=bl.task_key(task),
                           splits=bl.SPLITS, name=optimizer, lane_chunk=lane_chunk)
    return normalize(t, evals["test"][0]), {"learning_rate": learning_rate, "schedule": schedule}

  path, identity = None, None
  if cache_dir is not None:
    cache_dir = os.fspath(cache_dir)
    if os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
      raise ValueError(f"cache_dir {cache_dir!r} exists and is not a directory.")
    os.makedirs(os.path.join(cache_dir, optimizer), exist_ok=True)
    path = os.path.join(cache_dir, optimizer, f"{task}.json")
    identity = {"kind": "self_tuning_baseline", "suite": suite, "task": task, "optimizer": optimizer,
                "schedule": schedule, "learning_rate": learning_rate, "eval_steps": steps.tolist()}
  curves, _, seconds, _ = suite_cache.cached_task(path, identity, train)
  return _curves(suite, task, optimizer, schedule, learning_rate, steps, curves, False, seconds)


def _curves(suite, task, optimizer, schedule, learning_rate, steps, curves, shipped, seconds) -> BaselineCurves:
  rows = tuple(tuple(float(v) if np.isfinite(v) else float("nan") for v in row) for row in np.asarray(curves))
  return BaselineCurves(suite=suite, task=task, optimizer=optimizer, schedule=schedule,
                        learning_rate=float(learning_rate), eval_steps=tuple(int(s) for s in steps), test_curves=rows,
                        shipped=bool(shipped), wall_time=float(seconds))


def score_curves(name: str, curves: Mapping[str, Any], data: Mapping[str, Any], *, exclude: Sequence[str] = (),
                 settings: Optional[Mapping[str, Optional[Dict[str, Any]]]] = None,
                 wall_time: float = 0.0) -> SuiteEvaluation:
  """A `metafam.evaluation.scores.SuiteEvaluation` of seed curves per task, scored like `evaluate_suite` scores a
  candidate (`score_task`, `aggregate_scores`).

  ``curves``: ``{task: [S, E]}`` normalized test losses at the task's evaluation points (or `BaselineCurves`).
  ``data``: the suite's baselines. ``exclude``: baselines left out of the ranks (a baseline's own tuned self).
  ``settings``: ``{task: setting}`` recorded in the scores (default: from `BaselineCurves`, else None, i.e. the
  candidate was not tuned on the task).
  """
  data = check_data(data)
  if not isinstance(curves, Mapping) or not curves:
    raise ValueError(f"curves must be a non-empty mapping from task to seed curves, got {type(curves).__name__}.")
  check_tasks(data, list(curves))
  scores, stored = [], {}
  for task, c in curves.items():
    setting = None if settings is None else settings.get(task)
    if isinstance(c, BaselineCurves):
      if settings is None:
        setting = {"learning_rate": c.learning_rate, "schedule": c.schedule, "shipped": c.shipped}
      c = c.curves
    c = np.asarray(c, np.float64)
    scores.append(score_task(task, data["tasks"][task], c, exclude=exclude, setting=setting))
    stored[task] = (np.asarray(data["tasks"][task]["eval_steps"]), c)
  return suite_evaluation(name, scores, stored, data.get("pending", ()), float(wall_time), data.get("suite", "heldout"))


def self_tuning_baselines(*, suite: str = "heldout", data: Optional[Mapping[str, Any]] = None,
                          dev_data: Optional[Mapping[str, Any]] = None, optimizers: Optional[Sequence[str]] = None,
                          tasks: Optional[Sequence[str]] = None, cache_dir: Optional[str] = None,
                          progress: bool = False) -> Tuple[Dict[str, SingleRate], Dict[str, SuiteEvaluation]]:
  """``(choices, evaluations)``: each baseline's best single setting over the development suite (``dev_data``,
  default the shipped heldout baselines; over all of its tasks) and its `SuiteEvaluation` at that setting on
  ``tasks`` of ``suite`` (``data``, default the shipped file), curves trained where they differ from the tuned ones
  (`baseline_curves`, cached under ``cache_dir``). ``optimizers`` default to the suite's baselines."""
  from tqdm.auto import tqdm
  spec = bf.suite_spec(suite)
  dev_data = heldout.load_normalizers(suite="heldout") if dev_data is None else check_data(dev_data, "dev_data")
  data = heldout.load_normalizers(suite=suite) if data is None else check_data(data)
  optimizers = list(spec.optimizers) if optimizers is None else list(optimizers)
  bad = [o for o in optimizers if o not in spec.all_optimizers]
  if bad or not optimizers:
    raise ValueError(f"optimizers must be baselines of the {suite} suite {list(spec.all_optimizers)}, got "
                     f"{optimizers}.")
  tasks = check_tasks(data, tasks)
  choices, evaluations = {}, {}
  for opt in optimizers:
    choice = best_single_rate(dev_data, opt)
    runs = {}
    for task in tqdm(tasks, desc=f"{opt} at {choice.learning_rate:.3g}", unit="task", disable=not progress):
      runs[task] = baseline_curves(task, opt, choice.learning_rate, choice.schedule, data=data, suite=suite,
                                   cache_dir=cache_dir)
    choices[opt] = choice
    evaluations[opt] = score_curves(opt, runs, data, exclude=(opt,),
                                    wall_time=sum(r.wall_time for r in runs.values()))
  return choices, evaluations


SELF_TUNING_HEADERS = ["baseline", "single setting"] + report.PAIRED_HEADERS[1:]


def self_tuning_rows(candidate: SuiteEvaluation,
                     baselines: Mapping[str, SuiteEvaluation]) -> List[List[Any]]:
  """The self-tuning comparison: per baseline at its single setting (`self_tuning_baselines`), its setting and
  `metafam.benchmark.report.paired_rows` of ``candidate`` against it (P(candidate > baseline) and the IQM difference
  of the per-seed speedups, then of the per-seed loss gains, with paired bootstrap intervals; `SELF_TUNING_HEADERS`).

  ``candidate`` must be untuned (every score's ``setting`` None: its recipe's fixed step scale, e.g.
  `evaluate_suite` of a ``(learned optimizer, theta)`` pair) and scored on the baselines' suite.
  """
  if not isinstance(candidate, SuiteEvaluation):
    raise ValueError(f"candidate must be a SuiteEvaluation, got {type(candidate).__name__}.")
  tuned = [s.task for s in candidate.scores if s.setting is not None]
  if tuned:
    raise ValueError(f"candidate {candidate.name!r} was tuned per task on {tuned}; the self-tuning score runs it at "
                     "one fixed step scale.")
  if not isinstance(baselines, Mapping) or not baselines:
    raise ValueError("baselines must be a non-empty mapping of name to SuiteEvaluation.")
  rows = []
  for name, b in baselines.items():
    if not isinstance(b, SuiteEvaluation):
      raise ValueError(f"baselines[{name!r}] must be a SuiteEvaluation, got {type(b).__name__}.")
    if b is candidate:
      raise ValueError(f"baselines[{name!r}] is the candidate itself.")
    if b.suite != candidate.suite:
      raise ValueError(f"baselines[{name!r}] was scored on {b.suite!r}, the candidate on {candidate.suite!r}.")
    settings = {(s.setting or {}).get("schedule", "?") + " " + f"{(s.setting or {}).get('learning_rate', math.nan):.3g}"
                for s in b.scores}
    row = report.paired_rows(candidate, {name: b})[0]
    rows.append([row[0], ", ".join(sorted(settings))] + row[1:])
  return rows
