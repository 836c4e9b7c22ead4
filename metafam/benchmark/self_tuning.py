"""The self-tuning score: one learning rate (step scale) for every task of a suite, AlgoPerf's self-tuning rule.

The suites' default score tunes everyone per task: the candidate's step scale like a learning rate, each baseline's
rate and schedule (`metafam.benchmark.baselines`). The self-tuning score tunes nothing per task: the candidate runs
at its recipe's fixed step scale on every task, and each baseline runs at the one setting (schedule and learning
rate) that is best over the whole development suite. The two are compared per task, paired, with the suites'
statistics (`metafam.benchmark.report.paired_rows`).

**The best single setting** (`best_single_rate`). The shipped sweeps hold, per task and baseline, the selection
score of every swept rate under both schedules (``scores``: the seed-mean ``inner_valid`` loss over the last tenth of
the run, inf or null where the rate diverged; the quantity per-task tuning minimizes). A setting's *regret* on a task
is its score over the task's best score (the score of the task's tuned setting, so the tuned setting has regret 1).
The single setting minimizes the **geometric mean of the regrets over the suite's tasks**:

* it is the criterion of per-task tuning, summed over tasks in the only way that does not depend on how each task's
  loss is scaled: the geometric mean of ``score / best`` is the geometric mean of the scores over that of the
  bests, so any positive factor on one task's losses cancels, and the choice is that of the lowest mean log score;
* a setting twice as bad on one task and a setting twice as bad on another count alike, and one task with a large
  ratio does not outweigh the rest as in an arithmetic mean;
* a setting that diverged on any task has an infinite regret and is never chosen, so the chosen setting trains every
  task (the self-tuning rule asks one setting to work on all workloads); where no setting does, there is no choice
  (an error).

Exact ties go to the schedule listed first in `metafam.benchmark.baselines.SCHEDULES` (constant), then to the
smaller rate, as in per-task tuning. Candidate rates are those swept on every task (a grid extended at an edge on
some tasks contributes only its common rates); a rate passed explicitly must be in every task's sweep. The choice is
made on the development suite only (a test suite's data are refused) and then applied to any suite.

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

from metafam.benchmark import baselines as bl
from metafam.benchmark import heldout, report, suite_cache
from metafam.evaluation.scores import SuiteEvaluation, score_task, suite_evaluation

GRID_STEP = 0.5  # the baselines' grids are half a decade apart: one grid step in log10 of the rate
_RATE_RTOL = 1e-9  # rates of one grid computed on different machines differ by ulps


def _same_rate(a: float, b: float) -> bool:
  return math.isclose(a, b, rel_tol=_RATE_RTOL, abs_tol=0.0)


def _check_data(data: Any, argument: str = "data") -> Mapping[str, Any]:
  if not isinstance(data, Mapping) or not isinstance(data.get("tasks"), Mapping) or not data["tasks"]:
    raise ValueError(f"{argument} must be a suite's baselines dict (`load_normalizers`) with a non-empty 'tasks' "
                     f"mapping, got {type(data).__name__}.")
  return data


def _check_tasks(data: Mapping[str, Any], tasks: Optional[Sequence[str]]) -> List[str]:
  available = list(data["tasks"])
  if tasks is None:
    return available
  if isinstance(tasks, str):
    raise ValueError(f"tasks must be a sequence of task names, got the string {tasks!r}.")
  tasks = list(tasks)
  unknown = [t for t in tasks if t not in data["tasks"]]
  if unknown or not tasks or len(set(tasks)) != len(tasks):
    raise ValueError(f"tasks must be distinct tasks of the data, got {tasks} (unknown: {unknown}); available: "
                     f"{available}.")
  return tasks


@dataclasses.dataclass(frozen=True)
class SingleRate:
  """A baseline's best single setting over a suite (`best_single_rate`; the rule is the module docstring's).

  Attributes:
    optimizer: the baseline.
    schedule, learning_rate: the chosen setting.
    regret: its geometric-mean regret over the tasks (1: as good as tuning on every task).
    task_regrets: ``{task: regret}`` of the chosen setting.
    tuned: ``{task: (schedule, learning rate)}``, each task's tuned setting.
    candidates: ``((schedule, learning rate, regret), ...)``: every setting considered, schedules in the order of
      `metafam.benchmark.baselines.SCHEDULES`, rates ascending.
  """
  optimizer: str
  schedule: str
  learning_rate: float
  regret: float
  task_regrets: Dict[str, float]
  tuned: Dict[str, Tuple[str, float]]
  candidates: Tuple[Tuple[str, float, float], ...]

  def within_steps(self, steps: float = 1) -> List[str]:
    """The tasks whose tuned rate is at most ``steps`` grid steps (half decades) from the single rate."""
    if not isinstance(steps, (int, float)) or isinstance(steps, bool) or not steps >= 0:
      raise ValueError(f"steps must be a number >= 0, got {steps!r}.")
    return [t for t, (_, lr) in self.tuned.items()
            if abs(math.log10(self.learning_rate / lr)) <= GRID_STEP * steps + 1e-9]

  def retrained(self) -> List[str]:
    """The tasks whose tuned setting is not the single setting: there its curves must be trained."""
    return [t for t, (s, lr) in self.tuned.items() if s != self.schedule or not _same_rate(lr, self.learning_rate)]


def best_single_rate(data: Mapping[str, Any], optimizer: str, *, tasks: Optional[Sequence[str]] = None,
                     schedules: Optional[Sequence[str]] = None,
                     rates: Optional[Sequence[float]] = None) -> SingleRate:
  """The single (schedule, rate) of baseline ``optimizer`` with the lowest geometric-mean regret over ``tasks``.

  Args:
    data: a development suite's baselines (`metafam.benchmark.heldout.load_normalizers`, or a dict of that layout:
      ``data["tasks"][task]["baselines"][optimizer]`` with ``learning_rates``, ``scores`` per schedule, and the
      tuned ``schedule`` and ``learning_rate``).
    optimizer: a baseline of every task.
    tasks: the tasks to choose over (default all of the data's).
    schedules: the schedules the setting may use (default every schedule of the sweeps).
    rates: the rates it may use (default those swept on every task); each must be in every task's sweep.

  Raises ValueError naming the argument: data of a test suite or of another layout, an optimizer missing from a
  task, unknown tasks or schedules, a rate missing from a task's sweep, a task whose every setting diverged or whose
  best score is not positive (a regret is a ratio), no candidate rate, no candidate setting that trained every
  task without diverging.
  """
  data = _check_data(data)
  if data.get("suite", "heldout") == "test":
    raise ValueError("data: the single rate is chosen on the development suite (heldout) and only applied to the "
                     "test suite; pass the development suite's baselines.")
  tasks = _check_tasks(data, tasks)
  if not isinstance(optimizer, str):
    raise ValueError(f"optimizer must be a baseline's name, got {optimizer!r}.")
  sweeps = {}
  for t in tasks:
    entry = data["tasks"][t].get("baselines", {}).get(optimizer)
    if entry is None:
      raise ValueError(f"optimizer {optimizer!r} is not a baseline of task {t!r}; its baselines: "
                       f"{sorted(data['tasks'][t].get('baselines', {}))}.")
    try:
      lrs = np.asarray(entry["learning_rates"], np.float64)
      scores = {s: np.asarray([np.inf if v is None else v for v in vs], np.float64)
                for s, vs in entry["scores"].items()}
      tuned = (str(entry["schedule"]), float(entry["learning_rate"]))
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"data: task {t!r}, baseline {optimizer!r} lacks a sweep ({e!r}).") from None
    if lrs.ndim != 1 or not lrs.size or any(v.shape != lrs.shape for v in scores.values()):
      raise ValueError(f"data: task {t!r}, baseline {optimizer!r}: every schedule needs one score per swept rate.")
    sweeps[t] = (lrs, scores, tuned)
  swept = [s for s in bl.SCHEDULES if all(s in sc for _, sc, _ in sweeps.values())]
  if schedules is None:
    schedules = swept
  else:
    if isinstance(schedules, str):
      raise ValueError(f"schedules must be a sequence of schedule names, got the string {schedules!r}.")
    bad = [s for s in schedules if s not in swept]
    if bad or not schedules:
      raise ValueError(f"schedules must be a non-empty subset of the swept schedules {swept}, got "
                       f"{list(schedules)}.")
    schedules = [s for s in bl.SCHEDULES if s in schedules]
  if rates is None:
    first = sweeps[tasks[0]][0]
    candidates = sorted(float(r) for r in first
                        if all(any(_same_rate(r, x) for x in lrs) for lrs, _, _ in sweeps.values()))
    if not candidates:
      raise ValueError(f"rates: no rate of {optimizer!r} was swept on every task; pass rates explicitly.")
  else:
    candidates = sorted(float(r) for r in np.asarray(rates, np.float64).ravel())
    if not candidates or not all(np.isfinite(r) and r > 0 for r in candidates):
      raise ValueError(f"rates must be a non-empty sequence of finite positive numbers, got {rates!r}.")
    for t, (lrs, _, _) in sweeps.items():
      missing = [r for r in candidates if not any(_same_rate(r, x) for x in lrs)]
      if missing:
        raise ValueError(f"rates: {missing} not in the sweep of {optimizer!r} on task {t!r} (swept: "
                         f"{lrs.tolist()}).")
    # the swept values (a rate given an ulp away from a swept one is that rate)
    candidates = list(dict.fromkeys(float(next(x for x in sweeps[tasks[0]][0] if _same_rate(r, x)))
                                    for r in candidates))
  best = {}
  for t, (_, scores, _) in sweeps.items():
    finite = np.concatenate([v[np.isfinite(v)] for v in scores.values()])
    if not finite.size:
      raise ValueError(f"data: every setting of {optimizer!r} diverged on task {t!r}; no regret can be computed.")
    best[t] = float(finite.min())
    if best[t] <= 0:
      raise ValueError(f"data: the best score of {optimizer!r} on task {t!r} is {best[t]}, not positive; regrets are "
                       "ratios of positive scores.")
  table = []
  for s in schedules:
    for r in candidates:
      regrets = {}
      for t, (lrs, scores, _) in sweeps.items():
        i = next(i for i, x in enumerate(lrs) if _same_rate(r, x))
        regrets[t] = float(scores[s][i]) / best[t] if np.isfinite(scores[s][i]) else math.inf
      values = np.asarray(list(regrets.values()))
      # summed in sorted order, so that settings with the same regrets on permuted tasks tie exactly
      mean = float(np.exp(np.mean(np.sort(np.log(values))))) if np.all(np.isfinite(values)) else math.inf
      table.append((s, r, mean, regrets))
  # ties: the first schedule of SCHEDULES, then the smaller rate (the table's order; min keeps the first minimum)
  schedule, rate, regret, regrets = min(table, key=lambda row: row[2])
  if not math.isfinite(regret):
    raise ValueError(f"data: no setting of {optimizer!r} (schedules {list(schedules)}, rates {candidates}) trained "
                     f"every task of {tasks} without diverging.")
  return SingleRate(optimizer=optimizer, schedule=schedule, learning_rate=rate, regret=regret, task_regrets=regrets,
                    tuned={t: sweeps[t][2] for t in tasks},
                    candidates=tuple((s, r, m) for s, r, m, _ in table))


CHOICE_HEADERS = ["baseline", "schedule", "single rate", "geometric-mean regret", "tasks within 1 grid step",
                  "tasks to retrain"]


def choice_rows(choices: Mapping[str, SingleRate]) -> List[List[Any]]:
  """Per baseline: `CHOICE_HEADERS` (``"k / N"`` counts over the tasks of the choice)."""
  rows = []
  for name, c in choices.items():
    n = len(c.tuned)
    rows.append([name, c.schedule, f"{c.learning_rate:.3g}", f"{c.regret:.3f}", f"{len(c.within_steps(1))} / {n}",
                 f"{len(c.retrained())} / {n}"])
  return rows


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
  spec = bl.suite_spec(suite)
  data = heldout.suite_data(None if data is None else _check_data(data), suite)
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
      and _same_rate(float(tuned["learning_rate"]), learning_rate)):
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
  data = _check_data(data)
  if not isinstance(curves, Mapping) or not curves:
    raise ValueError(f"curves must be a non-empty mapping from task to seed curves, got {type(curves).__name__}.")
  _check_tasks(data, list(curves))
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
  spec = bl.suite_spec(suite)
  dev_data = heldout.load_normalizers(suite="heldout") if dev_data is None else _check_data(dev_data, "dev_data")
  data = heldout.load_normalizers(suite=suite) if data is None else _check_data(data)
  optimizers = list(spec.optimizers) if optimizers is None else list(optimizers)
  bad = [o for o in optimizers if o not in spec.all_optimizers]
  if bad or not optimizers:
    raise ValueError(f"optimizers must be baselines of the {suite} suite {list(spec.all_optimizers)}, got "
                     f"{optimizers}.")
  tasks = _check_tasks(data, tasks)
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
