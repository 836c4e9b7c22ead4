"""The engine of every tuning sweep: (hyperparameter setting x seed) lanes of one vmapped program.

`train_lanes(task, factory, {"learning_rate": rates}, num_seeds=S, points=...)` trains H * S lanes: lane ``h * S + s``
runs ``optax.inject_hyperparams(factory)(learning_rate=rates[h])`` from seed ``s``. The hyperparameters are per-lane
values inside the optimizer state (``inject_hyperparams`` keeps them as state arrays), so one compiled program
serves every setting. It runs on the `metafam.inner.runner.Runner` engine: the steps between evaluation points are
one jitted `lax.scan` whose batches are gathered on the device by ``task.datasets.device_data(split).sample(key)``
(``batch=None`` for data-free tasks; host iterators for datasets without a device path).

Seed ``s`` uses key ``jax.random.split(key, S)[s]`` for every setting, so every optimizer trained with the same key
starts from the same initializations and sees the same batches. The procedure that tunes on these lanes is
`metafam.evaluation.tuning.tune` (through `metafam.benchmark.baselines.tune_baseline`, the suites' one procedure),
which also holds the grid and the selection rule.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam.evaluation.evaluate import train_between_evals
from metafam.inner.runner import OptimizerLike, Runner, as_keys, as_optimizer
from metafam.optimizers.base import OptaxOptimizer, OptimizerState
from metafam.tasks.base import Task

__all__ = ["DEFAULT_SPLITS", "train_lanes"]

DEFAULT_SPLITS = ("inner_valid", "test")


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
