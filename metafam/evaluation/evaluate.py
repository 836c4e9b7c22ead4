"""Training with periodic evaluation on the four splits: `train_and_evaluate` and its vmapped twin, on the `Runner`
engine (`metafam.inner.runner`, which the high-level `metafam.training.Trainer` shares; see it for the chunking,
the data paths and the keys).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Optional, Sequence, Union

import jax
import numpy as np

from metafam._checks import check_positive_int
from metafam.datasets.base import SPLITS
from metafam.inner.runner import OptimizerLike, Runner, eval_points
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks.base import Task

__all__ = ["EvalResult", "train_and_evaluate", "train_and_evaluate_vectorized", "train_between_evals",
           "Runner"]  # Runner: re-exported for the compatibility layer, which imports it from here


# -- public API ---------------------------------------------------------------------------------------------------
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EvalResult:
  """Curves of one run (or of N vmapped runs: curves and states gain a leading axis N, ``eval_steps`` does not).

  Attributes:
    train_losses: ``f32[T]``, the loss of step t's batch at the params before update t.
    eval_steps: ``i32[E]``, the number of updates done at each evaluation: 0, eval_every, ..., num_steps.
    eval_losses: ``{split: f32[E]}``, each the mean loss over ``eval_batches`` batches of the split.
    wall_time: seconds for the whole call, compilation included.
    params, model_state: after the final step.
    opt_state: the final optimizer state.
    cfg: the sampled family configs ``[N, ...]`` (vectorized runs of a `TaskFamily`), else None.
  """
  train_losses: np.ndarray
  eval_steps: np.ndarray
  eval_losses: Dict[str, np.ndarray]
  wall_time: float
  params: Any
  model_state: Any
  opt_state: Any
  cfg: Any = None


def train_between_evals(runner: Runner, opt_state: Any, cfg: Any, keys: Any, points: Sequence[int]):
  """Evaluates at ``points[0]``, then trains chunk by chunk and evaluates at every later point.

  Returns ``(opt_state, train losses [points[-1] - points[0], ...] as numpy, list of per-point eval dicts)``.
  """
  evals = [runner.evaluate(opt_state, cfg, keys, int(points[0]))]
  chunks = []
  for begin, end in zip(points[:-1], points[1:]):
    opt_state, losses = runner.train(opt_state, cfg, keys, int(begin), int(end - begin))
    chunks.append(losses)
    evals.append(runner.evaluate(opt_state, cfg, keys, int(end)))
  return opt_state, np.concatenate([np.asarray(c) for c in chunks], axis=0), evals


def _run(runner: Runner, key: Optional[jax.Array], num_steps: int, eval_every: int) -> EvalResult:
  start_time = time.perf_counter()
  keys = runner.keys(key)
  cfg, opt_state = runner.init(keys, num_steps)
  points = eval_points(num_steps, eval_every)
  opt_state, train_losses, evals = train_between_evals(runner, opt_state, cfg, keys, points)
  eval_losses = {s: np.stack([np.asarray(e[s]) for e in evals]) for s in runner.splits}
  if runner.vmapped:  # time-major to member-major: [T, N] -> [N, T]
    train_losses = train_losses.T
    eval_losses = {s: v.T for s, v in eval_losses.items()}
  opt_state = jax.block_until_ready(opt_state)
  return EvalResult(train_losses=train_losses, eval_steps=points, eval_losses=eval_losses,
                    wall_time=time.perf_counter() - start_time, params=runner.params(opt_state),
                    model_state=runner.model_state(opt_state), opt_state=opt_state, cfg=cfg)


def train_and_evaluate(task: Task, optimizer: OptimizerLike, num_steps: int, eval_every: int, eval_batches: int,
                       key: Optional[jax.Array] = None, *, splits: Sequence[str] = SPLITS,
                       use_device_data: Optional[bool] = None) -> EvalResult:
  """Trains ``task`` for ``num_steps`` updates, evaluating every ``eval_every`` steps (and at 0 and the end).

  Args:
    task: the `Task` to train.
    optimizer: a metafam `Optimizer` or an optax transformation.
    num_steps: number of updates T.
    eval_every: updates between evaluations; each stretch is one jitted scan.
    eval_batches: batches averaged per split and evaluation.
    key: one PRNG key (default ``jax.random.key(0)``).
    splits: the splits to evaluate (default all four).
    use_device_data: None = device sampling when possible; False forces the host iterators. On the host path,
      evaluating the ``train`` split draws its batches from the training iterator, which shifts the batches that
      training sees.

  Returns:
    An `EvalResult` with ``train_losses f32[T]``, ``eval_steps i32[E]`` and ``eval_losses {split: f32[E]}``.
  """
  if not isinstance(task, Task):
    raise TypeError(f"task must be a metafam Task, got {type(task).__name__} (use train_and_evaluate_vectorized "
                    "for a TaskFamily).")
  num_steps = check_positive_int("num_steps", num_steps)
  eval_every = check_positive_int("eval_every", eval_every)
  runner = Runner(task, optimizer, splits=splits, eval_batches=eval_batches, use_device_data=use_device_data)
  return _run(runner, key, num_steps, eval_every)


def train_and_evaluate_vectorized(task_or_family: Union[Task, TaskFamily], optimizer: OptimizerLike, num_steps: int,
                                  eval_every: int, eval_batches: int, num_instances: int,
                                  key: Optional[jax.Array] = None, *, splits: Sequence[str] = SPLITS,
                                  shared_batches: bool = False,
                                  use_device_data: Optional[bool] = None) -> EvalResult:
  """`train_and_evaluate` for N instances in one vmapped program: N seeds of a `Task`, or N samples of a family.

  Instance ``i`` uses key ``jax.random.split(key, N)[i]`` (or ``key[i]`` when ``key`` is a batch of N keys). By
  default every instance draws its own training batches (on the host path: N consecutive batches of the iterator
  per step) and, on the device path, its own evaluation batches, so instance i equals
  ``train_and_evaluate(task_i, optimizer, ..., key=that key)`` on the device path. With ``shared_batches=True`` all
  instances see the same batch each step and the same evaluation batches. Host evaluation batches are always
  shared.

  Returns:
    An `EvalResult` whose curves gain a leading axis N (``train_losses f32[N, T]``, ``eval_losses {split:
    f32[N, E]}``; ``eval_steps`` stays ``i32[E]``), with ``params``/``opt_state`` leaves ``[N, ...]`` and ``cfg``
    the sampled family configs (None for a `Task`).
  """
  num_steps = check_positive_int("num_steps", num_steps)
  eval_every = check_positive_int("eval_every", eval_every)
  num_instances = check_positive_int("num_instances", num_instances)
  runner = Runner(task_or_family, optimizer, num_members=num_instances, splits=splits, eval_batches=eval_batches,
                  shared_train=shared_batches, shared_eval=shared_batches, use_device_data=use_device_data)
  return _run(runner, key, num_steps, eval_every)
