"""The meta-training loop: estimators -> averaged meta-gradient -> optax meta-optimizer, with checkpoints.

One meta-step (estimates of every estimator, averaging, non-finite handling, clipping and the optax update) is a
single jitted program. Step ``i`` uses the key ``fold_in(state.key, i)``, and the whole `MetaTrainState` (theta,
meta-optimizer state, worker states, base key, step) is checkpointed, so a run resumed from a checkpoint produces
exactly the numbers of an uninterrupted run.

Estimators built with ``devices`` (all with the same devices) spread their lanes over those devices; the trainer
then keeps theta and the meta-optimizer state replicated there and each worker state split by lane (`place`), from
`init` and after `restore`. Evaluation (`evaluate`) spreads its ``eval_num_tasks`` instances over the same devices
when they divide evenly, and runs on one device otherwise (the numbers are the same up to float rounding).

When the devices belong to several processes (`metafam.distributed`), every process runs the same meta-steps;
checkpoints hold the global state and are written by process 0, which alone also writes ``metrics.jsonl`` and
evaluates (on its own devices); a resumed run may use another process count.

Failures a long run meets on a shared cluster (see docs/guide/failures.md): `train` stops cleanly on
SIGTERM / SIGINT with ``handle_signals`` (a checkpoint at the step every process agrees on, then `Preempted`); a
checkpoint or metrics write that fails leaves the previous checkpoint as it was and raises `WriteFailedError`; a
``metrics.jsonl`` cut by a crash loses only its partial last line; the output directory is locked for the run
(`metafam.io.DirectoryLock`); ``max_skipped_steps`` consecutive skipped updates raise `RunDivergedError`; a
checkpoint with non-finite meta-parameters is refused; and the meta-step's memory is checked against what the
devices can give before anything is allocated (`metafam.resources`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from metafam import distributed, resources
from metafam._checks import check_positive
from metafam._pytree import DataPytree
from metafam.evaluation.family_eval import FamilyEvaluator
from metafam.inner import sharding
from metafam.io import DirectoryLock, append_line, atomic_write
from metafam.outer_trainers import checkpoint
from metafam.outer_trainers.base import GradientEstimator, count_nonfinite
from metafam.outer_trainers.preemption import Preempted, StopRequests

CHECKPOINT_NAME = "checkpoint.npz"
LEGACY_CHECKPOINT_NAME = "checkpoint.pkl"  # v1 pickles: refused, see checkpoint.convert_legacy_checkpoint
METRICS_NAME = "metrics.jsonl"
DEFAULT_MAX_SKIPPED_STEPS = 50


class WriteFailedError(RuntimeError):
  """A checkpoint or metrics write failed (full disk, quota, file-size limit, I/O error). The previous checkpoint
  is intact; ``path`` is the file, ``error`` the `OSError`, ``last_checkpoint_step`` the step the run resumes from."""

  def __init__(self, path: str, error: OSError, last_checkpoint: Optional[str], last_checkpoint_step: int):
    self.path, self.error, self.last_checkpoint_step = path, error, last_checkpoint_step
    reason = f"{error.strerror or error} (errno {error.errno})" if error.errno else str(error)
    where = (f"the last good checkpoint is {last_checkpoint} at meta-step {last_checkpoint_step}; free space (or "
             "fix the disk) and run the same command again to resume from it" if last_checkpoint_step > 0 and
             last_checkpoint else "no checkpoint was written yet")
    super().__init__(f"cannot write {path}: {reason}; {where}.")


class RunDivergedError(RuntimeError):
  """Every meta-update was skipped (no finite estimate) for too many consecutive meta-steps."""


def meta_optimizer(learning_rate: float, decay_steps: int = 0, warmup_steps: Optional[int] = None,
                   end_fraction: float = 0.1) -> optax.GradientTransformation:
  """Adam for the meta-parameters, at a constant ``learning_rate`` (``decay_steps=0``) or on a schedule.

  With ``decay_steps > 0``: a linear warmup from 0 over ``warmup_steps`` meta-steps (default ``min(100,
  decay_steps // 10)``), then a cosine decay to ``end_fraction * learning_rate`` at meta-step ``decay_steps``, constant
  after (`optax.warmup_cosine_decay_schedule`), so a run continued past ``decay_steps`` keeps the final rate. ES
  meta-gradients are noisy; the decay lets theta settle instead of jittering at the noise floor of a constant rate.
  """
  lr = check_positive("learning_rate", learning_rate)
  if isinstance(decay_steps, bool) or not isinstance(decay_steps, (int, np.integer)) or decay_steps < 0:
    raise ValueError(f"decay_steps must be an int >= 0 (0: constant learning rate), got {decay_steps!r}.")
  if not 0 <= end_fraction <= 1:
    raise ValueError(f"end_fraction must lie in [0, 1], got {end_fraction!r}.")
  if decay_steps == 0:
    return optax.adam(lr)
  warmup = min(100, decay_steps // 10) if warmup_steps is None else warmup_steps
  if isinstance(warmup, bool) or not isinstance(warmup, (int, np.integer)) or not 0 <= warmup < decay_steps:
    raise ValueError(f"warmup_steps must be an int in [0, decay_steps={decay_steps}), got {warmup_steps!r}.")
  return optax.adam(optax.warmup_cosine_decay_schedule(0.0, lr, int(warmup), int(decay_steps), end_fraction * lr))


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["theta", "opt_state", "worker_states", "key_data", "step"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class MetaTrainState:
  """Everything a meta-training run needs to continue.

  Attributes:
    theta: the learned optimizer's meta-parameters.
    opt_state: the optax meta-optimizer's state.
    worker_states: tuple, one worker state per estimator.
    key_data: uint32 raw data of the run's base PRNG key (``jax.random.key_data``), checkpoint-friendly.
    step: int32, meta-steps taken.
  """
  theta: Any
  opt_state: Any
  worker_states: tuple
  key_data: jax.Array
  step: jax.Array


class MetaTrainer(DataPytree):
  """Meta-trains ``learned_opt`` with the average of ``estimators``' meta-gradients.

  Args:
    learned_opt: the learned optimizer (``init(key) -> theta``, ``opt_fn(theta)``).
    estimators: one or more `GradientEstimator`s (their gradients are averaged).
    meta_optimizer: an optax transformation (or `optax.chain`) applied to the averaged gradient.
    clip_grad_norm: clip the averaged gradient to this global norm with `optax.clip_by_global_norm` before the
      meta-optimizer (None: no clipping; the same as putting that clip first in a chain, without adding its empty
      state to the checkpointed meta-optimizer state).
    eval_family: family for `evaluate` (held-out instances trained on ``train``, scored on ``eval_split``).
    eval_num_tasks, eval_steps: instances and inner steps per evaluation.
    eval_split: the split scored by `evaluate` (default "test").
    config: JSON-able description of the run, stored in checkpoints; resuming from a checkpoint whose config
      differs is refused.

  A meta-step in which some estimate had no finite step or pair (its ``meta_loss`` is NaN) or whose averaged
  gradient has non-finite entries leaves theta and the meta-optimizer state unchanged; its metrics say
  ``update_skipped = 1`` (the worker states advance as usual).
  """

  _data_fields = ("estimators",)

  def __init__(self, learned_opt: Any, estimators: Sequence[GradientEstimator],
               meta_optimizer: optax.GradientTransformation, clip_grad_norm: Optional[float] = None,
               eval_family: Any = None, eval_num_tasks: int = 8, eval_steps: int = 100, eval_split: str = "test",
               config: Optional[Dict[str, Any]] = None):
    estimators = list(estimators) if isinstance(estimators, (list, tuple)) else [estimators]
    if not estimators:
      raise ValueError("MetaTrainer needs at least one estimator.")
    for i, est in enumerate(estimators):
      if not isinstance(est, GradientEstimator):
        raise TypeError(f"estimators[{i}] is a {type(est).__name__}, not a GradientEstimator (subclass "
                        "metafam.outer_trainers.GradientEstimator and implement init_worker_state and estimate_fn).")
    if clip_grad_norm is not None:
      check_positive("clip_grad_norm", clip_grad_norm)
    meshes = [getattr(est, "mesh", None) for est in estimators]
    device_sets = [None if m is None else tuple(m.devices.flat) for m in meshes]
    if len(set(device_sets)) > 1:
      listing = ", ".join(f"estimators[{i}] ({type(e).__name__}): {'1 device' if d is None else list(d)}"
                          for i, (e, d) in enumerate(zip(estimators, device_sets)))
      raise ValueError(f"all estimators must run on the same devices (build them with the same devices=); "
                       f"got {listing}.")
    self.mesh = meshes[0]
    self.learned_opt, self.estimators, self.meta_optimizer = learned_opt, estimators, meta_optimizer
    self.clip_grad_norm = clip_grad_norm
    self.config = dict(config or {})
    self.config.setdefault("estimators", [type(e).__name__ for e in estimators])
    self.config.setdefault("learned_opt", type(learned_opt).__name__)
    self._step = jax.jit(MetaTrainer.step_fn, donate_argnums=1)  # the trainer passes itself: see step_fn
    self.evaluator = None
    if eval_family is not None:
      # Evaluation is not a collective: on a mesh of several processes each evaluates on its own devices.
      devices = [] if self.mesh is None else sharding.local_devices(self.mesh)
      divides = len(devices) > 1 and eval_num_tasks % len(devices) == 0
      self.evaluator = FamilyEvaluator(eval_family, eval_num_tasks, eval_steps, split=eval_split,
                                       devices=devices if divides else None)

  @property
  def inner_steps_per_meta_step(self) -> int:
    return sum(est.inner_steps_per_estimate for est in self.estimators)

  # -- state ----------------------------------------------------------------------------------------------------
  def init(self, key: jax.Array, theta: Any = None) -> MetaTrainState:
    """A fresh run: theta from ``learned_opt.init`` (unless given), worker states from each estimator."""
    k_theta, k_workers, k_run = jax.random.split(key, 3)
    theta = self.initial_theta(key) if theta is None else sharding.place(theta, self.mesh, lane_major=False)
    workers = tuple(est.init_worker_state(theta, k)
                    for est, k in zip(self.estimators, jax.random.split(k_workers, len(self.estimators))))
    return self.place(MetaTrainState(theta=theta, opt_state=self.meta_optimizer.init(theta), worker_states=workers,
                                     key_data=jax.random.key_data(k_run), step=jnp.asarray(0, jnp.int32)))

  def initial_theta(self, key: jax.Array) -> Any:
    """The theta `init` starts a run with ``key`` from (without building the worker states)."""
    return sharding.place(self.learned_opt.init(jax.random.split(key, 3)[0]), self.mesh, lane_major=False)

  def place(self, state: MetaTrainState) -> MetaTrainState:
    """``state`` on the estimators' devices: worker states split by lane, everything else replicated (outside jit
    it moves the arrays; inside the jitted step it keeps the output laid out like the input, so the next step
    reuses the compiled program). See `metafam.inner.sharding.place`."""
    if self.mesh is None:
      return state
    theta, opt_state, key_data, step = sharding.place((state.theta, state.opt_state, state.key_data, state.step),
                                                      self.mesh, lane_major=False)
    workers = tuple(est.place_worker_state(ws) for est, ws in zip(self.estimators, state.worker_states))
    return MetaTrainState(theta=theta, opt_state=opt_state, worker_states=workers, key_data=key_data, step=step)

  # -- one meta-step --------------------------------------------------------------------------------------------
  def step_fn(self, state: MetaTrainState):
    """Pure meta-step: ``state -> (new state, metrics)``.

    The trainer is a pytree whose leaves are its estimators' device data (`metafam._pytree`), so `step` jits this
    with the trainer as an argument and the data are inputs of the compiled program.
    """
    key = jax.random.fold_in(jax.random.wrap_key_data(state.key_data), state.step)
    keys = jax.random.split(key, len(self.estimators))
    grads, losses, workers, nonfinite = [], [], [], 0.0
    for est, ws, k in zip(self.estimators, state.worker_states, keys):
      estimate, ws = est.estimate_fn(state.theta, ws, k)
      grads.append(estimate.grad)
      losses.append(estimate.meta_loss)
      workers.append(ws)
      nonfinite = nonfinite + estimate.metrics["num_nonfinite"]
    grad = jax.tree.map(lambda *g: sum(g) / len(g), *grads)
    # Skip the update (theta and the meta-optimizer state stay as they are) when an estimate had no finite step or
    # pair (its meta_loss is NaN and its zero gradient carries no information) or the gradient has non-finite
    # entries; `update_skipped` records it. Otherwise this is the plain clipped optax update.
    bad_grad = count_nonfinite(grad)
    skip = (bad_grad > 0) | ~jnp.all(jnp.isfinite(jnp.stack(losses)))
    grad_norm = optax.tree.norm(grad)
    if self.clip_grad_norm is not None:  # stateless, so the meta-optimizer state is the plain optimizer's
      grad, _ = optax.clip_by_global_norm(self.clip_grad_norm).update(grad, optax.EmptyState())
    updates, opt_state = self.meta_optimizer.update(grad, state.opt_state, state.theta)
    theta = optax.apply_updates(state.theta, updates)
    theta, opt_state = optax.tree.where(skip, (state.theta, state.opt_state), (theta, opt_state))
    metrics = {"meta_loss": sum(losses) / len(losses), "grad_norm": grad_norm,
               "num_nonfinite": jnp.asarray(nonfinite, jnp.float32), "nonfinite_grad_entries": bad_grad,
               "update_skipped": skip.astype(jnp.float32)}
    for est, loss in zip(self.estimators, losses):
      metrics[f"meta_loss/{est.name}"] = loss
    new_state = MetaTrainState(theta=theta, opt_state=opt_state, worker_states=tuple(workers),
                               key_data=state.key_data, step=state.step + 1)
    return self.place(new_state), metrics

  def step(self, state: MetaTrainState):
    """One jitted meta-step (``state`` is donated: use the returned one)."""
    return self._step(self, state)

  # -- evaluation -------------------------------------------------------------------------------------------------
  def evaluate(self, theta: Any, key: jax.Array) -> Dict[str, Any]:
    """Trains ``eval_num_tasks`` fresh instances for ``eval_steps`` steps with ``opt_fn(theta)``.

    Returns the normalized ``eval_split`` loss after each step averaged over instances (``eval_curve``), its last
    value and its mean (see `metafam.evaluation.family_eval.FamilyEvaluator`).
    """
    if self.evaluator is None:
      raise ValueError("MetaTrainer was built without eval_family; pass one to evaluate.")
    if self.multi_process:  # each process evaluates on its own devices: a host copy of the replicated theta
      theta = distributed.to_host(theta)
    curve = self.evaluator.evaluate(self.learned_opt, theta, key)
    return {"eval_final_loss": float(curve[-1]), "eval_mean_loss": float(np.mean(curve)), "eval_curve": curve}

  # -- checkpoints ------------------------------------------------------------------------------------------------
  @property
  def multi_process(self) -> bool:
    """Whether the lanes are spread over the devices of several processes (`metafam.distributed`)."""
    return sharding.is_multi_process(self.mesh)

  @property
  def is_main_process(self) -> bool:
    """True except on processes other than 0 of a multi-process run."""
    return not self.multi_process or distributed.is_main_process()

  def save(self, state: MetaTrainState, path: str) -> None:
    """Writes ``state`` to ``path`` atomically. On several processes the lanes are gathered first (every process
    must call this) and process 0 writes the global state: a checkpoint does not depend on the process count."""
    tree = distributed.to_host(state) if self.multi_process else state
    if self.is_main_process:
      checkpoint.save(path, tree, {"step": int(tree.step), "config": self.config})

  def restore(self, path: str, like: MetaTrainState) -> MetaTrainState:
    """Loads a checkpoint written by `save` for a run with the same config; ``like`` gives the expected structure.

    The config (stored as JSON) is checked first, then the state is rebuilt into ``like``'s types (structure, shapes
    and dtypes must match; see `checkpoint.load`). Legacy pickle checkpoints are refused without being unpickled.
    On several processes (every one must call this) process 0 reads the file and broadcasts the state, which is
    then split over this run's devices, whatever the process count of the run that wrote it; an error on process 0
    stops every process.
    """
    if not self.multi_process:
      return self.place(jax.tree.map(jnp.asarray, self._read(path, like)))
    like = distributed.to_host(like)
    tree, error = like, None
    if distributed.is_main_process():
      try:
        tree = self._read(path, like)
      except (checkpoint.CheckpointError, OSError) as e:
        error = e
    distributed.raise_if_any(error)
    return self.place(distributed.from_main_process(tree))

  def _read(self, path: str, like: Any) -> Any:
    self.check_checkpoint(path, read_theta=False)
    tree, _ = checkpoint.load(path, like=like)
    checkpoint.check_finite(tree.theta, path, "meta-parameter theta")
    return tree

  def check_checkpoint(self, path: str, read_theta: bool = True) -> None:
    """Raises `checkpoint.CheckpointError` unless ``path`` is a checkpoint of this run (same config) whose theta is
    finite (``read_theta``); cheap next to compiling, so a resume checks it first."""
    metadata = checkpoint.read_metadata(path)
    mine = json.loads(json.dumps(self.config, sort_keys=True))  # as stored: tuples become lists
    if metadata.get("config") != mine:
      raise checkpoint.CheckpointError(
          f"{path} belongs to a different run: its config is {json.dumps(metadata.get('config'), sort_keys=True)}, "
          f"this run's is {json.dumps(mine, sort_keys=True)}.")
    if read_theta:
      header, tree = checkpoint.read(path)
      if header.root_class == "MetaTrainState":
        checkpoint.check_finite(tree["theta"], path, "meta-parameter theta")

  # -- memory -----------------------------------------------------------------------------------------------------
  def abstract_state(self, key: jax.Array) -> MetaTrainState:
    """The `MetaTrainState` `init` would build, as ``jax.ShapeDtypeStruct``s laid out like the real one (nothing is
    allocated or computed)."""
    shapes = jax.eval_shape(self.init, key)
    if self.mesh is None:
      return shapes
    rep = sharding.replicated(self.mesh)
    workers = tuple(sharding.layout_shardings(est.lane_major(ws), self.mesh)
                    for est, ws in zip(self.estimators, shapes.worker_states))
    layout = MetaTrainState(theta=jax.tree.map(lambda _: rep, shapes.theta),
                            opt_state=jax.tree.map(lambda _: rep, shapes.opt_state), worker_states=workers,
                            key_data=rep, step=rep)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, layout)

  def memory_estimate(self, key: jax.Array) -> resources.MemoryEstimate:
    """XLA's memory analysis of the compiled meta-step (per device), from shapes alone. The program compiled here is
    the one `step` then runs (same shapes and layout), so the check costs no second compilation."""
    return resources.program_memory(self._step.lower(self, self.abstract_state(key)).compile())

  def check_memory(self, key: jax.Array) -> resources.MemoryEstimate:
    """`memory_estimate`, raising `metafam.resources.InsufficientMemoryError` (both numbers in the message) when
    the meta-step cannot fit in what this process's devices can give."""
    estimate = self.memory_estimate(key)
    devices = jax.local_devices() if self.mesh is None else sharding.local_devices(self.mesh)
    resources.check_fits(estimate, devices[:1] if self.mesh is None else devices, "the meta-step")
    return estimate

  # -- the loop ---------------------------------------------------------------------------------------------------
  def train(self, num_steps: int, key: Optional[jax.Array] = None, state: Optional[MetaTrainState] = None,
            output_dir: Optional[str] = None, checkpoint_every: int = 50, eval_every: Optional[int] = None,
            progress: bool = True, log_fn: Optional[Callable[[Dict[str, Any]], None]] = None,
            handle_signals: bool = False, max_skipped_steps: Optional[int] = DEFAULT_MAX_SKIPPED_STEPS,
            check_memory: bool = True, lock_output_dir: bool = True):
    """Runs meta-steps until ``state.step == num_steps``; returns ``(state, history)``.

    With ``output_dir``, an existing checkpoint there is resumed (refused if it belongs to a different run or holds
    non-finite meta-parameters), a checkpoint is written atomically every ``checkpoint_every`` steps and at the
    end, and every logged record is appended to ``metrics.jsonl`` (strict JSON: a non-finite value, e.g. the NaN
    meta-loss of a step whose update was skipped, is written as null; `read_metrics` reads it back as NaN). With
    ``eval_every`` and an ``eval_family``, `evaluate` runs every that many steps and at the end (held-out instances,
    key derived from the step). ``history`` is the list of records (step, metrics, inner steps/s, and eval results
    where evaluated).

    Failures (each leaves the last checkpoint loadable, and a rerun resumes exactly):

    * ``handle_signals``: SIGTERM / SIGINT finish the meta-step in flight (on several processes: the step they all
      agree on), write its metrics and a checkpoint, and raise `metafam.outer_trainers.preemption.Preempted`.
    * A failed write of a checkpoint or of ``metrics.jsonl`` raises `WriteFailedError`; the previous checkpoint is
      untouched (writes are atomic) and no partial metrics line is left.
    * ``max_skipped_steps``: that many consecutive skipped updates (every estimate non-finite) raise
      `RunDivergedError` naming the step and the last checkpoint (None: never stop).
    * ``check_memory``: before anything is allocated, the compiled meta-step's memory is compared with what the
      devices can give (`check_memory`); `metafam.resources.InsufficientMemoryError` if it cannot fit.
    * ``lock_output_dir``: ``output_dir`` is locked for the run (`metafam.io.DirectoryLock`); a second run into it
      raises `metafam.io.DirectoryBusyError` before changing anything. Pass False when the caller holds the lock.
    """
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 0:
      raise ValueError(f"num_steps must be a non-negative int (not a bool), got {num_steps!r}.")
    check_positive("checkpoint_every", checkpoint_every, integer=True)
    if max_skipped_steps is not None:
      check_positive("max_skipped_steps", max_skipped_steps, integer=True)
    if eval_every is not None:
      check_positive("eval_every", eval_every, integer=True)
      if self.evaluator is None:
        raise ValueError("eval_every needs an eval_family (MetaTrainer(..., eval_family=...)).")
    writes = bool(output_dir) and self.is_main_process  # on several processes only process 0 touches output_dir
    lock = DirectoryLock(output_dir) if writes and lock_output_dir else None
    if lock is not None:
      lock.acquire()
    try:
      with (StopRequests() if handle_signals else _NoStopRequests()) as stop:
        return self._train(num_steps, key, state, output_dir, writes, checkpoint_every, eval_every, progress,
                           log_fn, stop, max_skipped_steps, check_memory)
    finally:
      if lock is not None:
        lock.release()

  def _train(self, num_steps, key, state, output_dir, writes, checkpoint_every, eval_every, progress, log_fn, stop,
             max_skipped_steps, check_memory):
    ckpt = os.path.join(output_dir, CHECKPOINT_NAME) if output_dir else None
    metrics_path = os.path.join(output_dir, METRICS_NAME) if output_dir else None
    had_checkpoint, error = False, None
    if writes:
      try:
        legacy = os.path.join(output_dir, LEGACY_CHECKPOINT_NAME)
        if not os.path.exists(ckpt) and os.path.exists(legacy):  # refuse rather than silently start over
          raise checkpoint.legacy_error(legacy, ckpt)
        os.makedirs(output_dir, exist_ok=True)
        had_checkpoint = os.path.exists(ckpt)
        if had_checkpoint and state is None:  # a checkpoint that will be refused is refused before compiling
          self.check_checkpoint(ckpt)
      except (checkpoint.CheckpointError, OSError) as e:
        error = e
    if self.multi_process:  # every process stops on process 0's error, and resumes when it does
      distributed.raise_if_any(error)
      had_checkpoint = distributed.broadcast_flag(had_checkpoint)
    elif error is not None:
      raise error
    if state is None:
      key = jax.random.key(0) if key is None else key
      if check_memory and num_steps > 0:
        self.check_memory(key)
      state = self.init(key)
      if had_checkpoint:
        state = self.restore(ckpt, state)
        if writes:
          self._write(metrics_path, lambda: _truncate_metrics(metrics_path, int(state.step)), ckpt, int(state.step))
    history: List[Dict[str, Any]] = []
    start_step = last_saved = int(state.step)
    skipped_in_a_row = 0
    bar = tqdm(total=num_steps, initial=start_step, desc="meta-train", unit="step", disable=not progress)
    try:
      while int(state.step) < num_steps:
        t0 = time.perf_counter()
        state, metrics = self.step(state)
        record = {k: float(v) for k, v in jax.device_get(metrics).items()}
        elapsed = time.perf_counter() - t0
        step = int(state.step)
        record.update(step=step, seconds=elapsed, inner_steps_per_s=self.inner_steps_per_meta_step / elapsed)
        # On several processes only process 0 evaluates (on its own devices); the others go on to the next step.
        if eval_every and (step % eval_every == 0 or step == num_steps) and self.is_main_process:
          result = self.evaluate(state.theta, jax.random.fold_in(jax.random.key(12345), step))
          record.update(eval_final_loss=float(result["eval_final_loss"]),
                        eval_mean_loss=float(result["eval_mean_loss"]))
        history.append(record)
        bar.update(1)
        bar.set_postfix(meta_loss=f"{record['meta_loss']:.4f}", grad_norm=f"{record['grad_norm']:.3g}")
        if writes:
          line = json.dumps(_finite_or_null(record), allow_nan=False)
          self._write(metrics_path, lambda: append_line(metrics_path, line), ckpt, last_saved)
        stopping = stop.requested(step)
        if output_dir and (step % checkpoint_every == 0 or step == num_steps or stopping):
          self._write(ckpt, lambda: self.save(state, ckpt), ckpt, last_saved)
          last_saved = step
        if log_fn is not None:
          log_fn(record)
        if stopping:
          raise Preempted(step, ckpt, stop.signal_name, state)
        skipped_in_a_row = skipped_in_a_row + 1 if record["update_skipped"] else 0
        if max_skipped_steps is not None and skipped_in_a_row >= max_skipped_steps:
          where = f"{ckpt} at meta-step {last_saved}" if output_dir and last_saved > 0 else "none was written"
          raise RunDivergedError(
              f"meta-step {step}: the last {skipped_in_a_row} meta-updates were all skipped (no estimate had a "
              f"finite meta-loss or gradient), so the run has gone bad; the last good checkpoint: {where}. Likely "
              "causes: the inner training diverges for every perturbed lane (learning rate, step_mult or sigma too "
              "large), non-finite data, or a meta-learning rate that drove theta somewhere unstable; "
              "max_skipped_steps sets the limit.")
    except Exception as e:
      if not (self.multi_process and distributed.is_peer_failure(e)):
        raise
      where = f"the last checkpoint is at step {last_saved}" if output_dir else "nothing was checkpointed"
      raise distributed.PeerFailureError(
          f"process {jax.process_index()}: another process of this run stopped after meta-step "
          f"{start_step + len(history)} ({' '.join(str(e).split())[:160]}); {where}: start all "
          f"{jax.process_count()} processes again to resume.") from None
    finally:
      bar.close()
    if output_dir and int(state.step) == start_step and not had_checkpoint:
      self._write(ckpt, lambda: self.save(state, ckpt), ckpt, last_saved)
    return state, history

  def _write(self, path: str, write: Callable[[], None], ckpt: Optional[str], last_saved: int) -> None:
    """Runs ``write``; an `OSError` becomes `WriteFailedError` naming ``path`` and the last good checkpoint."""
    try:
      write()
    except OSError as e:
      raise WriteFailedError(path, e, ckpt, last_saved) from e


class _NoStopRequests:
  """`StopRequests` when signals are not handled: never asks to stop."""

  signal_name = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return None

  def requested(self, step: int) -> bool:
    return False


def _finite_or_null(record: Dict[str, Any]) -> Dict[str, Any]:
  """``record`` with non-finite floats (a skipped step's NaN meta-loss) as None: JSON has no NaN, so they are null."""
  return {k: None if isinstance(v, float) and not np.isfinite(v) else v for k, v in record.items()}


def _read_records(path: str) -> Tuple[List[Dict[str, Any]], Optional[str]]:
  """The JSON records of a ``metrics.jsonl`` and, if its last line was cut short by a crash, that line (dropped).

  Only the last line may be partial (every complete record ends with a newline); a bad line before it is corruption,
  not a crash, and raises ValueError naming the line.
  """
  with open(path, "rb") as f:
    data = f.read()
  lines = data.split(b"\n")
  tail = lines.pop()  # after the final newline: b"" unless the last write was cut short
  records, partial = [], None
  for number, line in enumerate(lines, start=1):
    if line.strip():
      try:
        records.append(json.loads(line))
      except ValueError:
        raise ValueError(f"{path}: line {number} is not a JSON record: {line[:80]!r}") from None
  if tail.strip():
    try:  # a last record whose newline alone is missing is still whole
      records.append(json.loads(tail))
    except ValueError:
      partial = tail.decode(errors="replace")
  return records, partial


def _warn_partial(path: str, partial: str) -> None:
  warnings.warn(f"{path}: dropped a partial last line left by a crash ({partial[:60]!r}...)", RuntimeWarning,
                stacklevel=3)


def read_metrics(path: str) -> List[Dict[str, Any]]:
  """The records of a ``metrics.jsonl`` written by `MetaTrainer.train`, with null values read back as NaN.

  A partial last line (a crash while it was written) is dropped with a `RuntimeWarning`; a resumed run rewrites
  the file without it.
  """
  records, partial = _read_records(path)
  if partial is not None:
    _warn_partial(path, partial)
  return [{k: float("nan") if v is None else v for k, v in r.items()} for r in records]


def _truncate_metrics(path: str, step: int) -> None:
  """Keeps one record per step up to ``step`` (the records past it ran after the last checkpoint and will run
  again; a partial last line is dropped, with one warning), atomically."""
  if not os.path.exists(path):
    return
  records, partial = _read_records(path)
  if partial is not None:
    _warn_partial(path, partial)
  kept, seen = [], set()
  for record in records:
    at = record.get("step", 0)
    if at <= step and at not in seen:
      seen.add(at)
      kept.append(json.dumps(record, allow_nan=False) + "\n")
  atomic_write(path, "".join(kept).encode())
