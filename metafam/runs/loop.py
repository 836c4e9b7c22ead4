"""The meta-training loop: `train` runs a trainer's meta-steps, with checkpoints, metrics, evaluation and signals.

`train` works on any trainer shaped like `metafam.outer_trainers.meta_trainer.MetaTrainer` (``init``, ``place``,
``step_packed``, ``memory_estimate``, ``mesh``; this module does not import it). The run directory's files, the
run identity a checkpoint stores, the refusal rule and whether a checkpoint belongs to the run are
`metafam.runs.run_dir`; evaluation is the ``evaluate`` callback (e.g.
`metafam.runs.validation.MetaValidation`, the meta-validation curve).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

import jax
import numpy as np
from tqdm.auto import tqdm

from metafam import distributed, resources
from metafam._checks import check_number, check_positive
from metafam.inner import sharding
from metafam.io import append_line
from metafam.io import lock_output_dir as _lock_dir
from metafam.runs import checkpoint
from metafam.runs.nonfinite_log import NonFiniteLog
from metafam.runs.preemption import Preempted, StopRequests
from metafam.runs.run_dir import (CHECKPOINT_NAME, METRICS_NAME, WriteFailedError, check_checkpoint, finite_or_null,
                                  holding, restore, run_identity, save, truncate_metrics)

DEFAULT_MAX_SKIPPED_STEPS = 50
Evaluate = Callable[[Any, int], Mapping[str, float]]  # (theta, meta-step) -> numbers for the step's record


class RunDivergedError(RuntimeError):
  """Every meta-update was skipped (no finite estimate) for too many consecutive meta-steps."""


def check_memory(trainer: Any, key: jax.Array) -> resources.MemoryEstimate:
  """`MetaTrainer.memory_estimate`, raising `metafam.resources.InsufficientMemoryError` (both numbers in the
  message) when the meta-step cannot fit in what this process's devices can give."""
  estimate = trainer.memory_estimate(key)
  devices = jax.local_devices() if trainer.mesh is None else sharding.local_devices(trainer.mesh)
  resources.check_fits(estimate, devices[:1] if trainer.mesh is None else devices, "the meta-step")
  return estimate


def train(trainer: Any, num_steps: int, *, key: Optional[jax.Array] = None, state: Optional[Any] = None,
          output_dir: Optional[str] = None, identity: Optional[Mapping[str, Any]] = None,
          checkpoint_every: int = 50, evaluate: Optional[Evaluate] = None, eval_every: Optional[int] = None,
          progress: bool = True, log_fn: Optional[Callable[[Dict[str, Any]], None]] = None,
          handle_signals: bool = False, max_skipped_steps: Optional[int] = DEFAULT_MAX_SKIPPED_STEPS,
          check_memory: bool = True, lock_output_dir: bool = True,
          finish: Optional[Callable[[Any, List[Dict[str, Any]]], Any]] = None):
  """Runs ``trainer``'s meta-steps until ``state.step == num_steps``; returns ``(state, history)``, or with
  ``finish`` ``(state, history, finish(state, history))``.

  With ``output_dir``, an existing checkpoint there is resumed (refused if it belongs to a different run or holds
  non-finite meta-parameters), a checkpoint is written atomically every ``checkpoint_every`` steps and at the
  end, and every logged record is appended to ``metrics.jsonl`` (see `metafam.runs.run`). ``history`` is
  the list of this call's records (step, metrics, inner steps/s, and the evaluation's numbers where evaluated).

  Args:
    trainer: a `metafam.outer_trainers.meta_trainer.MetaTrainer`.
    num_steps: train until the state's step is this.
    key: a fresh run's key (default ``key(0)``); state: start from this state instead (no checkpoint is read).
    output_dir: the run directory (None: nothing is written or resumed).
    identity: the run's identity stored in its checkpoints (`run_dir.run_identity` completes it; default: the
      trainer's estimators and learned optimizer).
    checkpoint_every: meta-steps between checkpoints.
    evaluate: ``evaluate(theta, step) -> {name: number}`` (e.g. `metafam.runs.validation.MetaValidation`),
      called every ``eval_every`` meta-steps and at the last one; its numbers join the step's record.
    log_fn: called with every record (e.g. `metafam.runs.run.tensorboard_logger`).
    finish: called with the final state and the history while the directory is still locked (a closing report).

  Failures (each leaves the last checkpoint loadable, and a rerun resumes exactly):

  * ``handle_signals``: SIGTERM / SIGINT finish the meta-step in flight (on several processes: the step they all
    agree on), write its metrics and a checkpoint, and raise `metafam.runs.preemption.Preempted`.
  * A failed write of a checkpoint or of ``metrics.jsonl`` raises `WriteFailedError`; the previous checkpoint is
    untouched (writes are atomic) and no partial metrics line is left.
  * ``max_skipped_steps``: that many consecutive skipped updates (every estimate non-finite) raise
    `RunDivergedError` naming the step and the last checkpoint (None: never stop).
  * Masked inner steps and skipped updates are reported as ``trainer.on_nonfinite`` says
    (`metafam.runs.nonfinite_log.NonFiniteLog`: a warning at the first of each, a summary at the end).
  * ``check_memory``: before anything is allocated, the compiled meta-step's memory is compared with what the
    devices can give (`check_memory`); `metafam.resources.InsufficientMemoryError` if it cannot fit.
  * ``lock_output_dir``: ``output_dir`` is created, proven writable and locked for the run
    (`metafam.io.lock_output_dir`); a second run into it raises `metafam.io.DirectoryBusyError` before changing
    anything, and a refused run restores the lock file.
  """
  if eval_every is not None:
    check_positive("eval_every", eval_every, integer=True)
    if evaluate is None:
      raise ValueError("eval_every needs evaluate= (e.g. metafam.runs.validation.MetaValidation).")
  elif evaluate is not None:  # it would never be called
    raise ValueError("evaluate= needs eval_every= (meta-steps between its calls; it also runs at the last one).")
  loop = Loop(trainer, output_dir, checkpoint_every, eval_every, progress, log_fn, max_skipped_steps,
              identity=run_identity(trainer, identity), evaluate=evaluate)
  lock = _lock_dir(output_dir) if loop.writes and lock_output_dir else None
  with holding(lock, loop):
    state, history = loop.train(num_steps, key=key, state=state, handle_signals=handle_signals, memory=check_memory)
    return (state, history) if finish is None else (state, history, finish(state, history))


@dataclasses.dataclass
class Loop:
  """The state of one `train` call: where it writes, what it wrote, and its settings."""
  trainer: Any
  output_dir: Optional[str]
  checkpoint_every: int
  eval_every: Optional[int]
  progress: bool
  log_fn: Optional[Callable[[Dict[str, Any]], None]]
  max_skipped_steps: Optional[int]
  identity: Optional[Mapping[str, Any]] = None
  evaluate: Optional[Evaluate] = None
  wrote: bool = False

  def __post_init__(self):
    self.writes = bool(self.output_dir) and self.trainer.is_main_process  # on several processes: process 0 only
    self.ckpt = os.path.join(self.output_dir, CHECKPOINT_NAME) if self.output_dir else None
    self.metrics_path = os.path.join(self.output_dir, METRICS_NAME) if self.output_dir else None
    self.last_saved = 0
    self.nonfinite = NonFiniteLog(self.trainer)

  def train(self, num_steps: int, *, key: Optional[jax.Array], state: Optional[Any], handle_signals: bool,
            memory: bool):
    check_number("num_steps", num_steps, low=0, integer=True)
    check_positive("checkpoint_every", self.checkpoint_every, integer=True)
    if self.max_skipped_steps is not None:
      check_positive("max_skipped_steps", self.max_skipped_steps, integer=True)
    with StopRequests() if handle_signals else contextlib.nullcontext() as stop:
      state, had_checkpoint = self.start(num_steps, key, state, memory)
      return self.run(state, num_steps, had_checkpoint, stop)

  def write(self, path: str, write: Callable[[], None]) -> None:
    """Runs ``write``; an `OSError` becomes `WriteFailedError` naming ``path`` and the last good checkpoint."""
    self.wrote = True
    try:
      write()
    except OSError as e:
      raise WriteFailedError(path, e, self.ckpt, self.last_saved) from e

  def start(self, num_steps: int, key: Optional[jax.Array], state: Optional[Any], memory: bool):
    """The state to start from (a checkpoint in the directory, else ``state``, else a fresh one): checks first,
    then compiles and restores; returns ``(state, whether the directory had a checkpoint)``."""
    trainer, had_checkpoint, error = self.trainer, False, None
    if self.writes:
      try:
        os.makedirs(self.output_dir, exist_ok=True)
        had_checkpoint = os.path.exists(self.ckpt)
        if had_checkpoint and state is None:  # a checkpoint that will be refused is refused before compiling
          check_checkpoint(self.ckpt, self.identity)
      except (checkpoint.CheckpointError, OSError) as e:
        error = e
    if trainer.multi_process:  # every process stops on process 0's error, and resumes when it does
      distributed.raise_if_any(error)
      had_checkpoint = distributed.broadcast_flag(had_checkpoint)
    elif error is not None:
      raise error
    if state is None:
      key = jax.random.key(0) if key is None else key
      if memory and num_steps > 0:
        check_memory(trainer, key)
      state = trainer.init(key)
      if had_checkpoint:
        state = restore(trainer, self.ckpt, state, self.identity)
        if self.writes:
          self.write(self.metrics_path, lambda: truncate_metrics(self.metrics_path, int(state.step)))
    self.last_saved = int(state.step)
    return state, had_checkpoint

  def run(self, state: Any, num_steps: int, had_checkpoint: bool, stop: Any):
    """The meta-steps. The host never waits for the device between two steps: step ``k + 1`` is dispatched before
    step ``k``'s metrics are fetched, so the device always has the next step queued while the host logs. A step
    whose state the host needs (evaluation, checkpoint, stop, the last step) is finished before the next dispatch."""
    trainer = self.trainer
    history: List[Dict[str, Any]] = []
    step = start_step = int(state.step)
    bar = tqdm(total=num_steps, initial=start_step, desc="meta-train", unit="step", disable=not self.progress)
    clock = {"last": time.perf_counter(), "skipped_in_a_row": 0}
    pending = None  # (step, its metrics' names, their values on the device): dispatched, not yet recorded
    try:
      while step < num_steps:
        state, metrics, packed = trainer.step_packed(state)
        step += 1
        if pending is not None:
          history.append(self.record(*pending, state=None, num_steps=num_steps, clock=clock, bar=bar))
          self.check_skipped(history[-1], clock)
        pending = (step, sorted(metrics), packed)
        stopping = stop is not None and stop.requested(step)
        checkpoint_due = self.output_dir and (step % self.checkpoint_every == 0 or step == num_steps or stopping)
        eval_due = self.eval_every and (step % self.eval_every == 0 or step == num_steps)
        if checkpoint_due or eval_due or stopping:
          history.append(self.record(*pending, state=state, num_steps=num_steps, clock=clock, bar=bar))
          pending = None
        if checkpoint_due:
          self.write(self.ckpt, lambda: save(trainer, state, self.ckpt, self.identity))
          self.last_saved = step
        if stopping:
          raise Preempted(step, self.ckpt, stop.signal_name, state)
        if pending is None:
          self.check_skipped(history[-1], clock)
      if pending is not None:
        history.append(self.record(*pending, state=state, num_steps=num_steps, clock=clock, bar=bar))
        self.check_skipped(history[-1], clock)
    except Exception as e:
      if not (trainer.multi_process and distributed.is_peer_failure(e)):
        raise
      where = f"the last checkpoint is at step {self.last_saved}" if self.output_dir else "nothing was checkpointed"
      raise distributed.PeerFailureError(
          f"process {jax.process_index()}: another process of this run stopped after meta-step "
          f"{start_step + len(history)} ({' '.join(str(e).split())[:160]}); {where}: start all "
          f"{jax.process_count()} processes again to resume.") from None
    finally:
      bar.close()
    if trainer.is_main_process:
      self.nonfinite.summary(num_steps)
    if self.output_dir and step == start_step and not had_checkpoint:
      self.write(self.ckpt, lambda: save(trainer, state, self.ckpt, self.identity))
    return state, history

  def record(self, step: int, names: List[str], packed: jax.Array, *, state: Optional[Any],
             num_steps: int, clock: Dict[str, Any], bar: Any) -> Dict[str, Any]:
    """Meta-step ``step``'s record: its metrics fetched from the device in one copy (waiting for the step to finish;
    ``packed``: `MetaTrainer.step_packed`'s vector, in the order of ``names``), its wall time since the previous
    record, and (given the step's ``state``, when due) the evaluation; written to ``metrics.jsonl`` and logged."""
    trainer = self.trainer
    record = dict(zip(names, np.asarray(jax.device_get(packed)).tolist()))
    now = time.perf_counter()
    elapsed, clock["last"] = now - clock["last"], now
    record.update(step=step, seconds=elapsed, inner_steps_per_s=trainer.inner_steps_per_meta_step / elapsed)
    # On several processes only process 0 evaluates (on its own devices); the others go on to the next step.
    if (state is not None and self.eval_every and (step % self.eval_every == 0 or step == num_steps)
        and trainer.is_main_process):
      record.update({k: float(v) for k, v in self.evaluate(state.theta, step).items()})
      clock["last"] = time.perf_counter()  # the evaluation's time is not the next step's
    if self.progress:
      bar.update(1)
      bar.set_postfix(meta_loss=f"{record['meta_loss']:.4f}", grad_norm=f"{record['grad_norm']:.3g}")
    if self.writes:
      line = json.dumps(finite_or_null(record), allow_nan=False)
      self.write(self.metrics_path, lambda: append_line(self.metrics_path, line))
    if self.log_fn is not None:
      self.log_fn(record)
    if trainer.is_main_process or self.nonfinite.on_nonfinite == "raise":  # every process raises at the same step
      self.nonfinite.observe(record)
    return record

  def check_skipped(self, record: Dict[str, Any], clock: Dict[str, Any]) -> None:
    """Raises `RunDivergedError` after ``max_skipped_steps`` skipped updates in a row (counted in ``clock``)."""
    step = record["step"]
    clock["skipped_in_a_row"] = clock["skipped_in_a_row"] + 1 if record["update_skipped"] else 0
    if self.max_skipped_steps is not None and clock["skipped_in_a_row"] >= self.max_skipped_steps:
      where = (f"{self.ckpt} at meta-step {self.last_saved}" if self.output_dir and self.last_saved > 0
               else "none was written")
      raise RunDivergedError(
          f"meta-step {step}: the last {clock['skipped_in_a_row']} meta-updates were all skipped (no estimate had "
          f"a finite meta-loss or gradient), so the run has gone bad; the last good checkpoint: {where}. Likely "
          "causes: the inner training diverges for every perturbed lane (learning rate, step_mult or sigma too "
          "large), non-finite data, or a meta-learning rate that drove theta somewhere unstable; "
          "max_skipped_steps sets the limit.")

