"""`Trainer`: train one `Task` (or a vmapped ensemble of it) with a progress bar, validation and early stopping.

    trainer = Trainer(task, Adam(3e-3), eval_every=100, callbacks=[EarlyStopping(patience=3)])
    result = trainer.fit(num_steps=2000, key=jax.random.key(0))
    result.params                 # the params with the best inner_valid loss (keep_best=True)
    result.history.eval_losses    # {"inner_valid": f32[E]}

The steps between two evaluations are one jitted `lax.scan` (the `metafam.inner.runner.Runner` engine, with batches
gathered on the device when the datasets allow it); evaluation, keep-best and early stopping happen on the host at
the evaluation points 0, eval_every, 2 * eval_every, ..., num_steps.

A step whose loss or gradient is non-finite (NaN rows in the data, a learning rate that diverges) is not masked: its
update makes the params non-finite. The scan counts such steps and `fit` reports them when it ends
(``on_nonfinite``, `metafam.nonfinite`): a `metafam.nonfinite.NonFiniteWarning` naming the first step, the fraction
of steps, the members, and what it did to ``best_loss`` and the params; ``TrainResult.nonfinite_fraction`` holds
the fraction. A loss that is not a scalar is refused with its shape when the first program is traced.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from metafam._checks import check_positive_int
from metafam.datasets.base import SPLITS
from metafam.inner.runner import OptimizerLike, Runner, check_splits, eval_points
from metafam.inner.step import all_finite
from metafam.nonfinite import check_on_nonfinite, listing, percent, report
from metafam.tasks.base import Task
from metafam.training.callbacks import Callback, monitored_value

logger = logging.getLogger(__name__)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class History:
  """What a training run recorded. Ensembles of M members add a leading axis M to the losses.

  Attributes:
    train_losses: ``f32[T]`` (or ``[M, T]``), the loss of each step's batch before its update.
    eval_steps: ``i32[E]``, the number of updates done at each evaluation (0 first).
    eval_losses: ``{split: f32[E]}`` (or ``[M, E]``), mean losses over ``eval_batches`` batches.
  """
  train_losses: np.ndarray
  eval_steps: np.ndarray
  eval_losses: Dict[str, np.ndarray]

  @property
  def num_steps(self) -> int:
    return int(np.shape(self.train_losses)[-1])

  def curve(self, split: str) -> np.ndarray:
    """The evaluation curve of ``split``."""
    if split not in self.eval_losses:
      raise KeyError(f"split {split!r} was not evaluated; evaluated splits: {sorted(self.eval_losses)}.")
    return self.eval_losses[split]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainResult:
  """The outcome of `Trainer.fit`.

  Attributes:
    params, model_state: at the best evaluation of the monitored split (``keep_best=True``), else the final ones.
    final_params: the params after the last step run.
    opt_state: the final optimizer state (resume from it or read its statistics).
    history: the `History` of the run.
    best_step: the step of the lowest monitored loss (mean over members for ensembles); None if every monitored
      loss was NaN (then ``params`` are the final ones).
    best_loss: that loss (inf if none).
    stopped_step: the step at which a callback stopped training early, else None.
    nonfinite_fraction: the fraction of the steps run (of steps x members for ensembles) whose train loss or
      gradient was non-finite (0.0 with ``on_nonfinite="ignore"``, which does not count them).
    first_nonfinite_step: the first such step, else None.
  """
  params: Any
  model_state: Any
  final_params: Any
  opt_state: Any
  history: History
  best_step: int
  best_loss: float
  stopped_step: Optional[int]
  nonfinite_fraction: float = 0.0
  first_nonfinite_step: Optional[int] = None


class Trainer:
  """Trains a `Task` with periodic validation, callbacks, keep-best params and optional ensembling.

  Args:
    task: the `Task` to train.
    optimizer: a metafam `Optimizer` or an optax transformation.
    eval_every: steps between evaluations (each stretch is one jitted scan).
    eval_batches: batches averaged per split at each evaluation.
    eval_splits: splits evaluated at each evaluation point.
    monitor: the split whose loss picks the best params; must be in ``eval_splits``.
    keep_best: return the params of the best monitored evaluation (else the final params).
    callbacks: `Callback`s, e.g. `EarlyStopping`; a monitoring callback's split must be in ``eval_splits``.
    ensemble_size: None trains one model; M trains M members in one vmapped program (losses gain a leading axis
      M; the monitored loss is the mean over members).
    same_batches: ensemble members train on the same batch each step (else each draws its own). Loss and
      optimizer keys stay per member. Members are always evaluated on the same batches.
    same_init: ensemble members start from the same params and optimizer state.
    progress: show a tqdm progress bar with the current train loss and monitored loss.
    use_device_data: None samples batches on the device when the datasets allow it; False forces host iterators.
    on_nonfinite: "warn" (default), "raise" or "ignore" (`metafam.nonfinite`): what `fit` does when a step's train
      loss or gradient, or every monitored evaluation, is non-finite. "raise" raises
      `metafam.nonfinite.NonFiniteError` after the first stretch of steps holding one; "ignore" runs the program
      without the count (the numbers are the same either way).
  """

  def __init__(self, task: Task, optimizer: OptimizerLike, *, eval_every: int = 100, eval_batches: int = 10,
               eval_splits: Sequence[str] = ("inner_valid",), monitor: str = "inner_valid", keep_best: bool = True,
               callbacks: Sequence[Callback] = (), ensemble_size: Optional[int] = None, same_batches: bool = False,
               same_init: bool = False, progress: bool = True, use_device_data: Optional[bool] = None,
               on_nonfinite: str = "warn"):
    if not isinstance(task, Task):
      raise TypeError(f"task must be a metafam Task, got {type(task).__name__}.")
    self.eval_every = check_positive_int("eval_every", eval_every)
    self.eval_splits = check_splits("eval_splits", eval_splits)
    if monitor not in SPLITS:
      raise ValueError(f"monitor must be one of {SPLITS}, got {monitor!r}.")
    if monitor not in self.eval_splits:
      raise ValueError(f"monitor {monitor!r} is not in eval_splits {self.eval_splits}; add it to eval_splits.")
    self.callbacks = _check_callbacks(callbacks, self.eval_splits)
    if ensemble_size is not None:
      ensemble_size = check_positive_int("ensemble_size", ensemble_size)
    elif same_batches or same_init:
      raise ValueError("same_batches and same_init describe ensemble members; set ensemble_size to use them.")
    self.on_nonfinite = check_on_nonfinite(on_nonfinite)
    self.task, self.monitor, self.keep_best, self.progress = task, monitor, bool(keep_best), bool(progress)
    self.ensemble_size, self.same_batches, self.same_init = ensemble_size, bool(same_batches), bool(same_init)
    self.runner = Runner(task, optimizer, num_members=ensemble_size, splits=self.eval_splits,
                         eval_batches=eval_batches, shared_train=self.same_batches, shared_eval=True,
                         use_device_data=use_device_data)
    self.optimizer = self.runner.optimizer
    self._reset()

  def _reset(self) -> None:
    self.stop_training = False
    self.step = 0
    self.opt_state = None
    self.result: Optional[TrainResult] = None
    self._train_chunks: List[np.ndarray] = []
    self._nonfinite_chunks: List[np.ndarray] = []
    self._eval_steps: List[int] = []
    self._eval_losses: Dict[str, List[Any]] = {s: [] for s in self.eval_splits}
    self._best_loss, self._best_step, self._best_state = math.inf, None, None
    self._bar_values: Dict[str, str] = {}

  # -- live views for callbacks ----------------------------------------------------------------------------------
  @property
  def history(self) -> History:
    """The history recorded so far (a fresh snapshot)."""
    if self._train_chunks:
      train = np.concatenate(self._train_chunks, axis=0)
    else:
      train = np.zeros((0,) if self.ensemble_size is None else (0, self.ensemble_size), np.float32)
    eval_losses = {s: np.asarray(v, np.float32) for s, v in self._eval_losses.items()}
    if self.ensemble_size is not None:  # step-major to member-major
      train = train.T
      eval_losses = {s: v.reshape(-1, self.ensemble_size).T for s, v in eval_losses.items()}
    return History(train_losses=train, eval_steps=np.asarray(self._eval_steps, np.int32), eval_losses=eval_losses)

  @property
  def params(self) -> Any:
    """The current params (``[M, ...]`` leaves for ensembles)."""
    return None if self.opt_state is None else self.runner.params(self.opt_state)

  # -- training ---------------------------------------------------------------------------------------------------
  def fit(self, num_steps: int, key: Optional[jax.Array] = None) -> TrainResult:
    """Trains from a fresh initialization for up to ``num_steps`` steps; returns (and keeps) a `TrainResult`."""
    num_steps = check_positive_int("num_steps", num_steps)
    self._reset()
    keys = self.runner.keys(key)
    if self.same_init:
      first = jnp.zeros((self.ensemble_size,), jnp.int32)
      keys = dataclasses.replace(keys, init=keys.init[first], opt=keys.opt[first])
    cfg, self.opt_state = self.runner.init(keys, num_steps)
    for callback in self.callbacks:
      callback.on_train_begin(self)
    step_callbacks = [c for c in self.callbacks if type(c).on_step is not Callback.on_step]
    points = eval_points(num_steps, self.eval_every)
    with tqdm(total=num_steps, desc=self.task.name, unit="step", disable=not self.progress) as bar:
      self._evaluate(cfg, keys, bar)
      for begin, end in zip(points[:-1], points[1:]):
        if self.stop_training:
          break
        checked = self.on_nonfinite != "ignore"
        self.opt_state, out = self.runner.train(self.opt_state, cfg, keys, int(begin), int(end - begin), checked)
        losses = np.asarray(out[0] if checked else out)
        self._train_chunks.append(losses)
        if checked:
          self._nonfinite_chunks.append(np.asarray(out[1]))
          if self.on_nonfinite == "raise" and self._nonfinite_chunks[-1].any():
            self.step = int(end)
            report(self._nonfinite_message(stopped=True), "raise")
        for i, loss in enumerate(losses):
          for callback in step_callbacks:
            callback.on_step(self, int(begin) + i, self._as_loss(loss))
        self.step = int(end)
        bar.update(int(end - begin))
        self._postfix(bar, train_loss=float(np.mean(losses[-1])))
        self._evaluate(cfg, keys, bar)
    stopped = self.step if self.stop_training and self.step < num_steps else None
    best_state = self._best_state if self.keep_best and self._best_state is not None else self.opt_state
    fraction, first = self._nonfinite_steps()
    self.result = TrainResult(params=self.runner.params(best_state), model_state=self.runner.model_state(best_state),
                              final_params=self.runner.params(self.opt_state), opt_state=self.opt_state,
                              history=self.history, best_step=self._best_step, best_loss=self._best_loss,
                              stopped_step=stopped, nonfinite_fraction=fraction, first_nonfinite_step=first)
    if self.on_nonfinite != "ignore" and (first is not None or self._monitored_nonfinite()[0]):
      report(self._nonfinite_message(stopped=False), self.on_nonfinite)
    for callback in self.callbacks:
      callback.on_train_end(self, self.result)
    return self.result

  # -- non-finite steps ----------------------------------------------------------------------------------------------
  def _nonfinite_codes(self) -> np.ndarray:
    """The steps' codes so far, ``[T]`` (``[T, M]`` for ensembles): 0 finite, 1 loss, 2 gradient non-finite."""
    if not self._nonfinite_chunks:
      return np.zeros((0,) if self.ensemble_size is None else (0, self.ensemble_size), np.int8)
    return np.concatenate(self._nonfinite_chunks, axis=0)

  def _nonfinite_steps(self):
    """``(fraction of non-finite steps (x members), first such step or None)``."""
    codes = self._nonfinite_codes()
    if codes.size == 0:
      return 0.0, None
    bad_step = (codes != 0).reshape(codes.shape[0], -1).any(axis=1)
    return float(np.mean(codes != 0)), (int(np.argmax(bad_step)) if bad_step.any() else None)

  def _monitored_nonfinite(self):
    """``(evaluations whose monitored loss was non-finite, evaluations)`` (mean over members for ensembles)."""
    values = [monitored_value({self.monitor: v}, self.monitor) for v in self._eval_losses[self.monitor]]
    return sum(not math.isfinite(v) for v in values), len(values)

  def _nonfinite_message(self, stopped: bool) -> str:
    """What went non-finite in this run, where, how often, and what it did to the result."""
    codes = self._nonfinite_codes()
    fraction, first = self._nonfinite_steps()
    parts = []
    if first is not None:
      counts = {name: int(np.sum(codes == c)) for c, name in ((1, "train loss"), (2, "gradient"))}
      kinds = [name for name, n in counts.items() if n]
      unit = "steps" if self.ensemble_size is None else "member-steps"
      where = ""
      if self.ensemble_size is not None:
        where = f"; members {listing(np.flatnonzero((codes != 0).any(axis=0)))} of {self.ensemble_size}"
      if len(kinds) > 1:
        where += "; " + ", ".join(f"{name}: {n}" for name, n in counts.items())
      parts.append(f"non-finite {' or '.join(kinds)} in {percent(int(np.sum(codes != 0)), codes.size, unit)}, the "
                   f"first at step {first}{where}")
      first_code = codes[first] if self.ensemble_size is None else codes[first][codes[first] != 0][0]
      parts.append("the first non-finite value is the " + ("train loss (look for NaN or infinite values in the "
                                                             "training data)" if first_code == 1 else
                                                             "gradient while the loss was finite") +
                   "; Trainer does not mask steps, so the update with it made the params non-finite"
                   + ("" if self.params is None or bool(jax.jit(all_finite)(self.params))
                      else ", and the final params are non-finite"))
    bad_evals, num_evals = self._monitored_nonfinite()
    if bad_evals:
      parts.append(f"the monitored {self.monitor!r} loss was non-finite at {bad_evals} of {num_evals} evaluations"
                   + (f", so best_loss={self._best_loss} and the params returned are the final ones"
                      if self._best_step is None else f"; the params returned are those of step {self._best_step}"))
    head = f"Trainer on task {self.task.name!r}"
    tail = (f"on_nonfinite='raise' stopped the run after step {self.step}." if stopped else
            "TrainResult.nonfinite_fraction holds the fraction; on_nonfinite='raise' stops at the first one, "
            "'ignore' skips the check.")
    return f"{head}: " + "; ".join(parts) + f". {tail}"

  def _as_loss(self, value: Any) -> Any:
    return float(value) if self.ensemble_size is None else np.asarray(value)

  def _postfix(self, bar: Any, **values: float) -> None:
    self._bar_values.update({k: f"{v:.4f}" for k, v in values.items()})
    bar.set_postfix(self._bar_values, refresh=False)

  def _evaluate(self, cfg: Any, keys: Any, bar: Any) -> None:
    raw = self.runner.evaluate(self.opt_state, cfg, keys, self.step)
    losses = {s: self._as_loss(v) for s, v in raw.items()}
    self._eval_steps.append(self.step)
    for split, value in losses.items():
      self._eval_losses[split].append(value)
    value = monitored_value(losses, self.monitor)
    if value < self._best_loss:
      self._best_loss, self._best_step, self._best_state = value, self.step, self.opt_state
    logger.info("%s step %d: %s", self.task.name, self.step,
                ", ".join(f"{s}={monitored_value(losses, s):.4f}" for s in self.eval_splits))
    self._postfix(bar, **{self.monitor: value})
    for callback in self.callbacks:
      callback.on_eval(self, self.step, losses)


def _check_callbacks(callbacks: Sequence[Callback], eval_splits: Sequence[str]) -> List[Callback]:
  if isinstance(callbacks, Callback):
    callbacks = [callbacks]
  callbacks = list(callbacks)
  for i, callback in enumerate(callbacks):
    if not isinstance(callback, Callback):
      raise TypeError(f"callbacks[{i}] must be a metafam.training.Callback, got {type(callback).__name__}.")
    monitor = getattr(callback, "monitor", None)
    if monitor is not None and monitor not in eval_splits:
      raise ValueError(f"callbacks[{i}] ({callback!r}) monitors {monitor!r}, which is not in eval_splits "
                       f"{tuple(eval_splits)}; add it to eval_splits.")
  return callbacks
