"""The best single setting of a baseline over a suite: AlgoPerf's self-tuning rule applied to the shipped sweeps.

The shipped sweeps hold, per task and baseline, the selection score of every swept rate under both schedules
(``scores``: the seed-mean ``inner_valid`` loss over the last tenth of the run, inf or null where the rate diverged;
the quantity per-task tuning minimizes). A setting's *regret* on a task is its score over the task's best score (the
score of the task's tuned setting, so the tuned setting has regret 1). The single setting (`best_single_rate`)
minimizes the **geometric mean of the regrets over the suite's tasks**:

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

`SingleRate` is the choice; `choice_rows` (`CHOICE_HEADERS`) tabulates choices. Nothing here trains: the curves and
scores at the chosen setting are `metafam.benchmark.self_tuning`'s.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from metafam.benchmark import baselines as bl

GRID_STEP = 0.5  # the baselines' grids are half a decade apart: one grid step in log10 of the rate
_RATE_RTOL = 1e-9  # rates of one grid computed on different machines differ by ulps


def same_rate(a: float, b: float) -> bool:
  """Whether two swept rates are the same rate (equal up to a relative ``_RATE_RTOL``)."""
  return math.isclose(a, b, rel_tol=_RATE_RTOL, abs_tol=0.0)


def check_data(data: Any, argument: str = "data") -> Mapping[str, Any]:
  """``data`` if it is a suite's baselines dict with a non-empty ``tasks`` mapping; else ValueError naming
  ``argument``."""
  if not isinstance(data, Mapping) or not isinstance(data.get("tasks"), Mapping) or not data["tasks"]:
    raise ValueError(f"{argument} must be a suite's baselines dict (`load_normalizers`) with a non-empty 'tasks' "
                     f"mapping, got {type(data).__name__}.")
  return data


def check_tasks(data: Mapping[str, Any], tasks: Optional[Sequence[str]]) -> List[str]:
  """``tasks`` as a list of distinct tasks of ``data`` (default all of them); else ValueError."""
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
    return [t for t, (s, lr) in self.tuned.items() if s != self.schedule or not same_rate(lr, self.learning_rate)]


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
  data = check_data(data)
  if data.get("suite", "heldout") == "test":
    raise ValueError("data: the single rate is chosen on the development suite (heldout) and only applied to the "
                     "test suite; pass the development suite's baselines.")
  tasks = check_tasks(data, tasks)
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
                        if all(any(same_rate(r, x) for x in lrs) for lrs, _, _ in sweeps.values()))
    if not candidates:
      raise ValueError(f"rates: no rate of {optimizer!r} was swept on every task; pass rates explicitly.")
  else:
    candidates = sorted(float(r) for r in np.asarray(rates, np.float64).ravel())
    if not candidates or not all(np.isfinite(r) and r > 0 for r in candidates):
      raise ValueError(f"rates must be a non-empty sequence of finite positive numbers, got {rates!r}.")
    for t, (lrs, _, _) in sweeps.items():
      missing = [r for r in candidates if not any(same_rate(r, x) for x in lrs)]
      if missing:
        raise ValueError(f"rates: {missing} not in the sweep of {optimizer!r} on task {t!r} (swept: "
                         f"{lrs.tolist()}).")
    # the swept values (a rate given an ulp away from a swept one is that rate)
    candidates = list(dict.fromkeys(float(next(x for x in sweeps[tasks[0]][0] if same_rate(r, x)))
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
        i = next(i for i, x in enumerate(lrs) if same_rate(r, x))
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
