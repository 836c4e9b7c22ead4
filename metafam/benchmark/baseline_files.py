"""The files of the suites' tuned baselines: what each suite's are made of, their shards and the shipped file.

The procedure itself (`metafam.benchmark.baselines.tune_baseline`, `reference_run`) serves every suite with shipped
baselines; a `SuiteSpec` says what differs (`SUITE_SPECS`): ``heldout`` (the development suite: nine baselines, 2
evaluation batches per point) and ``test`` (the test suite, evaluated once per shipped optimizer: Adam, AdamW, NAdamW
and Muon, and at least ``TEST_EVAL_EXAMPLES`` examples per split and evaluation point, so the per-point noise is
small against the differences reported; see ``docs/guide/evaluation.md``).

`generate` writes one JSON shard per (task, optimizer) and skips shards that exist (resumable); `collect` gathers
the tasks whose shards are all present into the versioned file ``metafam/benchmark/data/heldout_baselines.json``
(``metafam/benchmark/data/test_baselines.json`` for ``test``; `load_normalizers` reads it; nothing in it is
executed). Command: ``python benchmarks/heldout_baselines.py``. `custom_data` makes the baselines of any tasks by the
same procedure, in the layout of that file (suite `CUSTOM`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np
import optax

from metafam.benchmark import baselines as bl  # its functions are called through the module (tests replace them)
from metafam.benchmark.baselines import (EVAL_BATCHES, EVALS_PER_RUN, GRIDS, MAX_EXTENSIONS, NUM_RATES, NUM_SEEDS,
                                         SCHEDULES, TAIL_FRACTION, WARMUP_FRACTION, eval_steps)
from metafam.benchmark.suites import HORIZONS, TEST_HORIZONS
from metafam.evaluation.scores import REFERENCE, REFERENCE_FACTOR
from metafam.io import write_json
from metafam.tasks.base import Task

FORMAT_VERSION = 1
COMMAND = "python benchmarks/heldout_baselines.py --shard_dir experiments/results/heldout_shards"
DATA_FILE = os.path.join(os.path.dirname(__file__), "data", "heldout_baselines.json")
TEST_EVAL_EXAMPLES = 2048


@dataclasses.dataclass(frozen=True)
class SuiteSpec:
  """What a suite's shipped baselines are made of (the procedure itself is `metafam.benchmark.baselines`').

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
  """One shard's record (JSON-able): baseline ``shard`` tuned on the task (`metafam.benchmark.baselines.tune_baseline`),
  or for ``adam_reference`` the reference run at the best constant rate of the task's ``adam`` shard in
  ``shard_dir``."""
  if shard != f"{REFERENCE}_reference":
    return bl.tune_baseline(task, shard, horizon, task_name=task_name, eval_batches=eval_batches,
                            num_seeds=num_seeds).to_json()
  with open(shard_path(shard_dir, task_name, REFERENCE)) as f:
    adam = bl.TunedBaseline.from_json(json.load(f))
  return bl.reference_run(task, bl.constant_rate(adam), horizon, task_name=task_name, eval_batches=eval_batches,
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
