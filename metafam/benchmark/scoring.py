"""One scoring path: a candidate and the shipped baselines of a suite in one pool, under either ruleset.

    from metafam.benchmark import score
    report = score(lambda lr: optax.contrib.schedule_free_adamw(lr, warmup_steps=20), suite="heldout",
                   tasks=["mnist_mlp_16x16_64_b32"])
    print(report.format())
    report = score("generalist_v2", suite="heldout", ruleset="self_tuning")     # its default rate, untuned
    report = score(None, suite="test")          # the shipped baselines alone: docs/results' tables

The two rulesets are AlgoPerf's:

* ``"external"`` (per-task tuning): every baseline at its shipped per-task tuned setting; the candidate tuned the
  same way when it is a factory (`metafam.benchmark.candidates`), else as it is.
* ``"self_tuning"``: one setting for the whole suite. A shipped baseline runs at its best single setting over the
  development suite (`metafam.benchmark.single_rate.best_single_rate`, the same choice for the dev and test suites),
  a pretrained optimizer at its default rate with a constant schedule, any other factory at ``learning_rate`` and
  the one entry of ``schedules``; a whole transformation, `Optimizer` or learned optimizer as it is.

The headline of every row is the **profile score** (`metafam.evaluation.scores.PROFILE_SCORE`): per task and seed,
the time ratio of the run to the fastest run of the pool that reached the same loss
(`metafam.evaluation.metrics.time_ratio`, at least 1, never capped), turned into its share of the performance profile
from ratio 1 to 4 (`profile_score`), averaged over tasks and seeds: AlgoPerf's score B of the pool, in [0, 1]. The pool
is the report's rows: the suite's baselines under the ruleset, the shipped pretrained optimizers when asked for
(``pretrained``), and the candidate. VeLO's speedup over tuned Adam (run to 4T) stays as a column.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from metafam.benchmark import baseline_files as bf
from metafam.benchmark import baselines as bl
from metafam.benchmark import heldout, report
from metafam.evaluation.scores import SuiteEvaluation, suite_evaluation

RULESETS = ("external", "self_tuning")


@dataclasses.dataclass(frozen=True)
class SuiteReport:
  """Everyone of one pool on one suite (module docstring).

  Attributes:
    suite, ruleset: where and under which rules.
    rows: ``{label: SuiteEvaluation}``, re-scored in one pool (`heldout.in_pool`): the baselines, then the
      pretrained optimizers asked for, then the candidate (if any).
    candidate: the candidate's label, or None.
    settings: ``{label: setting}`` of the rows run at one setting for the suite (self-tuning), else empty.
  """
  suite: str
  ruleset: str
  rows: Dict[str, SuiteEvaluation]
  candidate: Optional[str] = None
  settings: Dict[str, str] = dataclasses.field(default_factory=dict)

  @property
  def evaluation(self) -> Optional[SuiteEvaluation]:
    """The candidate's row (None without a candidate)."""
    return None if self.candidate is None else self.rows[self.candidate]

  def others(self) -> Dict[str, SuiteEvaluation]:
    """Every row but the candidate's."""
    return {k: v for k, v in self.rows.items() if k != self.candidate}

  def format(self) -> str:
    """With a candidate, `report.format_suite` of it against every other row; else the summary table of all."""
    head = f"ruleset: {self.ruleset}" + "".join(f"\n  {k} at {v}" for k, v in self.settings.items())
    if self.candidate is not None:
      return head + "\n" + report.format_suite(self.evaluation, self.others())
    rows = [report.summary_row(e) for e in self.rows.values()]
    note = report.few_tasks_note(list(self.rows.values()))
    return "\n".join([head, f"suite: {self.suite}", report.format_table(report.SUMMARY_HEADERS, rows)]
                     + (["", note] if note else []))

  def write(self, out_dir: str) -> List[str]:
    """`report.write_suite_report` of the candidate against the other rows (files named by the suite); without a
    candidate, the first row's report with the others beside it."""
    rows = list(self.rows.values())
    if self.candidate is not None:
      return report.write_suite_report(self.evaluation, out_dir, self.others())
    return report.write_suite_report(rows[0], out_dir, {e.name: e for e in rows[1:]})


def check_ruleset(ruleset: Any) -> str:
  if ruleset not in RULESETS:
    raise ValueError(f"ruleset must be one of {RULESETS}, got {ruleset!r}.")
  return ruleset


def _self_tuning_setting(candidate: Any, learning_rate: Optional[float],
                         schedules: Optional[Sequence[str]]) -> Optional[Dict[str, Any]]:
  """The one setting of a factory candidate under self-tuning, or None for a candidate that runs as it is."""
  from metafam.pretrained import PRETRAINED
  if isinstance(candidate, str) and candidate in PRETRAINED and learning_rate is None:
    learning_rate = PRETRAINED[candidate].default_learning_rate
  schedules = ("constant",) if schedules is None else tuple(schedules)
  if len(schedules) != 1:
    raise ValueError(f"the self-tuning ruleset runs one setting for every task: give one schedule, got {schedules}.")
  return {"learning_rate": learning_rate, "schedule": schedules[0]}


def score(candidate: Any = None, *, suite: Any = "heldout", ruleset: str = "external",
          tasks: Optional[Sequence[str]] = None, name: Optional[str] = None,
          schedules: Optional[Sequence[str]] = None, learning_rate: Optional[float] = None,
          pretrained: Sequence[str] = (), confirm_test: bool = False, data: Optional[Mapping[str, Any]] = None,
          horizon: Optional[int] = None, baselines: Optional[Sequence[str]] = None,
          num_seeds: Optional[int] = None, cache_dir: Optional[str] = None, progress: bool = True) -> SuiteReport:
  """Scores ``candidate`` (anything `metafam.benchmark.candidates.resolve` takes; None: the pool alone) with the
  suite's baselines under ``ruleset`` on ``tasks`` (default every task with shipped baselines), in one pool.

  ``suite``: ``"heldout"`` or ``"test"`` (shipped baselines), or any other tasks: a suite of
  `metafam.benchmark.suites` (``"tiny"``, ``"small"``, ``"full"``), a registered task name, a `Task`, or a list of
  names and Tasks. Their baselines (``baselines``, default ``("adam",)``; empty: none) are made first by the shipped
  suites' procedure at ``horizon`` steps (`metafam.benchmark.baseline_files.custom_data`, kept in
  ``<cache_dir>/baselines``, ``num_seeds`` seeds, default `metafam.benchmark.baselines.NUM_SEEDS`), then the
  candidate is scored against them exactly as on a shipped suite; only the external ruleset applies there.

  ``schedules``, ``learning_rate``: a factory's schedules to tune over (external) or its one setting (self-tuning).
  ``pretrained``: shipped pretrained optimizers (`metafam.pretrained`) to add to the pool, scored like a candidate
  under the same ruleset. ``cache_dir``: each trained run's curves, per row (``<cache_dir>/<label>/<task>.json``), so
  an interrupted report resumes. Everything is checked before anything trains.
  """
  data, tasks, runs, resolved = check(candidate, suite=suite, ruleset=ruleset, tasks=tasks, name=name,
                                      schedules=schedules, learning_rate=learning_rate, pretrained=pretrained,
                                      confirm_test=confirm_test, data=data, horizon=horizon, baselines=baselines,
                                      num_seeds=num_seeds)
  task_objects = None
  if data is None:  # a custom suite: its baselines first, by the shipped procedure
    task_objects = dict(tasks)
    data = bf.custom_data(tasks, horizon, ("adam",) if baselines is None else baselines, progress=progress,
                          num_seeds=bl.NUM_SEEDS if num_seeds is None else num_seeds,
                          shard_dir=None if cache_dir is None else os.path.join(cache_dir, "baselines"))
    suite, tasks = bf.CUSTOM, [n for n, _ in tasks]
  spec = bf.spec_of(suite, data)
  rows: Dict[str, SuiteEvaluation] = {}
  settings: Dict[str, str] = {}
  if ruleset == "external":
    shipped = heldout.baseline_evaluations(data)
    rows.update({k: _subset(v, tasks, data) for k, v in shipped.items() if any(t in v.curves for t in tasks)})
  else:
    from metafam.benchmark import self_tuning
    dev = heldout.load_normalizers(suite="heldout")  # the single settings are chosen on the dev suite
    optimizers = [o for o in spec.all_optimizers if all(o in data["tasks"][t]["baselines"] for t in tasks)
                  and all(o in e["baselines"] for e in dev["tasks"].values())]
    choices, evaluations = self_tuning.self_tuning_baselines(
        suite=suite, data=data, dev_data=dev, optimizers=optimizers, tasks=tasks, progress=progress,
        cache_dir=None if cache_dir is None else os.path.join(cache_dir, "single_rate_baselines"))
    rows.update(evaluations)
    settings.update({k: f"{c.schedule} lr={c.learning_rate:.3g}" for k, c in choices.items()})
  labels = []
  for (c, n), r in zip(runs, resolved):
    kwargs: Dict[str, Any] = dict(tasks=tasks, data=data, name=r.name, progress=progress, suite=suite,
                                  confirm_test=confirm_test, task_objects=task_objects,
                                  cache_dir=None if cache_dir is None else os.path.join(cache_dir, r.name))
    if ruleset == "self_tuning" and r.tuned:
      one = _one_setting(c, learning_rate if c is candidate else None, schedules if c is candidate else None)
      kwargs.update(one)
      settings[r.name] = f"{one['schedules'][0]} lr={one['learning_rates'][0]:.3g}"
    elif r.tuned:
      kwargs["schedules"] = schedules if c is candidate else None
    rows[r.name] = heldout.evaluate_suite(c, **kwargs)
    labels.append(r.name)
  rows = heldout.in_pool(rows, data, with_baselines=ruleset == "external")
  return SuiteReport(suite=suite, ruleset=ruleset, rows=rows,
                     candidate=labels[-1] if candidate is not None else None, settings=settings)


def check(candidate: Any = None, *, suite: str = "heldout", ruleset: str = "external",
          tasks: Optional[Sequence[str]] = None, name: Optional[str] = None,
          schedules: Optional[Sequence[str]] = None, learning_rate: Optional[float] = None,
          pretrained: Sequence[str] = (), confirm_test: bool = False, data: Optional[Mapping[str, Any]] = None,
          horizon: Optional[int] = None, baselines: Optional[Sequence[str]] = None,
          num_seeds: Optional[int] = None, names: Optional[Mapping[str, str]] = None):
  """Everything `score` checks before it trains (ValueError, one line): ``(data, tasks, [(candidate, name)],
  [resolved candidates])``; for a custom suite ``data`` is None and ``tasks`` are ``[(name, Task)]``. ``names``:
  what the messages call the arguments (the command line passes its flags, e.g. ``{"candidate": "--optimizer"}``)."""
  def n(argument: str) -> str:
    return (names or {}).get(argument, argument)

  from metafam._checks import check_number, check_positive_int
  from metafam.benchmark.candidates import resolve
  ruleset = check_ruleset(ruleset)
  shipped = isinstance(suite, str) and suite in bf.SUITE_SPECS
  if shipped:
    heldout.check_suite_choice(suite, confirm_test)
    if horizon is not None or baselines is not None or num_seeds is not None:
      raise ValueError(f"the {suite} suite fixes its horizons, seeds and baselines: drop horizon, num_seeds and "
                       "baselines.")
    data = heldout.suite_data(data, suite)
    spec = bf.suite_spec(suite)
    tasks = list(data["tasks"]) if tasks is None else list(tasks)
    unknown = [t for t in tasks if t not in data["tasks"]]
    if unknown or not tasks:
      raise ValueError(f"{n('tasks')}: {unknown or tasks} have no shipped baselines in the {suite} suite; available: "
                       f"{', '.join(data['tasks'])}.")
  else:
    from metafam.benchmark.suites import resolve_tasks
    if tasks is not None or data is not None or confirm_test:
      raise ValueError("tasks, data and confirm_test belong to the heldout and test suites; give the tasks as suite.")
    if ruleset != "external":
      raise ValueError("the self-tuning ruleset's single settings are chosen on the dev suite: it applies to the "
                       "heldout and test suites only.")
    if horizon is None:
      raise ValueError(f"{n('horizon')}: a suite without shipped baselines needs the run length (a multiple of "
                       f"{bl.EVALS_PER_RUN}).")
    horizon = check_positive_int(n("horizon"), horizon)
    if num_seeds is not None:
      check_positive_int(n("num_seeds"), num_seeds)
    if horizon % bl.EVALS_PER_RUN:
      raise ValueError(f"{n('horizon')} must be a multiple of {bl.EVALS_PER_RUN} (the runs are evaluated at every "
                       f"eighth of it), got {horizon}.")
    unknown = [b for b in (baselines or ()) if b not in bl.GRIDS]
    if unknown:
      raise ValueError(f"baselines {unknown} have no rate grid; valid: {', '.join(sorted(bl.GRIDS))}.")
    tasks = resolve_tasks(suite)
    spec = bf.SuiteSpec(bf.CUSTOM, {}, tuple(baselines or ()), "", "")
  if schedules is not None:
    schedules = tuple(schedules)
    bad = [x for x in schedules if x not in bl.SCHEDULES]
    if bad or not schedules:
      raise ValueError(f"{n('schedules')} must be a non-empty subset of {', '.join(bl.SCHEDULES)}, got "
                       f"{list(schedules)}.")
  if learning_rate is not None:
    check_number(n("learning_rate"), learning_rate, low=0.0, low_open=True)
    if ruleset != "self_tuning":
      raise ValueError(f"{n('learning_rate')} is the self-tuning ruleset's one setting; the external ruleset tunes "
                       "it.")
  runs: List[tuple] = [(p, None) for p in pretrained]
  if candidate is not None:
    runs.append((candidate, name))
  taken = spec.all_optimizers + tuple(pretrained)
  resolved = [resolve(c, label, baselines=spec.all_optimizers if c is not candidate else taken,  # all checked first
                      argument=n("candidate")) for c, label in runs]
  if ruleset == "self_tuning" and candidate is not None and resolved[-1].tuned:
    _self_tuning_setting(candidate, learning_rate, schedules)
    registered = isinstance(candidate, str) and (candidate in bl.GRIDS or _is_pretrained(candidate))
    if learning_rate is None and not registered:
      raise ValueError("the self-tuning ruleset runs a factory at one learning rate for every task: give "
                       f"{n('learning_rate')}.")
  return data, tasks, runs, resolved


def _is_pretrained(name: str) -> bool:
  from metafam.pretrained import PRETRAINED
  return name in PRETRAINED


def _one_setting(candidate: Any, learning_rate: Optional[float], schedules: Optional[Sequence[str]]
                 ) -> Dict[str, Any]:
  """`evaluate_suite` arguments that run a factory at one setting: a shipped baseline's best single dev setting, a
  pretrained optimizer's default rate, or ``learning_rate`` with the one schedule given."""
  if isinstance(candidate, str) and candidate in bl.GRIDS and learning_rate is None:
    from metafam.benchmark import single_rate
    choice = single_rate.best_single_rate(heldout.load_normalizers(suite="heldout"), candidate)
    return {"learning_rates": [choice.learning_rate], "schedules": [choice.schedule], "fixed_setting": True}
  setting = _self_tuning_setting(candidate, learning_rate, schedules)
  return {"learning_rates": [setting["learning_rate"]], "schedules": [setting["schedule"]], "fixed_setting": True}


def _subset(evaluation: SuiteEvaluation, tasks: Sequence[str], data: Mapping[str, Any]) -> SuiteEvaluation:
  """``evaluation`` restricted to ``tasks`` (aggregates recomputed)."""
  scores = [s for s in evaluation.scores if s.task in tasks]
  curves = {t: c for t, c in evaluation.curves.items() if t in tasks}
  return suite_evaluation(evaluation.name, scores, curves, evaluation.pending, evaluation.wall_time,
                             evaluation.suite, evaluation.evaluated_at)
