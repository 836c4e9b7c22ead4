"""Tuned hand-designed baselines of the ``heldout`` suite: the tuning procedure, its shards and the shipped file.

Procedure, per task (horizon T from `metafam.benchmark.suites.HORIZONS`) and per optimizer of
`metafam.optimizers.optax_zoo.OPTAX_FACTORIES` (`tune_baseline`):

* the learning rate runs over a log grid of ``NUM_RATES`` = 7 points, half a decade apart, centred per optimizer
  (`GRIDS`), each with ``NUM_SEEDS`` = 3 seeds and both schedules of `SCHEDULES` (constant; linear warmup over the
  first 5% of T then cosine decay to 0 at T), all 42 lanes in one vmapped program (`scheduled` makes the schedule a
  per-lane number, so one compiled program serves both);
* `metafam.evaluation.tuning.tune`, the procedure of every tuned baseline, does the rest: each schedule's rate is
  chosen by `metafam.evaluation.tuning.select_best` on ``inner_valid`` at T (a rate whose training or validation
  loss is non-finite at any step is never chosen); while a schedule's best rate is at an end of the grid, the grid
  grows by two more rates beyond that end (at most ``MAX_EXTENSIONS`` times), so the shipped choice is interior
  unless flagged ``at_edge``;
* the schedule with the lower score is kept (ties: constant); its seed curves of the normalized ``test`` loss at
  the eval points (every T / ``EVALS_PER_RUN`` steps) are recorded.

The speedup reference (`reference_run`): Adam with its tuned *constant* rate, continued to ``REFERENCE_FACTOR`` * T
= 4T, so speedups up to ``REFERENCE_FACTOR`` are resolved (its curve up to T is the tuned constant-rate Adam run
itself).

Every run of a task uses the key ``fold_in(key(0), crc32(task name))`` (custom suites too, `custom_data`), so
seed s of every optimizer, the candidate included, starts from the same initialization and sees the same batches.

`generate` writes one JSON shard per (task, optimizer) and skips shards that exist (resumable); `collect` gathers
the tasks whose shards are all present into the versioned file ``metafam/benchmark/data/heldout_baselines.json``
(`load_normalizers` reads it; nothing in it is executed). Command: ``python benchmarks/heldout_baselines.py``.

The same procedure serves every suite with shipped baselines; a `SuiteSpec` says what differs (`SUITE_SPECS`):
``heldout`` (the development suite: nine baselines, 2 evaluation batches per point) and ``test`` (the test suite,
evaluated once per shipped optimizer: Adam, AdamW, NAdamW and Muon, and at least ``TEST_EVAL_EXAMPLES`` examples per
split and evaluation point, so the per-point noise is small against the differences reported; see
``docs/guide/evaluation.md``). Its file is ``metafam/benchmark/data/test_baselines.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import time
import zlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np
import optax

from metafam.benchmark.candidates import schedule_factory
from metafam.benchmark.suites import HORIZONS, TEST_HORIZONS
from metafam.benchmark.sweep import TUNABLE, train_lanes
from metafam.evaluation import tuning
from metafam.evaluation.metrics import normalize
from metafam.evaluation.scores import REFERENCE, REFERENCE_FACTOR
from metafam.io import write_json
from metafam.optimizers import newton_schulz
from metafam.optimizers.optax_zoo import OPTAX_FACTORIES
from metafam.tasks.base import Task

FORMAT_VERSION = 1
SCHEDULES = ("constant", "warmup_cosine")
WARMUP_FRACTION = 0.05
NUM_RATES = 7
NUM_SEEDS = 3
EVALS_PER_RUN = 8
EVAL_BATCHES = 2
MAX_EXTENSIONS = 3
NEWTON_SCHULZ = ("muon",)  # baselines whose update is dominated by the Newton-Schulz iteration
SPLITS = ("inner_valid", "test")
TAIL_FRACTION = 0.1
COMMAND = "python benchmarks/heldout_baselines.py --shard_dir experiments/results/heldout_shards"
DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "heldout_baselines.json")
TEST_EVAL_EXAMPLES = 2048

# Per optimizer, the lowest rate of its 7-point grid (then x sqrt(10) per point, 3 decades in all).
GRIDS: Dict[str, float] = {
    "adam": 1e-4, "adamw": 1e-4, "nadamw": 1e-4, "rmsprop": 1e-4, "schedule_free_adamw": 1e-4,
    "lion": 1e-5, "sgd_nesterov": 1e-3, "adafactor": 1e-3, "muon": 1e-3, "ademamix": 1e-4,
    "sgdm": 1e-3, "sgd": 1e-3,  # tuned baselines of custom suites (`custom_data`)
}


@dataclasses.dataclass(frozen=True)
class SuiteSpec:
  """What a suite's shipped baselines are made of (the procedure itself is the module docstring's).

  Attributes:
    name: the suite (`metafam.benchmark.suites.SUITES` key).
    horizons: ``{task: T}`` in generation order.
    optimizers: the tuned baselines (names of `OPTAX_FACTORIES`; ``REFERENCE`` first).
    data_file: the shipped file.
    command: how to regenerate it.
    eval_examples: examples per split and evaluation point (rounded up to whole batches); None: ``EVAL_BATCHES``
      batches whatever the batch size.
    in_progress: baselines still being generated, shard by shard across sessions: a task's entry carries those
      whose shards exist, and a task is complete without them (they join ``optimizers`` once every task has them).
  """
  name: str
  horizons: Mapping[str, int]
  optimizers: Tuple[str, ...]
  data_file: str
  command: str
  eval_examples: Optional[int] = None
  in_progress: Tuple[str, ...] = ()

  @property
  def all_optimizers(self) -> Tuple[str, ...]:
    """``optimizers`` then ``in_progress``."""
    return self.optimizers + self.in_progress

  def eval_batches(self, task: Task) -> int:
    """Batches averaged per split and evaluation point on ``task``."""
    if self.eval_examples is None:
      return EVAL_BATCHES
    if task.datasets is None:  # a data-free task: its loss does not depend on a batch
      return 1
    batch = jax.tree.leaves(task.datasets.abstract_batch)[0].shape[0]
    return max(1, math.ceil(self.eval_examples / batch))


SUITE_SPECS: Dict[str, SuiteSpec] = {
    "heldout": SuiteSpec("heldout", HORIZONS, ("adam", "adamw", "nadamw", "sgd_nesterov", "rmsprop", "lion",
                                               "adafactor", "muon", "schedule_free_adamw", "ademamix"), DATA_FILE,
                         COMMAND),
    "test": SuiteSpec("test", TEST_HORIZONS, ("adam", "adamw", "nadamw", "muon", "schedule_free_adamw", "ademamix"),
                      os.path.join(os.path.dirname(__file__), "data", "test_baselines.json"),
                      "python benchmarks/heldout_baselines.py --suite test --shard_dir test_shards",
                      eval_examples=TEST_EVAL_EXAMPLES),
}


def suite_spec(suite: str) -> SuiteSpec:
  """The `SuiteSpec` of ``suite``; `UnknownNameError` listing the suites with shipped baselines."""
  from metafam._registry import lookup
  return lookup(SUITE_SPECS, suite, "suite with shipped baselines")


def grid(name: str, num: int = NUM_RATES) -> np.ndarray:
  """``f64[num]``: the rate grid of baseline ``name``, half a decade apart from ``GRIDS[name]``."""
  return GRIDS[name] * 10.0 ** (0.5 * np.arange(num))


def task_key(name: str, seed: int = 0) -> jax.Array:
  """The key of every run on task ``name``: ``fold_in(key(seed), crc32(name))`` (independent of suite order)."""
  return jax.random.fold_in(jax.random.key(seed), zlib.crc32(name.encode()) & 0x7FFFFFFF)


def eval_steps(horizon: int, factor: int = 1) -> np.ndarray:
  """``i32[E]``: 0, T / 8, 2T / 8, ..., factor * T (T = ``horizon``, a multiple of ``EVALS_PER_RUN``)."""
  if horizon % EVALS_PER_RUN:
    raise ValueError(f"horizon must be a multiple of {EVALS_PER_RUN}, got {horizon}.")
  return np.arange(0, factor * horizon + 1, horizon // EVALS_PER_RUN, dtype=np.int32)


def unit_schedule(count: jax.Array, cosine: jax.Array, horizon: int) -> jax.Array:
  """The learning-rate multiplier at step ``count``: 1 if ``cosine == 0``; if ``cosine == 1``, linear warmup from 0
  over ``WARMUP_FRACTION * horizon`` steps, then cosine decay to 0 at ``horizon`` (``optax.warmup_cosine_decay``)."""
  warmup = max(1, int(round(WARMUP_FRACTION * horizon)))
  decayed = optax.warmup_cosine_decay_schedule(0.0, 1.0, warmup, horizon, 0.0)(count)
  return cosine * decayed + (1.0 - cosine)


def scheduled(factory: Callable[..., optax.GradientTransformation], horizon: int
              ) -> Callable[..., optax.GradientTransformation]:
  """``(learning_rate, cosine) -> factory's transformation at count -> learning_rate * unit_schedule(count, cosine,
  horizon)`` (`metafam.benchmark.candidates.at_schedule`: a factory of a float gets each step's rate as a number, a
  `schedule_factory` the schedule itself).

  Both arguments are numbers that ``optax.inject_hyperparams`` can hold per lane; ``cosine`` is 0 (constant) or 1
  (warmup + cosine), so one compiled program trains both schedules. A factory with a ``num_steps`` argument (an
  optimizer whose rule depends on the run's length, e.g. a learned schedule) is also given ``num_steps=horizon``.
  """
  from metafam.benchmark.candidates import at_schedule

  def make(learning_rate, cosine):
    return at_schedule(factory, lambda count: learning_rate * unit_schedule(count, cosine, horizon), horizon)
  return make


@dataclasses.dataclass(frozen=True)
class TunedBaseline:
  """One optimizer tuned on one task (see the module docstring).

  Attributes:
    task, optimizer: names.
    horizon: T.
    schedule: the kept schedule (an entry of `SCHEDULES`).
    learning_rate: the chosen rate (NaN if every lane diverged).
    learning_rates: ``[L]`` the final grid (7 plus any extensions), ascending.
    scores: ``{schedule: [L]}`` selection scores (inf: diverged).
    at_edge: the kept schedule's rate is an end of the final grid.
    eval_steps: ``[E]``.
    test_curves: ``[S, E]`` normalized test loss per seed of the chosen setting.
    wall_time: seconds, compilation included.
  """
  task: str
  optimizer: str
  horizon: int
  schedule: str
  learning_rate: float
  learning_rates: Tuple[float, ...]
  scores: Dict[str, Tuple[float, ...]]
  at_edge: bool
  eval_steps: Tuple[int, ...]
  test_curves: Tuple[Tuple[float, ...], ...]
  wall_time: float

  def to_json(self) -> Dict[str, Any]:
    d = dataclasses.asdict(self)
    d["scores"] = {k: [None if not np.isfinite(v) else v for v in vs] for k, vs in self.scores.items()}
    return d

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "TunedBaseline":
    d = dict(d)
    d["scores"] = {k: tuple(float("inf") if v is None else float(v) for v in vs) for k, vs in d["scores"].items()}
    d["learning_rates"] = tuple(d["learning_rates"])
    d["eval_steps"] = tuple(d["eval_steps"])
    d["test_curves"] = tuple(tuple(c) for c in d["test_curves"])
    return cls(**d)


def default_lane_chunk(name: str) -> Optional[int]:
  """The block size of a baseline's vmapped updates: `newton_schulz.lane_chunk` for Muon (one lane at a time on a
  CPU), else None (one vmap). Only float rounding depends on it."""
  return newton_schulz.lane_chunk() if name in NEWTON_SCHULZ else None


def _trainer(task: Task, factory, horizon: int, key: jax.Array, name: str, num_seeds: int, eval_batches: int,
             lane_chunk: Optional[int]) -> tuning.Trainer:
  """The engine of `tune_baseline` (`metafam.evaluation.tuning.tune`): every (schedule, rate) x seed lane in one
  vmapped program, the schedule a per-lane number (`scheduled`), updates in blocks of ``lane_chunk``."""

  def train(lrs: np.ndarray, schedules) -> Dict[str, tuning.Lanes]:
    cosine = np.repeat([float(SCHEDULES.index(s)) for s in schedules], len(lrs))
    losses, evals = train_lanes(task, scheduled(factory, horizon),
                                {"learning_rate": np.tile(lrs, len(schedules)), "cosine": cosine},
                                num_seeds=num_seeds, points=eval_steps(horizon), eval_batches=eval_batches, key=key,
                                splits=SPLITS, name=name, lane_chunk=lane_chunk)
    n = len(lrs)
    return {s: tuning.Lanes({k: v[i * n:(i + 1) * n] for k, v in evals.items()}, losses[i * n:(i + 1) * n])
            for i, s in enumerate(schedules)}
  return train


def tune_baseline(task: Task, name: str, horizon: int, *, task_name: Optional[str] = None,
                  factory: Optional[Callable[..., optax.GradientTransformation]] = None,
                  learning_rates: Optional[Sequence[float]] = None, schedules: Sequence[str] = SCHEDULES,
                  num_seeds: int = NUM_SEEDS, max_extensions: int = MAX_EXTENSIONS,
                  eval_batches: int = EVAL_BATCHES, lane_chunk: Any = "auto") -> TunedBaseline:
  """Tunes optimizer ``name`` (or ``factory`` under that name) on ``task`` by the procedure of the module docstring
  (`metafam.evaluation.tuning.tune` on the lanes of `train_lanes`).

  ``learning_rates`` defaults to `grid` (``name`` must then be in `GRIDS`); the grid must be log-spaced by a
  constant ratio for the edge extensions. ``eval_batches``: batches per split and eval point (`SuiteSpec`).
  ``lane_chunk``: the lanes' updates in blocks of this many (`Runner`); "auto": `default_lane_chunk` of ``name``.
  """
  from metafam._registry import lookup
  factory = factory if factory is not None else schedule_factory(lookup(TUNABLE, name, "tuned baseline"))
  if isinstance(lane_chunk, str) and lane_chunk == "auto":
    lane_chunk = default_lane_chunk(name)
  start = time.perf_counter()
  task_name = task_name or task.name
  bad = [s for s in schedules if s not in SCHEDULES]
  if bad or not schedules:
    raise ValueError(f"schedules must be a non-empty subset of {SCHEDULES}, got {tuple(schedules)}.")
  points = eval_steps(horizon)
  train = _trainer(task, factory, horizon, task_key(task_name), name, num_seeds, eval_batches, lane_chunk)
  tuned = tuning.tune(train, grid(name) if learning_rates is None else learning_rates, points,
                      schedules=[s for s in SCHEDULES if s in schedules], select_at=horizon,
                      tail_fraction=TAIL_FRACTION, max_extensions=max_extensions)  # ties: constant
  best = tuned.best_index
  test = (normalize(task, tuned.lanes[tuned.schedule].eval_losses["test"][best]) if best >= 0
          else np.full((num_seeds, len(points)), np.nan))
  return TunedBaseline(
      task=task_name, optimizer=name, horizon=int(horizon), schedule=tuned.schedule,
      learning_rate=tuned.learning_rate, learning_rates=tuple(map(float, tuned.learning_rates)),
      scores={s: tuple(map(float, v)) for s, v in tuned.scores.items()}, at_edge=tuned.at_edge,
      eval_steps=tuple(map(int, points)), test_curves=tuple(tuple(map(float, row)) for row in test),
      wall_time=time.perf_counter() - start)


def reference_run(task: Task, learning_rate: float, horizon: int, *, task_name: Optional[str] = None,
                  num_seeds: int = NUM_SEEDS, factor: int = REFERENCE_FACTOR,
                  eval_batches: int = EVAL_BATCHES) -> Dict[str, Any]:
  """Adam at a constant ``learning_rate`` for ``factor * horizon`` steps on the suite's seeds: the speedup
  reference. Returns ``{"learning_rate", "eval_steps", "test_curves" [S][E], "wall_time"}`` (JSON-able)."""
  start = time.perf_counter()
  task_name = task_name or task.name
  points = eval_steps(horizon, factor)
  _, evals = train_lanes(task, OPTAX_FACTORIES[REFERENCE], {"learning_rate": [learning_rate]}, num_seeds=num_seeds,
                         points=points, eval_batches=eval_batches, key=task_key(task_name), splits=SPLITS,
                         name="adam-reference")
  test = normalize(task, evals["test"][0])
  return {"learning_rate": float(learning_rate), "eval_steps": [int(p) for p in points],
          "test_curves": [[float(v) for v in row] for row in test], "wall_time": time.perf_counter() - start}


def constant_rate(tuned: TunedBaseline) -> float:
  """The best constant-schedule rate of ``tuned`` (lowest score, ties to the smaller rate; NaN if all diverged)."""
  scores = np.asarray(tuned.scores["constant"], np.float64)
  return float(tuned.learning_rates[int(np.argmin(scores))]) if np.isfinite(scores).any() else float("nan")


def shard_path(shard_dir: str, task: str, optimizer: str) -> str:
  return os.path.join(shard_dir, task, f"{optimizer}.json")


def shard_names(suite: str = "heldout") -> List[str]:
  """The shards of one task, in generation order: the suite's baselines, then ``adam_reference`` (needs ``adam``)."""
  return list(suite_spec(suite).all_optimizers) + [f"{REFERENCE}_reference"]


def generate(shard_dir: str, tasks: Optional[Sequence[str]] = None, progress: bool = True,
             suite: str = "heldout", shards: Optional[Sequence[str]] = None) -> List[str]:
  """Computes every missing shard of ``tasks`` (default the whole suite, in its horizons' order) into
  ``shard_dir/<task>/<optimizer>.json`` (written atomically; existing shards are kept, so a rerun resumes).

  ``shards`` restricts the work to some of `shard_names` (default all), so that separate processes can share one
  task; ``adam_reference`` needs the task's ``adam`` shard first. Returns the shard paths written now."""
  from tqdm.auto import tqdm
  from metafam.tasks.registry import get_task
  spec = suite_spec(suite)
  tasks = list(spec.horizons) if tasks is None else list(tasks)
  unknown = [t for t in tasks if t not in spec.horizons]
  if unknown:
    raise ValueError(f"tasks {unknown} are not in the {suite} suite; valid: {sorted(spec.horizons)}.")
  names = shard_names(suite)
  shards = names if shards is None else list(shards)
  unknown = [o for o in shards if o not in names]
  if unknown:
    raise ValueError(f"shards {unknown} are not shards of the {suite} suite; valid: {names}.")
  reference = f"{REFERENCE}_reference"
  if reference in shards and REFERENCE not in shards:
    missing = [t for t in tasks if not os.path.exists(shard_path(shard_dir, t, REFERENCE))]
    if missing:
      raise ValueError(f"shards: {reference} needs the {REFERENCE} shard, which {missing} lack; "
                       f"add {REFERENCE} to shards or generate it first.")
  todo = [(t, o) for t in tasks for o in names if o in shards and not os.path.exists(shard_path(shard_dir, t, o))]
  written = []
  with tqdm(total=len(todo), desc=f"{suite} baselines", unit="shard", disable=not progress) as bar:
    for task_name, opt in todo:
      bar.set_postfix_str(f"{task_name}: {opt}")
      if os.path.exists(shard_path(shard_dir, task_name, opt)):  # another process sharing the work wrote it
        bar.update()
        continue
      task, horizon = get_task(task_name), spec.horizons[task_name]
      record = compute_shard(task, task_name, opt, horizon, spec.eval_batches(task), shard_dir)
      path = shard_path(shard_dir, task_name, opt)
      write_json(path, record)
      written.append(path)
      bar.update()
  return written


def compute_shard(task: Task, task_name: str, shard: str, horizon: int, eval_batches: int, shard_dir: str,
                  num_seeds: int = NUM_SEEDS) -> Dict[str, Any]:
  """One shard's record (JSON-able): baseline ``shard`` tuned on the task (`tune_baseline`), or for
  ``adam_reference`` the reference run at the best constant rate of the task's ``adam`` shard in ``shard_dir``."""
  if shard != f"{REFERENCE}_reference":
    return tune_baseline(task, shard, horizon, task_name=task_name, eval_batches=eval_batches,
                         num_seeds=num_seeds).to_json()
  with open(shard_path(shard_dir, task_name, REFERENCE)) as f:
    adam = TunedBaseline.from_json(json.load(f))
  return reference_run(task, constant_rate(adam), horizon, task_name=task_name, eval_batches=eval_batches,
                       num_seeds=num_seeds)


CUSTOM = "custom"  # the suite name of baselines made on the fly for any tasks (`custom_data`)


def custom_data(tasks: Sequence[Tuple[str, Task]], horizon: int, optimizers: Sequence[str] = (REFERENCE,), *,
                shard_dir: Optional[str] = None, num_seeds: int = NUM_SEEDS, progress: bool = False
                ) -> Dict[str, Any]:
  """The baselines of any ``[(name, Task)]`` at one ``horizon``, made by the shipped suites' procedure (each of
  ``optimizers`` tuned per task over rates and both schedules, then Adam's reference run to 4T), in the layout of
  `collect`'s file (suite `CUSTOM`), so `metafam.benchmark.heldout.evaluate_suite` scores a candidate against them
  exactly as against a shipped suite. ``optimizers`` empty: no baselines (the candidate is trained and scored
  alone). The shards are kept in ``shard_dir`` (a temporary directory if None) and reused when present there."""
  import tempfile
  from tqdm.auto import tqdm
  from metafam._checks import check_positive_int
  horizon = check_positive_int("horizon", horizon)
  eval_steps(horizon)  # a multiple of EVALS_PER_RUN
  optimizers = tuple(optimizers)
  unknown = [o for o in optimizers if o not in GRIDS]
  if unknown:
    raise ValueError(f"baselines {unknown} have no rate grid; valid: {', '.join(sorted(GRIDS))}.")
  if optimizers and REFERENCE not in optimizers:
    optimizers = (REFERENCE,) + optimizers  # the speedup's reference is tuned Adam's constant rate
  shards = list(optimizers) + ([f"{REFERENCE}_reference"] if optimizers else [])
  temporary = tempfile.TemporaryDirectory() if shard_dir is None else None
  root = temporary.name if temporary is not None else os.fspath(shard_dir)
  try:
    entries = {}
    with tqdm(total=len(tasks) * len(shards), desc="baselines", unit="shard", disable=not progress) as bar:
      for name, task in tasks:
        entry: Dict[str, Any] = {"horizon": int(horizon), "eval_steps": eval_steps(horizon).tolist(),
                                 "baselines": {}, "num_seeds": int(num_seeds), "eval_batches": EVAL_BATCHES}
        for shard in shards:
          bar.set_postfix_str(f"{name}: {shard}")
          path = shard_path(root, name, shard)
          if os.path.exists(path):
            with open(path) as f:
              record = json.load(f)
          else:
            record = compute_shard(task, name, shard, horizon, EVAL_BATCHES, root, num_seeds)
            write_json(path, record)
          if shard.endswith("_reference"):
            entry["reference"] = record
          else:
            entry["baselines"][shard] = record
          bar.update()
        entries[name] = entry
  finally:
    if temporary is not None:
      temporary.cleanup()
  return {"format_version": FORMAT_VERSION, "suite": CUSTOM, "tasks": entries, "pending": [],
          "optimizers": list(optimizers)}


def spec_of(suite: str, data: Optional[Mapping[str, Any]] = None) -> SuiteSpec:
  """`suite_spec` of a shipped suite; for `CUSTOM` data (`custom_data`) the spec its entries imply."""
  if suite != CUSTOM:
    return suite_spec(suite)
  if data is None or data.get("suite") != CUSTOM:
    raise ValueError(f"the {CUSTOM!r} suite's baselines are made by custom_data; pass them as data.")
  horizons = {t: int(e["horizon"]) for t, e in data["tasks"].items()}
  return SuiteSpec(CUSTOM, horizons, tuple(data.get("optimizers", ())), "", "metafam.benchmark.score")


def versions() -> Dict[str, str]:
  import metafam
  return {"metafam": metafam.__version__, "jax": jax.__version__, "optax": optax.__version__,
          "numpy": np.__version__, "python": platform.python_version(), "backend": jax.default_backend(),
          "jax_threefry_partitionable": str(bool(jax.config.jax_threefry_partitionable))}


def collect(shard_dir: str, path: Optional[str] = None, suite: str = "heldout") -> Dict[str, Any]:
  """Writes the normalizer file (default the suite's ``data_file``) from every task of ``suite`` whose shards are
  all in ``shard_dir``; returns its dict.

  Tasks with missing shards are listed under ``"pending"`` (no baselines shipped for them yet).
  """
  spec = suite_spec(suite)
  path = spec.data_file if path is None else path
  tasks, pending = {}, []
  for task_name, horizon in spec.horizons.items():
    paths = {o: shard_path(shard_dir, task_name, o) for o in shard_names(suite)}
    if not all(os.path.exists(p) for o, p in paths.items() if o not in spec.in_progress):
      pending.append(task_name)
      continue
    paths = {o: p for o, p in paths.items() if os.path.exists(p)}
    shards = {}
    for o, p in paths.items():
      with open(p) as f:
        shards[o] = json.load(f)
    reference = shards.pop(f"{REFERENCE}_reference")
    entry = {"horizon": horizon, "eval_steps": shards[REFERENCE]["eval_steps"], "baselines": shards,
             "reference": reference}
    if spec.eval_examples is not None:
      from metafam.tasks.registry import get_task
      entry["eval_batches"] = spec.eval_batches(get_task(task_name))
    tasks[task_name] = entry
  data = {"format_version": FORMAT_VERSION, "suite": suite, "command": spec.command, "versions": versions(),
          "procedure": {"num_rates": NUM_RATES, "num_seeds": NUM_SEEDS, "schedules": list(SCHEDULES),
                        "warmup_fraction": WARMUP_FRACTION, "grids_low": {o: GRIDS[o] for o in spec.all_optimizers},
                        "evals_per_run": EVALS_PER_RUN,
                        "eval_batches": EVAL_BATCHES if spec.eval_examples is None else "per task",
                        "selection_split": "inner_valid", "metric_split": "test",
                        "tail_fraction": TAIL_FRACTION, "reference": REFERENCE,
                        "reference_factor": REFERENCE_FACTOR, "max_extensions": MAX_EXTENSIONS},
          "tasks": tasks, "pending": pending}
  if spec.eval_examples is not None:
    data["procedure"]["eval_examples"] = spec.eval_examples
  write_json(path, data)
  return data
