"""Tuned hand-designed baselines: the tuning procedure of every suite's baselines, per task and optimizer.

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

Every run of a task uses the key ``fold_in(key(0), crc32(task name))`` (custom suites too,
`metafam.benchmark.baseline_files.custom_data`), so seed s of every optimizer, the candidate included, starts from
the same initialization and sees the same batches.

The same procedure serves every suite with shipped baselines: what each suite's are made of (`SuiteSpec`), their
shards and the shipped files are `metafam.benchmark.baseline_files`'.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np
import optax

from metafam.benchmark.candidates import schedule_factory
from metafam.benchmark.sweep import train_lanes
from metafam.evaluation import tuning
from metafam.evaluation.metrics import normalize
from metafam.evaluation.scores import REFERENCE, REFERENCE_FACTOR
from metafam.optimizers import newton_schulz
from metafam.optimizers.optax_zoo import OPTAX_FACTORIES
from metafam.tasks.base import Task

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

# Per optimizer, the lowest rate of its 7-point grid (then x sqrt(10) per point, 3 decades in all).
GRIDS: Dict[str, float] = {
    "adam": 1e-4, "adamw": 1e-4, "nadamw": 1e-4, "rmsprop": 1e-4, "schedule_free_adamw": 1e-4,
    "lion": 1e-5, "sgd_nesterov": 1e-3, "adafactor": 1e-3, "muon": 1e-3, "ademamix": 1e-4,
    "sgdm": 1e-3, "sgd": 1e-3,  # tuned baselines of custom suites (`baseline_files.custom_data`)
}


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
  constant ratio for the edge extensions. ``eval_batches``: batches per split and eval point
  (`metafam.benchmark.baseline_files.SuiteSpec`).
  ``lane_chunk``: the lanes' updates in blocks of this many (`Runner`); "auto": `default_lane_chunk` of ``name``.
  """
  from metafam._registry import lookup
  factory = factory if factory is not None else schedule_factory(lookup(OPTAX_FACTORIES, name, "tuned baseline"))
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
