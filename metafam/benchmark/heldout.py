"""Scoring an optimizer on a suite with shipped tuned baselines: ``heldout`` (development) or ``test``.

    from metafam.benchmark import evaluate_suite
    result = evaluate_suite(optax.adam)              # a factory of the learning rate: tuned on the grid
    result = evaluate_suite((MLPLOpt(), "run/checkpoint.npz"))   # a learned optimizer with its theta
    print(format_suite(result))

Only the candidate trains: the baselines' curves come from ``metafam/benchmark/data/heldout_baselines.json``
(`load_normalizers`; see `metafam.benchmark.baselines`). Each task trains the candidate on the suite's seeds and
keys (seed s starts where every baseline's seed s started) for the task's horizon T, evaluated at the same points.

Each task's seed curves are scored by the one engine, `metafam.evaluation.scores` (`score_task`: the time ratio
to the pool's fastest, VeLO's speedup over tuned Adam run to 4T, loss ratio and gains, rank; `aggregate_scores`
across tasks), which the module docstring there defines.
`baseline_evaluations` scores every shipped baseline the same way (rank among the others).

Dev and test: ``heldout`` is where design choices are made and may be run freely. ``test`` (`metafam.benchmark.suites`)
is scored once per shipped optimizer: `evaluate_suite` refuses it unless ``confirm_test=True``, and every
`SuiteEvaluation` records its suite and when it ran (UTC), as do the files `write_suite_report` writes.
`format_suite` adds the paired comparisons of `metafam.benchmark.paired` against each baseline it is given:
P(candidate > baseline) and the IQM difference, each with its bootstrap interval, of the per-seed speedups and of the
per-seed loss gains.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import jax
import numpy as np
import optax

from metafam._checks import check_positive_int
from metafam.benchmark import baselines as bl
from metafam.benchmark import paired
from metafam.evaluation.metrics import PROFILE_MAX, Aggregate, normalize
from metafam.evaluation.scores import LOSS_GAIN_IQM, PROFILE_SCORE, SuiteEvaluation, score_task, suite_evaluation, task_pool
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
    if suite == bl.CUSTOM:
      raise ValueError(f"the {bl.CUSTOM!r} suite's baselines are made by baselines.custom_data; pass them as data.")
    return load_normalizers(suite=suite)
  if data.get("suite", "heldout") != suite:
    raise ValueError(f"data holds the {data.get('suite', 'heldout')!r} suite's baselines, not {suite!r}'s.")
  return data


def load_normalizers(path: Optional[str] = None, suite: str = "heldout") -> Dict[str, Any]:
  """The shipped baselines of ``suite`` (JSON; nothing in it is executed; ``path`` overrides the shipped file),
  checked for the format version and structure."""
  spec = bl.suite_spec(suite)
  path = spec.data_file if path is None else os.fspath(path)
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except FileNotFoundError:
    raise NormalizerFileError(f"no normalizer file at {path!r}; regenerate it with `{spec.command}`.") from None
  except (OSError, ValueError) as e:
    raise NormalizerFileError(f"normalizer file {path!r} cannot be read as JSON ({e}).") from None
  if not isinstance(data, dict) or data.get("format_version") != bl.FORMAT_VERSION:
    got = data.get("format_version") if isinstance(data, dict) else type(data).__name__
    raise NormalizerFileError(f"normalizer file {path!r} has format version {got!r}; this metafam reads "
                              f"version {bl.FORMAT_VERSION}.")
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
  for opt in bl.spec_of(suite, data).all_optimizers:  # a baseline still in progress: on the tasks that have it
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
  bl.spec_of(suite, data)
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
    task_objects: ``{name: Task}`` for tasks that are not registered (a custom suite's, `baselines.custom_data`).
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
  spec = bl.spec_of(suite, data)
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
                    schedules=list(schedules) if tuned else None, theta=_theta_fingerprint(resolved.optimizer),
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
    seed_curves, setting, took, finished = _cached_task(
        path, None if path is None else {**identity, "task": task_name, "eval_steps": steps.tolist()}, train)
    seconds += took
    trained_at.append(finished or _utc_now())
    scores.append(score_task(task_name, entry, seed_curves, setting=setting))
    curves[task_name] = (steps, seed_curves)
  return suite_evaluation(label, scores, curves, data.get("pending", ()), seconds, suite, max(trained_at))


def _num_seeds(entry: Mapping[str, Any]) -> int:
  """The seeds of a task's runs: its reference's, else the entry's ``num_seeds``, else `baselines.NUM_SEEDS`."""
  if "reference" in entry:
    return len(entry["reference"]["test_curves"])
  return int(entry.get("num_seeds", bl.NUM_SEEDS))


def _utc_now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _theta_fingerprint(candidate: Any) -> Optional[str]:
  """SHA-256 of a ``(learned optimizer, theta)`` candidate's meta-parameters (of the checkpoint file's bytes when
  theta is a path), with the learned optimizer's class; None for other candidates."""
  if not isinstance(candidate, tuple) or len(candidate) != 2:
    return None
  import hashlib
  lopt, theta = candidate
  digest = hashlib.sha256(type(lopt).__qualname__.encode())
  if isinstance(theta, (str, os.PathLike)):
    with open(theta, "rb") as f:
      digest.update(f.read())
  else:
    import jax
    for path, leaf in jax.tree_util.tree_flatten_with_path(theta)[0]:
      leaf = np.asarray(leaf)
      digest.update(f"{jax.tree_util.keystr(path)}:{leaf.dtype}:{leaf.shape}".encode())
      digest.update(np.ascontiguousarray(leaf).tobytes())
  return digest.hexdigest()


# A rate grid such as 10 ** (k / 2) comes out an ulp apart on CPUs whose libm rounds differently (seen: AVX2 and
# AVX-512 machines, 0.0316227766016838 against 0.03162277660168379), so a cache file moved between machines must still
# match; any real change of a setting moves a number by far more than this relative tolerance.
_IDENTITY_RTOL = 1e-12


def _same_identity(a: Any, b: Any) -> bool:
  """Whether two JSON-like identities are equal, floats up to `_IDENTITY_RTOL` (everything else exactly)."""
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_same_identity(a[k], b[k]) for k in a)
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return len(a) == len(b) and all(_same_identity(x, y) for x, y in zip(a, b))
  if isinstance(a, float) or isinstance(b, float):
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return numbers and math.isclose(a, b, rel_tol=_IDENTITY_RTOL, abs_tol=0.0)
  return a == b


def _read_cached_task(path: str) -> Tuple[Dict[str, Any], np.ndarray, Any, float, Optional[str]]:
  """``(identity, seed curves, setting, seconds, trained_at)`` of one file `evaluate_suite` wrote to a cache_dir."""
  try:
    with open(path) as f:
      record = json.load(f)
    stored = record["identity"]
    seed_curves = np.asarray([[np.nan if v is None else v for v in row] for row in record["curves"]], np.float64)
    setting, seconds, finished = record["setting"], float(record["seconds"]), record.get("trained_at")
    if not isinstance(stored, dict):
      raise TypeError("its identity is not an object")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"cache_dir: {path} is not a cached task of evaluate_suite ({e}); remove it to retrain the "
                     "task.") from None
  return stored, seed_curves, setting, seconds, finished


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
    identity, seed_curves, setting, took, finished = _read_cached_task(path)
    steps = np.asarray(data["tasks"][task_name]["eval_steps"], np.int32)
    expected = {"suite": suite, "task": task_name, "eval_steps": steps.tolist()}
    differ = sorted(k for k, v in expected.items() if not _same_identity(identity.get(k), v))
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


def _cached_task(path: Optional[str], identity: Optional[Dict[str, Any]],
                 train: Callable[[], Tuple[np.ndarray, Any]]) -> Tuple[np.ndarray, Any, float, Optional[str]]:
  """``(seed curves, setting, seconds it took to train, when it finished training (UTC; None if the cached file
  predates that record))`` of one task: read from ``path`` when that file was written by the same evaluation
  (``identity``), else trained (and written there unless ``path`` is None)."""
  from metafam.io import write_json
  if path is not None and os.path.exists(path):
    stored, seed_curves, setting, seconds, finished = _read_cached_task(path)
    if not _same_identity(stored, identity):
      differ = sorted(k for k in set(stored) | set(identity) if not _same_identity(stored.get(k), identity.get(k)))
      raise ValueError(f"cache_dir: {path} was written by another evaluation (it differs in {differ}); use another "
                       "cache directory for this candidate or setting.")
    return seed_curves, setting, seconds, finished
  start = time.perf_counter()
  seed_curves, setting = train()
  seconds, finished = time.perf_counter() - start, _utc_now()
  if path is None:
    return np.asarray(seed_curves, np.float64), setting, seconds, finished
  rows = [[float(v) if np.isfinite(v) else None for v in row] for row in np.asarray(seed_curves, np.float64)]
  write_json(path, {"identity": identity, "curves": rows, "setting": setting, "seconds": seconds,
                    "trained_at": finished})
  return np.asarray(seed_curves, np.float64), setting, seconds, finished


# -- tables and figures ---------------------------------------------------------------------------------------------
def _interval(a: Aggregate) -> str:
  return f"{a.value:.2f} [{a.low:.2f}, {a.high:.2f}]"


def summary_row(evaluation: SuiteEvaluation) -> List[Any]:
  """``[name, profile score, median, IQM, optimality gap of the speedups, IQM of the loss gains (with intervals),
  tasks, diverged]``."""
  a = evaluation.aggregates
  return [evaluation.name, _interval(a[PROFILE_SCORE]), _interval(a["median"]), _interval(a["iqm"]),
          _interval(a["optimality_gap"]), _interval(a[LOSS_GAIN_IQM]), len(evaluation.scores),
          evaluation.num_diverged]


SUMMARY_HEADERS = ["optimizer", "profile score [95% CI]", "median speedup [95% CI]", "IQM speedup [95% CI]",
                   "optimality gap [95% CI]", "IQM loss gain [95% CI]", "tasks", "diverged"]
TASK_HEADERS = ["task", "T", "final loss", "time ratio", "speedup", "capped", "loss ratio", "loss gain", "rank",
                "diverged", "setting"]


def task_rows(evaluation: SuiteEvaluation) -> List[List[Any]]:
  """Per task: `TASK_HEADERS` (the normalized final loss, time ratio and speedup of the seed-mean curve; the loss
  gain is `TaskScore.loss_gain`, the seeds' mean)."""
  rows = []
  for s in evaluation.scores:
    setting = "-" if s.setting is None else f"{s.setting['schedule']} lr={s.setting['learning_rate']:.3g}"
    rows.append([s.task, s.horizon, s.final_loss, s.time_ratio, s.speedup, s.speedup_capped, s.loss_ratio, s.loss_gain,
                 f"{s.rank}/{s.num_ranked}", s.diverged, setting])
  return rows


PAIRED_HEADERS = ["baseline", "P(higher profile score) [95% CI]", "profile-score difference [95% CI]",
                  "P(candidate > baseline) [95% CI]", "IQM difference [95% CI]",
                  "P(lower loss) [95% CI]", "IQM loss-gain difference [95% CI]", "tasks"]


def paired_rows(evaluation: SuiteEvaluation, baselines: Mapping[str, SuiteEvaluation]) -> List[List[Any]]:
  """Per baseline: `metafam.benchmark.paired.probability_of_improvement` and the paired `difference` (mean) of the
  candidate's per-seed profile scores against the baseline's, then the same (IQM difference) of the per-seed
  speedups and of the per-seed loss gains, on the tasks both were scored on. ``tasks`` counts the tasks of the
  profile scores' comparison."""
  rows = []
  for b in baselines.values():
    if b is evaluation:
      continue
    common = [s.task for s in evaluation.scores if s.task in {t.task for t in b.scores}]
    row, tasks = [b.name], []
    for scores, statistic in ((SuiteEvaluation.seed_profile_scores, "mean"), (SuiteEvaluation.seed_speedups, "iqm"),
                              (SuiteEvaluation.seed_loss_gains, "iqm")):
      a_scores, b_scores = scores(evaluation, common), scores(b, common)
      p = paired.probability_of_improvement(a_scores, b_scores)
      d = paired.difference(a_scores, b_scores, statistic)
      row += [f"{p.value:.2f} [{p.low:.2f}, {p.high:.2f}]", f"{d.value:+.2f} [{d.low:+.2f}, {d.high:+.2f}]"]
      tasks.append(p.num_tasks)
    rows.append(row + [tasks[0]])
  return rows


FEW_TASKS = 5  # below this many tasks, tables show the per-seed values beside the aggregates


def few_tasks_note(evaluations: Sequence[SuiteEvaluation]) -> str:
  """For aggregates over fewer than `FEW_TASKS` tasks: each optimizer's per-seed time ratios and speedups, and what
  an interval over that few means; empty otherwise."""
  evaluations = [e for e in evaluations if 0 < len(e.scores) < FEW_TASKS]
  if not evaluations:
    return ""
  n = len(evaluations[0].scores)
  lines = [f"Over {n} task{'s' if n > 1 else ''}, an aggregate is mostly seed noise: its interval resamples only "
           "the seeds of each task and says nothing of other tasks, and the pooled per-seed values need not match "
           "the table's value of the seed-mean curve. Per seed (time ratio / speedup):"]
  for e in evaluations:
    for s in e.scores:
      per_seed = ", ".join(f"{r:.2f} / {v:.2f}" for r, v in zip(s.seed_time_ratios, s.seed_speedups))
      lines.append(f"  {e.name} on {s.task}: {per_seed}")
  return "\n".join(lines)


def format_suite(evaluation: SuiteEvaluation, baselines: Optional[Mapping[str, SuiteEvaluation]] = None) -> str:
  """Per-task table, the summary of the candidate (and of the baselines, if given), the paired comparisons with each
  baseline, then the win fractions."""
  from metafam.benchmark.report import format_table
  head = f"suite: {evaluation.suite}" + (f", evaluated {evaluation.evaluated_at}" if evaluation.evaluated_at else "")
  parts = [head, format_table(TASK_HEADERS, task_rows(evaluation)), ""]
  rows = [summary_row(evaluation)] + [summary_row(b) for b in (baselines or {}).values()]
  parts += [format_table(SUMMARY_HEADERS, rows), ""]
  if baselines:
    parts += [format_table(PAIRED_HEADERS, paired_rows(evaluation, baselines)), ""]
  parts.append(format_table(["baseline", f"{evaluation.name} beats it on"],
                            [[o, f"{w:.0%} of tasks"] for o, w in evaluation.win_fraction.items()]))
  note = few_tasks_note([evaluation, *(baselines or {}).values()])
  if note:
    parts += ["", note]
  if evaluation.pending:
    parts.append(f"\nnot evaluated (no shipped baselines yet): {', '.join(evaluation.pending)}")
  return "\n".join(parts)


def write_suite_report(evaluation: SuiteEvaluation, out_dir: str,
                       baselines: Optional[Mapping[str, SuiteEvaluation]] = None) -> List[str]:
  """``<suite>.json`` and ``<suite>_tasks.csv`` (atomic; the JSON records the suite, when the candidate ran and the
  paired comparisons), plus ``profile.png`` (performance profiles: fraction of tasks with speedup at least x, per
  optimizer) and ``<suite>_curves.png`` (per-task mean test curves of the candidate and every baseline) when
  matplotlib is importable. Returns the paths written."""
  from metafam.benchmark.report import table_csv
  from metafam.io import atomic_write, write_json
  os.makedirs(out_dir, exist_ok=True)
  label = evaluation.name if evaluation.name not in (baselines or {}) else f"{evaluation.name} (candidate)"
  everyone = {label: evaluation, **(baselines or {})}  # a candidate named like a baseline keeps both rows
  paired_table = [dict(zip(PAIRED_HEADERS, row)) for row in paired_rows(evaluation, baselines or {})]
  record = {"candidate": label, "suite": evaluation.suite, "evaluated_at": evaluation.evaluated_at,
            "wall_time": evaluation.wall_time, "pending": list(evaluation.pending), "paired": paired_table,
            "summary": {name: {k: dataclasses.asdict(a) for k, a in e.aggregates.items()}
                        for name, e in everyone.items()},
            "win_fraction": evaluation.win_fraction, "num_diverged": evaluation.num_diverged,
            "tasks": [dataclasses.asdict(s) for s in evaluation.scores]}
  suite = evaluation.suite
  paths = [os.path.join(out_dir, f"{suite}.json"), os.path.join(out_dir, f"{suite}_tasks.csv")]
  write_json(paths[0], json.loads(json.dumps(record, default=float)))
  atomic_write(paths[1], table_csv(TASK_HEADERS, task_rows(evaluation)).encode())
  try:  # the object-oriented API without pyplot: no global figure registry, no process-wide backend switch
    from matplotlib.figure import Figure
  except ImportError:
    return paths
  from metafam.io import save_figure
  thresholds = np.linspace(1.0, PROFILE_MAX, 61)
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  for e in everyone.values():
    ratios = np.array([s.time_ratio for s in e.scores], np.float64)
    ax.step(thresholds, np.mean(ratios[None, :] <= thresholds[:, None], axis=1), where="post",
            label=e.name, linewidth=2.5 if e is evaluation else 1.0)
  ax.set(xlabel="time ratio to the pool's fastest, at most", ylabel="fraction of tasks", ylim=(0, 1.02),
         xlim=(1.0, PROFILE_MAX))
  ax.legend(fontsize=7)
  save_figure(fig, os.path.join(out_dir, "profile.png"))
  names = list(evaluation.curves)
  cols = 4
  fig = Figure(figsize=(4 * cols, 3 * ((len(names) + 3) // 4)))
  axes = fig.subplots((len(names) + cols - 1) // cols, cols, squeeze=False)
  for ax, task in zip(axes.ravel(), names):
    for e in everyone.values():
      if task in e.curves:
        steps, c = e.curves[task]
        ax.plot(steps, np.mean(c, axis=0), label=e.name, linewidth=2.5 if e is evaluation else 1.0)
    ax.set_title(task, fontsize=7)
    ax.set_yscale("log")
  for ax in axes.ravel()[len(names):]:
    ax.axis("off")
  axes.ravel()[0].legend(fontsize=6)
  save_figure(fig, os.path.join(out_dir, f"{suite}_curves.png"))
  return paths + [os.path.join(out_dir, "profile.png"), os.path.join(out_dir, f"{suite}_curves.png")]
