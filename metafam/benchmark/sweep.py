"""Learning-rate sweeps of optax optimizers, vmapped over (learning rate x seed) lanes.

`tune_learning_rate(task, optax.adam, learning_rates, num_steps=...)` trains L * S lanes in one vmapped program:
lane ``l * S + s`` runs ``optax.inject_hyperparams(factory)(learning_rate=learning_rates[l])`` from seed ``s``. The
learning rate is a per-lane value inside the optimizer state (``inject_hyperparams`` keeps hyperparameters as state
arrays), so one compiled program serves every rate. It runs on the `metafam.evaluation.Runner` engine: the steps
between evaluation points are one jitted `lax.scan` whose batches are gathered on the device by
``task.datasets.device_data(split).sample(key)`` (``batch=None`` for data-free tasks; host iterators for datasets
without a device path).

Seed ``s`` uses key ``jax.random.split(key, S)[s]`` for every rate, which is also what
`metafam.evaluation.train_and_evaluate_vectorized(task, opt, ..., num_instances=S, key=key)` gives instance ``s``: on
the device path a lane equals a plain run of ``factory(lr)`` with that seed, and every optimizer benchmarked with the
same key starts from the same initializations and sees the same batches.

The grid (`default_learning_rates`, `check_learning_rates`), the procedure (`metafam.evaluation.tuning.tune`, with
`train_lanes` as its engine) and the selection rule (`select_best`) are those of `metafam.evaluation.tuning`, shared
with `metafam.evaluation.family_eval.FamilyEvaluator.tune_adam` and `metafam.benchmark.baselines.tune_baseline`
(re-exported here): a rate's score is the seed-mean of the ``selection_split`` loss averaged over the eval points in
the last ``tail_fraction`` of ``select_at`` steps (always including ``select_at``); a rate whose training or
selection-split loss is non-finite anywhere in the run has diverged and is never selected; the lowest score wins,
exact ties go to the smaller rate, and if every rate diverged nothing is selected (``best_index == -1``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam.evaluation.metrics import RunCurves, normalize
from metafam.evaluation import tuning
from metafam._checks import check_positive_int
from metafam.evaluation.evaluate import train_between_evals
from metafam.inner.runner import OptimizerLike, Runner, as_keys, as_optimizer, check_splits, eval_points
from metafam.evaluation.tuning import check_learning_rates, default_learning_rates, select_best
from metafam.optimizers.base import OptaxOptimizer, OptimizerState
from metafam.optimizers.optax_zoo import OPTAX_FACTORIES
from metafam.tasks.base import Task

__all__ = ["DEFAULT_SPLITS", "TUNABLE", "SweepResult", "check_learning_rates", "default_learning_rates", "select_best",
           "sgdm", "train_lanes", "tune_learning_rate"]  # the grid and selection rule are re-exported from metafam.evaluation.tuning

DEFAULT_SPLITS = ("inner_valid", "test")


def sgdm(learning_rate: float, momentum: float = 0.9) -> optax.GradientTransformation:
  """SGD with heavy-ball momentum 0.9 (``optax.sgd(learning_rate, momentum=momentum)``), a sweepable factory."""
  return optax.sgd(learning_rate, momentum=momentum)


# Named optax factories ``f(learning_rate) -> GradientTransformation`` that `tune_learning_rate` can sweep.
# The nine baselines of the heldout suite come from `metafam.optimizers.optax_zoo.OPTAX_FACTORIES`.
TUNABLE: Dict[str, Callable[..., optax.GradientTransformation]] = {
    **OPTAX_FACTORIES, "sgdm": sgdm, "sgd": optax.sgd}


@dataclasses.dataclass(frozen=True)
class SweepResult(tuning.GridChoice):
  """A learning-rate sweep of one optax factory on one task (L rates x S seeds).

  Attributes:
    task: the task's name.
    optimizer: the factory's name (e.g. ``"adam"``).
    learning_rates: ``f64[L]`` ascending.
    train_losses: ``f32[L, S, T]``, training-batch losses per rate and seed (T = the sweep's ``num_steps``).
    eval_steps: ``i32[E]`` evaluation steps (they include ``select_at``).
    eval_losses: ``{split: f32[L, S, E]}`` raw losses.
    normalized_eval_losses: ``{split: f64[L, S, E]}`` through ``task.normalizer``.
    scores: ``f64[L]`` selection scores (lower is better; inf for diverged rates).
    diverged: ``bool[L]``.
    best_index: index of the selected rate, -1 if every rate diverged.
    selection_split, select_at, tail_fraction: how the rate was selected.
    wall_time: seconds for the sweep, compilation included.
  """
  task: str
  optimizer: str
  learning_rates: np.ndarray
  train_losses: np.ndarray
  eval_steps: np.ndarray
  eval_losses: Dict[str, np.ndarray]
  normalized_eval_losses: Dict[str, np.ndarray]
  scores: np.ndarray
  diverged: np.ndarray
  best_index: int
  selection_split: str
  select_at: int
  tail_fraction: float
  wall_time: float

  @property
  def best_lr(self) -> float:
    """The selected rate (NaN if every rate diverged); `learning_rate` by its other name."""
    return self.learning_rate

  def final_loss(self, split: Optional[str] = None, normalized: bool = False) -> float:
    """Seed-mean loss of ``split`` (default the selection split) at ``select_at`` for the selected rate (or NaN)."""
    split = split or self.selection_split
    if self.best_index < 0:
      return float("nan")
    table = self.normalized_eval_losses if normalized else self.eval_losses
    column = int(np.searchsorted(self.eval_steps, self.select_at))
    return float(np.mean(np.asarray(table[split][self.best_index, :, column], np.float64)))

  def curves(self, index: Optional[int] = None, name: Optional[str] = None) -> RunCurves:
    """`RunCurves` of rate ``index`` (default the selected one) over the whole sweep; ``.truncated(n)`` shortens it."""
    index = self.best_index if index is None else int(index)
    if not 0 <= index < len(self.learning_rates):
      raise ValueError(f"no learning rate with index {index} (every rate diverged?) in the sweep of "
                       f"{self.optimizer} on {self.task}.")
    return RunCurves(task=self.task, optimizer=name or self.optimizer, train_losses=self.train_losses[index],
                     eval_steps=self.eval_steps, eval_losses={s: v[index] for s, v in self.eval_losses.items()},
                     normalized_eval_losses={s: v[index] for s, v in self.normalized_eval_losses.items()},
                     wall_time=self.wall_time, learning_rate=float(self.learning_rates[index]))


def _with_hyperparams(opt_state: OptimizerState, lane_values: Mapping[str, jax.Array]) -> OptimizerState:
  """Replaces hyperparameters of a vmapped ``inject_hyperparams`` state by per-lane values ``{name: f32[M]}``."""
  inner = opt_state.opt_state
  hyper = dict(inner.hyperparams)
  for name, values in lane_values.items():
    hyper[name] = values.astype(jnp.asarray(hyper[name]).dtype)
  return dataclasses.replace(opt_state, opt_state=inner._replace(hyperparams=hyper))


def train_lanes(task: Task, factory: Union[Callable[..., optax.GradientTransformation], OptimizerLike],
                hyperparams: Optional[Mapping[str, Sequence[float]]], *, num_seeds: int, points: np.ndarray,
                eval_batches: int, key: Optional[jax.Array], splits: Sequence[str], name: str = "optax",
                lane_chunk: Optional[int] = None):
  """Trains ``H * S`` lanes in one vmapped program; lane ``h * S + s`` runs
  ``inject_hyperparams(factory)(**{k: v[h]})`` from seed ``s`` (key ``jax.random.split(key, S)[s]``).

  Args:
    factory: an optax factory; with ``hyperparams=None`` instead a ready optimizer (a metafam `Optimizer` or an optax
      transformation), trained as ``H = 1`` setting.
    hyperparams: ``{argument of factory: H values}``, numeric hyperparameters set per lane.
    points: ascending eval steps starting at 0; training runs to ``points[-1]``.
    lane_chunk: the lanes' updates run in blocks of this many (`Runner`'s ``lane_chunk``; None: one vmap).

  Returns ``(train f32[H, S, T], {split: f32[H, S, E]})`` as numpy.
  """
  if hyperparams is None:
    values, num_settings, optimizer = {}, 1, as_optimizer(factory)
  else:
    values = {k: np.asarray(v, np.float64).ravel() for k, v in hyperparams.items()}
    sizes = {v.size for v in values.values()}
    if len(sizes) != 1 or 0 in sizes:
      raise ValueError(f"every hyperparameter needs the same positive number of lane values, got "
                       f"{ {k: v.size for k, v in values.items()} }.")
    num_settings = sizes.pop()
    optimizer = OptaxOptimizer(optax.inject_hyperparams(factory)(**{k: float(v[0]) for k, v in values.items()}),
                               name=f"{name}-sweep")
  runner = Runner(task, optimizer, num_members=num_settings * num_seeds, splits=splits, eval_batches=eval_batches,
                  lane_chunk=lane_chunk)
  seed_keys = as_keys(key, num_seeds)
  keys = runner.keys(seed_keys[np.tile(np.arange(num_seeds), num_settings)])  # lane h * S + s -> seed s
  cfg, opt_state = runner.init(keys, int(points[-1]))
  if values:
    opt_state = _with_hyperparams(opt_state, {k: jnp.asarray(np.repeat(v, num_seeds), jnp.float32)
                                              for k, v in values.items()})
  opt_state, train, evals = train_between_evals(runner, opt_state, cfg, keys, points)
  # [T, H * S] -> [H, S, T] and [E, H * S] -> [H, S, E]
  train = train.T.reshape(num_settings, num_seeds, -1)
  eval_losses = {s: np.stack([np.asarray(e[s]) for e in evals]).T.reshape(num_settings, num_seeds, len(points))
                 for s in splits}
  return train, eval_losses


def tune_learning_rate(task: Task, factory: Callable[..., optax.GradientTransformation] = optax.adam,
                       learning_rates: Optional[Sequence[float]] = None, *, num_steps: int, num_seeds: int = 2,
                       eval_every: Optional[int] = None, eval_batches: int = 2, key: Optional[jax.Array] = None,
                       select_at: Optional[int] = None, tail_fraction: float = 0.1,
                       splits: Sequence[str] = DEFAULT_SPLITS, selection_split: str = "inner_valid",
                       task_name: Optional[str] = None, name: Optional[str] = None) -> SweepResult:
  """Sweeps ``factory``'s learning rate on ``task``, all (rate, seed) lanes in one vmapped program.

  Args:
    task: the task.
    factory: ``factory(learning_rate=...) -> optax.GradientTransformation`` (e.g. ``optax.adam``, `sgdm`); it is
      wrapped by ``optax.inject_hyperparams``, so the rate must be its ``learning_rate`` argument.
    learning_rates: the grid (default `default_learning_rates`: 7 log-spaced values in [1e-4, 1e-1]).
    num_steps: updates per lane.
    num_seeds: seeds S per rate.
    eval_every: updates between evaluations (default ``max(1, num_steps // 20)``); ``select_at`` is always evaluated.
    eval_batches: batches averaged per split and evaluation.
    key: PRNG key of the seeds (default ``jax.random.key(0)``).
    select_at: step at which rates are compared (default ``num_steps``; e.g. a benchmark horizon shorter than the
      sweep, which then keeps running to measure how long the baseline takes to reach lower losses).
    tail_fraction: the score averages the eval points in the last ``tail_fraction`` of ``select_at`` steps.
    splits: evaluated splits (``selection_split`` is added if missing).
    selection_split: the split that scores rates (``inner_valid``: never ``test``, which is for reporting).
    task_name, name: labels for the result (default ``task.name`` and the factory's ``__name__``).
  """
  num_steps = check_positive_int("num_steps", num_steps)
  num_seeds = check_positive_int("num_seeds", num_seeds)
  eval_every = check_positive_int("eval_every", eval_every if eval_every is not None else max(1, num_steps // 20))
  select_at = num_steps if select_at is None else check_positive_int("select_at", select_at)
  if select_at > num_steps:
    raise ValueError(f"select_at={select_at} exceeds num_steps={num_steps}.")
  splits = check_splits("splits", tuple(splits) + ((selection_split,) if selection_split not in splits else ()))
  lrs = check_learning_rates(default_learning_rates() if learning_rates is None else learning_rates)
  name = name or getattr(factory, "__name__", "optax")
  start = time.perf_counter()

  points = np.union1d(eval_points(num_steps, eval_every), [select_at]).astype(np.int32)

  def train(rates, schedules):  # the factory's own (constant) rate: no schedule to choose
    losses, evals = train_lanes(task, factory, {"learning_rate": rates}, num_seeds=num_seeds, points=points,
                                eval_batches=eval_batches, key=key, splits=splits, name=name)
    return {"constant": tuning.Lanes(evals, losses)}
  tuned = tuning.tune(train, lrs, points, select_at=select_at, tail_fraction=tail_fraction,
                      selection_split=selection_split)
  lanes = tuned.lanes["constant"]
  return SweepResult(task=task_name or task.name, optimizer=name, learning_rates=tuned.learning_rates,
                     train_losses=lanes.train_losses, eval_steps=points, eval_losses=dict(lanes.eval_losses),
                     normalized_eval_losses={s: normalize(task, v) for s, v in lanes.eval_losses.items()},
                     scores=tuned.scores["constant"], diverged=tuned.diverged["constant"], best_index=tuned.best_index,
                     selection_split=selection_split, select_at=select_at, tail_fraction=float(tail_fraction),
                     wall_time=time.perf_counter() - start)
