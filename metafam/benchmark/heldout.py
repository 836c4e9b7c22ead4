"""Scoring an optimizer on a suite with shipped tuned baselines: ``heldout`` (development) or ``test``.

    from metafam.benchmark import evaluate_suite
    result = evaluate_suite(optax.adam)              # a factory of the learning rate: tuned on the grid
    result = evaluate_suite((MLPLOpt(), "run/checkpoint.npz"))   # a learned optimizer with its theta
    print(metafam.benchmark.format_suite(result))

Only the candidate trains: the baselines' curves come from ``metafam/benchmark/data/heldout_baselines.json``
(`load_normalizers`; see `metafam.benchmark.baselines`). Each task trains the candidate on the suite's seeds and
keys (seed s starts where every baseline's seed s started) for the task's horizon T, evaluated at the same points.

Each task's seed curves are scored by the one engine, `metafam.evaluation.scores` (`score_task`: the time ratio
to the pool's fastest, VeLO's speedup over tuned Adam run to 4T, loss ratio and gains, rank; `aggregate_scores`
across tasks), which the module docstring there defines.
`baseline_evaluations` scores every shipped baseline the same way (rank among the others).

Dev and test: ``heldout`` is where design choices are made and may be run freely. ``test`` (`metafam.benchmark.suites`)
is scored once per shipped optimizer: `evaluate_suite` refuses it unless ``confirm_test=True``, and every
`SuiteEvaluation` records its suite and when it ran (UTC), as do the files `metafam.benchmark.report` writes.
A ``cache_dir`` keeps each finished task (`metafam.benchmark.suite_cache`), so an interrupted evaluation resumes and
`load_cached_evaluation` reads a finished one back without training. The tables, with the paired comparisons against
each baseline, are `metafam.benchmark.report.format_suite`'s.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import jax
import numpy as np
import optax

from metafam._checks import check_positive_int
from metafam.benchmark import baseline_files as bf
from metafam.benchmark import baselines as bl
from metafam.benchmark import suite_cache
from metafam.evaluation.metrics import normalize
from metafam.evaluation.scores import SuiteEvaluation, score_task, suite_evaluation, task_pool
from metafam.inner.step import auto_lane_chunk
from metafam.optimizers.base import Optimizer
from metafam.optimizers.learned import LearnedOptimizer

Candidate = Union[str, Optimizer, optax.GradientTransformation, Callable[..., optax.GradientTransformation],
                  Tuple[LearnedOptimizer, Any]]  # what `metafam.benchmark.candidates.resolve` accepts


class NormalizerFileError(ValueError):
  """The normalizer file is missing, malformed or of an unsupported format version."""


def suite_data(data: Optional[Mapping[str, Any]], suite: str) -> Mapping[str, Any]:
  """``data``, a suite's baselines (`load_normalizers`' layout; None: the shipped ones of ``suite``), checked to be
  ``suite``'s (a ValueError naming both suites otherwise; data without a ``suite`` field is the heldout suite's)."""
  if data is None:
    if suite == bf.CUSTOM:
      raise ValueError(f"the {bf.CUSTOM!r} suite's baselines are made by baseline_files.custom_data; pass them as "
                       "data.")
    return load_normalizers(suite=suite)
  if data.get("suite", "heldout") != suite:
    raise ValueError(f"data holds the {data.get('suite', 'heldout')!r} suite's baselines, not {suite!r}'s.")
  return data


def load_normalizers(path: Optional[str] = None, suite: str = "heldout") -> Dict[str, Any]:
  """The shipped baselines of ``suite`` (JSON; nothing in it is executed; ``path`` overrides the shipped file),
  checked for the format version and structure."""
  spec = bf.suite_spec(suite)
  path = spec.data_file if path is None else os.fspath(path)
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except FileNotFoundError:
    raise NormalizerFileError(f"no normalizer file at {path!r}; regenerate it with `{spec.command}`.") from None
  except (OSError, ValueError) as e:
    raise NormalizerFileError(f"normalizer file {path!r} cannot be read as JSON ({e}).") from None
  if not isinstance(data, dict) or data.get("format_version") != bf.FORMAT_VERSION:
    got = data.get("format_version") if isinstance(data, dict) else type(data).__name__
    raise NormalizerFileError(f"normalizer file {path!r} has format version {got!r}; this metafam reads "
                              f"version {bf.FORMAT_VERSION}.")
  if data.get("suite", "heldout") != suite:
    raise NormalizerFileError(f"normalizer file {path!r} holds the {data.get('suite')!r} suite, not {suite!r}.")
  for name, entry in data.get("tasks", {}).items():
    missing = [o for o in spec.optimizers if o not in entry.get("baselines", {})]
    if missing or "reference" not in entry:
      raise NormalizerFileError(f"normalizer file {path!r}: task {name!r} lacks baselines {missing or 'reference'}.")
  return data



def baseline_evaluations(data: Optional[Mapping[str, Any]] = None) -> Dict[str, SuiteEvaluation]:
  """Every shipped baseline scored as a candidate from its stored curves (ranked among the others)."""
  data = load_normalizers() if data is None else data
  suite = data.get("suite", "heldout")
  out = {}
  for opt in bf.spec_of(suite, data).all_optimizers:  # a baseline still in progress: on the tasks that have it
    scores, curves = [], {}
    for task, entry in data["tasks"].items():
      if opt not in entry["baselines"]:
        continue
      b = entry["baselines"][opt]
      seed_curves = np.asarray(b["test_curves"], np.float64)
      scores.append(score_task(task, entry, seed_curves, exclude=(opt,),
                               setting={"learning_rate": b["learning_rate"], "schedule": b["schedule"]}))
      curves[task] = (np.asarray(entry["eval_steps"]), seed_curves)
    if scores:
      out[opt] = suite_evaluation(opt, scores, curves, data.get("pending", ()), 0.0, suite)
  return out


def in_pool(evaluations: Mapping[str, SuiteEvaluation], data: Optional[Mapping[str, Any]] = None, *,
            with_baselines: bool = True) -> Dict[str, SuiteEvaluation]:
  """Each evaluation re-scored so that every time ratio of a task is measured against one pool: the curves of all
  ``evaluations`` on that task, plus the suite's shipped baselines (`task_pool`) unless ``with_baselines`` is False
  (the self-tuning ruleset: the pool is its single-setting runs). One table then compares everyone on equal terms,
  as AlgoPerf scores a pool of submissions; only the time ratios and the profile scores change."""
  if not evaluations:
    return {}
  suite = next(iter(evaluations.values())).suite
  data = suite_data(data, suite)
  out = {}
  for label, e in evaluations.items():
    scores = []
    for s in e.scores:
      entry = data["tasks"][s.task]
      pool = task_pool(entry) if with_baselines else {}
      pool.update({o.name: o.curves[s.task][1] for o in evaluations.values() if s.task in o.curves})
      exclude = (e.name,) if e.name in entry["baselines"] else ()
      scores.append(score_task(s.task, entry, e.curves[s.task][1], exclude=exclude, setting=s.setting, pool=pool))
    out[label] = suite_evaluation(e.name, scores, e.curves, e.pending, e.wall_time, e.suite, e.evaluated_at)
  return out


# -- running a candidate --------------------------------------------------------------------------------------------
def check_suite_choice(suite: str, confirm_test: Any, *, flags: bool = False,
                       data: Optional[Mapping[str, Any]] = None) -> None:
  """Raises ValueError unless ``suite`` is a suite of `metafam.benchmark.suites` and ``confirm_test`` is True exactly
  when it is ``"test"`` (the suite scored once per shipped optimizer, never used for design choices). Cheap: callers
  check before any work. ``flags``: name the arguments as the command line's ``--suite`` and ``--confirm_test``."""
  bf.spec_of(suite, data)
  name, test, yes = (("--confirm_test", "--suite test", "add --confirm_test") if flags else
                     ("confirm_test", "suite='test'", "pass confirm_test=True to run it"))
  if suite == "test" and confirm_test is not True:
    raise ValueError(f"{test} is the test split, scored once per shipped optimizer and never used for design choices: "
                     f"{yes} (or use {'--suite heldout' if flags else 'suite=' + repr('heldout')}, the development "
                     "suite).")
  if suite != "test" and confirm_test not in (False, None):
    raise ValueError(f"{name} only applies to {test}.")


def evaluate_suite(candidate: Candidate, *, tasks: Optional[Sequence[str]] = None,
                   data: Optional[Mapping[str, Any]] = None, name: Optional[str] = None,
                   learning_rates: Optional[Sequence[float]] = None, schedules: Optional[Sequence[str]] = None,
                   progress: bool = True, suite: str = "heldout", confirm_test: bool = False,
                   cache_dir: Optional[str] = None, cache_identity: Optional[Mapping[str, Any]] = None,
                   lane_chunk: Any = "auto", fixed_setting: bool = False,
                   task_objects: Optional[Mapping[str, Any]] = None) -> SuiteEvaluation:
  """Trains ``candidate`` on the suite's tasks that have shipped baselines and scores it (module docstring).

  Args:
    candidate: what `metafam.benchmark.candidates.resolve` accepts, checked before anything trains: a factory
      ``f(learning_rate: float) -> optax.GradientTransformation`` (any of its own arguments, warmups and betas), a
      `schedule_factory`, a registered name (``"ademamix"``, ``"generalist_v2"``) or ``"module:function"``, an optax
      transformation (untuned; ``name`` required), a metafam `Optimizer`, or ``(LearnedOptimizer, theta or checkpoint
      path)``. A factory's rate is tuned per task like the baselines' (`metafam.benchmark.baselines.tune_baseline`:
      same seeds, same selection on ``inner_valid``, grid extended at an edge) over ``learning_rates`` (default: a
      shipped baseline's own grid for its name, else Adam's 7-point grid) and ``schedules`` (default both of
      `metafam.benchmark.baselines.SCHEDULES`, as every baseline was tuned).
    tasks: a subset of the suite (default every task with shipped baselines).
    data: the normalizer file's dict (default `load_normalizers`).
    name: the label (default from the candidate; one that a baseline of the suite has gets " (candidate)").
    progress: a tqdm bar over tasks.
    suite: ``"heldout"`` (development, the default) or ``"test"``.
    confirm_test: must be True to score on ``test`` (and only there; `check_suite_choice`), the suite that is run
      once per shipped optimizer and never tuned on; the result records the suite and the time (``evaluated_at``).
    cache_dir: a directory keeping each finished task's curves (``<task>.json``, written atomically), so that an
      interrupted evaluation resumes where it stopped: a task whose file is there is read instead of trained. Each
      file records what produced it (suite, task and its evaluation points, label, the grid and schedules of a tuned
      candidate, a SHA-256 fingerprint of a learned optimizer's theta, plus ``cache_identity``); a file of another
      evaluation is refused with an error naming it, never overwritten.
    cache_identity: JSON-able facts about the candidate that its label does not pin down (e.g. the constructor
      arguments and checkpoint of a factory built around a learned optimizer); part of each cached task's identity.
    task_objects: ``{name: Task}`` for tasks that are not registered (a custom suite's, `baseline_files.custom_data`).
    fixed_setting: run a factory at its one given setting on every task (one rate in ``learning_rates``, one
      schedule; the grid is never extended): the self-tuning ruleset's candidate.
    lane_chunk: the candidate's lanes (rates x seeds) update in blocks of this many (`Runner`'s ``lane_chunk``: 1
      makes Newton-Schulz optimizers faster on a CPU); "auto": a learned optimizer's own ``lane_chunk``, a named
      baseline's `baselines.default_lane_chunk`, else None (one vmap). Only float rounding depends on it, so it is
      not part of a cached task's identity.
  """
  from tqdm.auto import tqdm
  from metafam.tasks.registry import get_task
  check_suite_choice(suite, confirm_test, data=data)
  data = suite_data(data, suite)
  spec = bf.spec_of(suite, data)
  from metafam.benchmark.candidates import resolve
  resolved = resolve(candidate, name, baselines=spec.all_optimizers)
  label, tuned = resolved.name, resolved.tuned
  opt = resolved.factory if tuned else resolved.optimizer
  registered = candidate if isinstance(candidate, str) and candidate in bl.GRIDS else None
  if isinstance(lane_chunk, str) and lane_chunk == "auto":
    if isinstance(opt, tuple):
      lane_chunk = auto_lane_chunk(getattr(opt[0], "lane_chunk", None), jax.default_backend())
    else:
      lane_chunk = bl.default_lane_chunk(registered) if registered else None
  chunk = None if lane_chunk is None else check_positive_int("lane_chunk", lane_chunk)
  schedules = tuple(bl.SCHEDULES if schedules is None else schedules)
  bad = [x for x in schedules if x not in bl.SCHEDULES]
  if bad or not schedules:
    raise ValueError(f"schedules must be a non-empty subset of {bl.SCHEDULES}, got {schedules}.")
  if not tuned:
    from metafam.benchmark.runner import resolve_optimizer
    opt = resolve_optimizer(opt)[1]
  if fixed_setting and (not tuned or learning_rates is None or len(learning_rates) != 1 or len(schedules) != 1):
    raise ValueError("fixed_setting runs a factory at one setting: give one rate in learning_rates and one schedule.")
  available = list(data["tasks"])
  tasks = available if tasks is None else list(tasks)
  unknown = [t for t in tasks if t not in data["tasks"]]
  if unknown or not tasks:
    raise ValueError(f"tasks {unknown or tasks} have no shipped baselines; available: {available}.")
  grid = (bl.grid(registered or bl.REFERENCE) if learning_rates is None
          else np.asarray(learning_rates, np.float64))
  if cache_dir is not None:
    cache_dir = os.fspath(cache_dir)
    if os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
      raise ValueError(f"cache_dir {cache_dir!r} exists and is not a directory.")
    identity = dict(suite=suite, label=label, tuned=tuned and not fixed_setting,
                    learning_rates=grid.tolist() if tuned else None,
                    schedules=list(schedules) if tuned else None,
                    theta=suite_cache.theta_fingerprint(resolved.optimizer),
                    extra=json.loads(json.dumps(cache_identity)) if cache_identity is not None else None)
    os.makedirs(cache_dir, exist_ok=True)
  scores, curves, seconds, trained_at = [], {}, 0.0, []
  for task_name in tqdm(tasks, desc=f"{suite}: {label}", unit="task", disable=not progress):
    entry = data["tasks"][task_name]
    steps = np.asarray(entry["eval_steps"], np.int32)

    def train(task_name=task_name, entry=entry, steps=steps):
      task = (task_objects or {}).get(task_name) or get_task(task_name)
      eval_batches = int(entry.get("eval_batches", spec.eval_batches(task)))
      num_seeds = _num_seeds(entry)
      if tuned:
        result = bl.tune_baseline(task, registered or label, int(entry["horizon"]), task_name=task_name, factory=opt,
                                  learning_rates=grid, schedules=schedules, eval_batches=eval_batches,
                                  num_seeds=num_seeds,
                                  lane_chunk=chunk, max_extensions=0 if fixed_setting else bl.MAX_EXTENSIONS)
        return np.asarray(result.test_curves, np.float64), {"learning_rate": float(result.learning_rate),
                                                            "schedule": result.schedule,
                                                            "at_edge": bool(result.at_edge)}
      from metafam.benchmark.sweep import train_lanes
      _, evals = train_lanes(task, opt, None, num_seeds=num_seeds, points=steps, eval_batches=eval_batches,
                             key=bl.task_key(task_name), splits=bl.SPLITS, name=label, lane_chunk=chunk)
      return normalize(task, evals["test"][0]), None

    path = None if cache_dir is None else os.path.join(cache_dir, f"{task_name}.json")
    seed_curves, setting, took, finished = suite_cache.cached_task(
        path, None if path is None else {**identity, "task": task_name, "eval_steps": steps.tolist()}, train)
    seconds += took
    trained_at.append(finished or suite_cache.utc_now())
    scores.append(score_task(task_name, entry, seed_curves, setting=setting))
    curves[task_name] = (steps, seed_curves)
  return suite_evaluation(label, scores, curves, data.get("pending", ()), seconds, suite, max(trained_at))


def _num_seeds(entry: Mapping[str, Any]) -> int:
  """The seeds of a task's runs: its reference's, else the entry's ``num_seeds``, else `baselines.NUM_SEEDS`."""
  if "reference" in entry:
    return len(entry["reference"]["test_curves"])
  return int(entry.get("num_seeds", bl.NUM_SEEDS))


def load_cached_evaluation(cache_dir: str, *, suite: str = "heldout", tasks: Optional[Sequence[str]] = None,
                           data: Optional[Mapping[str, Any]] = None,
                           name: Optional[str] = None) -> SuiteEvaluation:
  """The `SuiteEvaluation` an earlier `evaluate_suite` call left in ``cache_dir``, read without training anything:
  e.g. a shipped optimizer's test-suite run, to compare a new candidate with it seed by seed (`paired_rows`).

  Every task of ``tasks`` (default: every task of the suite with shipped baselines) must have its file there, written
  for ``suite`` at the suite's evaluation points; ``name`` defaults to the label the files record (they must agree).
  Reading the test suite's files is not a new test-suite run, so it needs no ``confirm_test``.
  """
  data = suite_data(data, suite)
  cache_dir = os.fspath(cache_dir)
  if not os.path.isdir(cache_dir):
    raise ValueError(f"cache_dir {cache_dir!r} is not a directory.")
  tasks = list(data["tasks"]) if tasks is None else list(tasks)
  unknown = [t for t in tasks if t not in data["tasks"]]
  if unknown or not tasks:
    raise ValueError(f"tasks {unknown or tasks} have no shipped baselines; available: {list(data['tasks'])}.")
  missing = [t for t in tasks if not os.path.isfile(os.path.join(cache_dir, f"{t}.json"))]
  if missing:
    raise ValueError(f"cache_dir {cache_dir!r} has no cached {suite!r} run of {missing}.")
  scores, curves, seconds, trained_at, labels = [], {}, 0.0, [], set()
  for task_name in tasks:
    path = os.path.join(cache_dir, f"{task_name}.json")
    identity, seed_curves, setting, took, finished = suite_cache.read_cached_task(path)
    steps = np.asarray(data["tasks"][task_name]["eval_steps"], np.int32)
    expected = {"suite": suite, "task": task_name, "eval_steps": steps.tolist()}
    differ = sorted(k for k, v in expected.items() if not suite_cache.same_identity(identity.get(k), v))
    if differ:
      raise ValueError(f"cache_dir: {path} is not this suite's run of {task_name} (it differs in {differ}).")
    labels.add(identity.get("label"))
    seconds += took
    trained_at.append(finished or "")
    scores.append(score_task(task_name, data["tasks"][task_name], seed_curves, setting=setting))
    curves[task_name] = (steps, seed_curves)
  if name is None and len(labels) != 1:
    raise ValueError(f"cache_dir {cache_dir!r} holds runs of several candidates ({sorted(map(str, labels))}); give "
                     "name.")
  return suite_evaluation(name or labels.pop(), scores, curves, data.get("pending", ()), seconds, suite, max(trained_at))
