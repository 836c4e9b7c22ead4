"""A meta-training run: a `Recipe` meta-trained into a run directory, resumable, and its closing report.

`MetaTrainingRun` is what ``metafam meta-train`` runs (the command line only parses flags into a `Recipe`, calls it
and prints); `train` is its loop, usable on any `MetaTrainer` (``MetaTrainer.train`` calls it).

A run directory holds, for one run identity (`Recipe.identity`: the recipe less its name, prose and length, plus the
seed):

* ``.metafam.lock``: the ``flock`` of the process running in the directory (`metafam.io.DirectoryLock`), holding its
  pid. Written when a run takes the directory; a run refused after that (another run's or a corrupted checkpoint, a
  meta-step too large for memory) gives the file back its bytes, so a refusal changes nothing.
* ``checkpoint.npz``: the whole `MetaTrainState` and ``{"step", "config": identity}``
  (`metafam.outer_trainers.checkpoint`), written atomically every ``checkpoint_every`` meta-steps, at the last one,
  and on SIGTERM / SIGINT at the step in flight; a fresh run of 0 steps writes its initial state. A rerun resumes
  from it, bit for bit.
* ``metrics.jsonl``: one strict-JSON record per meta-step (non-finite values as null), appended after each step; on
  resume the records past the checkpoint (they run again) and a partial last line left by a crash are dropped.
* ``summary.json``, ``meta_loss.png``, ``inner_curves.png``: the closing report (`MetaTrainingRun.report`:
  the learned optimizer before and after against Adam tuned on ``inner_valid``, on held-out test instances),
  written once after the last meta-step (`metafam.evaluation.report`).
* ``tensorboard/``: with a TensorBoard ``log_fn`` (the command line's ``--tensorboard``).

On several processes (`metafam.distributed`) every process runs the meta-steps; process 0 alone locks the directory,
writes every file and evaluates. Failures (docs/guide/failures.md) raise `WriteFailedError` (a write failed; the last
checkpoint is intact), `RunDivergedError` (``max_skipped_steps`` consecutive skipped updates) or
`metafam.outer_trainers.preemption.Preempted` (stopped by a signal after a checkpoint).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from metafam import distributed, resources
from metafam._checks import check_number, check_positive
from metafam.inner import sharding
from metafam.io import DirectoryLock, append_line, atomic_write
from metafam.io import lock_output_dir as _lock_dir
from metafam.outer_trainers import checkpoint
from metafam.outer_trainers.meta_trainer import MetaTrainer, MetaTrainState
from metafam.outer_trainers.preemption import Preempted, StopRequests
from metafam.outer_trainers.recipes import Recipe, stored_identity

CHECKPOINT_NAME = "checkpoint.npz"
LEGACY_CHECKPOINT_NAME = "checkpoint.pkl"  # v1 pickles: refused, see checkpoint.convert_legacy_checkpoint
METRICS_NAME = "metrics.jsonl"
DEFAULT_MAX_SKIPPED_STEPS = 50
EVAL_KEY = 12345  # evaluations during training use fold_in(key(EVAL_KEY), step): the same instances in every run
REPORT_KEY_OFFSET = 1_000_003  # the closing report's instances: key(seed + this), apart from the run's own streams
# Refusals: a run stopped by one of these before writing anything leaves the directory as it found it.
REFUSALS = (checkpoint.CheckpointError, resources.InsufficientMemoryError, ValueError)


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


# -- checkpoints of a trainer's state --------------------------------------------------------------------------------
def save(trainer: MetaTrainer, state: MetaTrainState, path: str) -> None:
  """Writes ``state`` to ``path`` atomically with ``{"step", "config": trainer.config}``. On several processes the
  lanes are gathered first (every process must call this) and process 0 writes the global state: a checkpoint does
  not depend on the process count."""
  tree = distributed.to_host(state) if trainer.multi_process else state
  if trainer.is_main_process:
    checkpoint.save(path, tree, {"step": int(tree.step), "config": trainer.config})


def restore(trainer: MetaTrainer, path: str, like: MetaTrainState) -> MetaTrainState:
  """Loads a checkpoint written by `save` for the same run (`check_checkpoint`); ``like`` gives the structure.

  The state is rebuilt into ``like``'s types (structure, shapes and dtypes must match; see `checkpoint.load`). On
  several processes (every one must call this) process 0 reads the file and broadcasts the state, which is then split
  over this run's devices, whatever the process count of the run that wrote it; an error on process 0 stops every
  process.
  """
  def read(like):
    check_checkpoint(trainer, path, read_theta=False)
    tree, _ = checkpoint.load(path, like=like)
    checkpoint.check_finite(tree.theta, path, "meta-parameter theta")
    return tree

  if not trainer.multi_process:
    return trainer.place(jax.tree.map(jnp.asarray, read(like)))
  like = distributed.to_host(like)
  tree, error = like, None
  if distributed.is_main_process():
    try:
      tree = read(like)
    except (checkpoint.CheckpointError, OSError) as e:
      error = e
  distributed.raise_if_any(error)
  return trainer.place(distributed.from_main_process(tree))


def same_run(stored: Any, mine: Any) -> bool:
  """Whether a checkpoint's stored config and ``mine`` (a trainer's config) name the same run: equal recipe
  identities (`metafam.outer_trainers.recipes.stored_identity`, which reads every version's configs), or else equal
  as JSON."""
  mine = json.loads(json.dumps(mine, sort_keys=True))  # as stored: tuples become lists
  identities = stored_identity(stored), stored_identity(mine)
  return identities[0] == identities[1] if identities[1] is not None else stored == mine


def check_checkpoint(trainer: MetaTrainer, path: str, read_theta: bool = True) -> None:
  """Raises `checkpoint.CheckpointError` unless ``path`` is a checkpoint of this run (`same_run`) whose theta is
  finite (``read_theta``); cheap next to compiling, so a resume checks it first."""
  stored = checkpoint.read_metadata(path).get("config")
  if not same_run(stored, trainer.config):
    raise checkpoint.CheckpointError(
        f"{path} belongs to a different run: its config is {json.dumps(stored, sort_keys=True)}, this run's is "
        f"{json.dumps(trainer.config, sort_keys=True)}.")
  if read_theta:
    header, tree = checkpoint.read(path)
    if header.root_class == "MetaTrainState":
      checkpoint.check_finite(tree["theta"], path, "meta-parameter theta")


def check_memory(trainer: MetaTrainer, key: jax.Array) -> resources.MemoryEstimate:
  """`MetaTrainer.memory_estimate`, raising `metafam.resources.InsufficientMemoryError` (both numbers in the
  message) when the meta-step cannot fit in what this process's devices can give."""
  estimate = trainer.memory_estimate(key)
  devices = jax.local_devices() if trainer.mesh is None else sharding.local_devices(trainer.mesh)
  resources.check_fits(estimate, devices[:1] if trainer.mesh is None else devices, "the meta-step")
  return estimate


# -- metrics.jsonl ---------------------------------------------------------------------------------------------------
def _finite_or_null(record: Dict[str, Any]) -> Dict[str, Any]:
  """``record`` with non-finite floats (a skipped step's NaN meta-loss) as None: JSON has no NaN, so they are null."""
  return {k: None if isinstance(v, float) and not np.isfinite(v) else v for k, v in record.items()}


def _read_records(path: str) -> Tuple[List[Dict[str, Any]], Optional[str]]:
  """The JSON records of a ``metrics.jsonl`` and, if its last line was cut short by a crash, that line (dropped).

  Only the last line may be partial (every complete record ends with a newline); a bad line before it is corruption,
  not a crash, and raises ValueError naming the line.
  """
  with open(path, "rb") as f:
    lines = f.read().split(b"\n")
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
  if partial is not None:
    warnings.warn(f"{path}: dropped a partial last line left by a crash ({partial[:60]!r}...)", RuntimeWarning,
                  stacklevel=3)
  return records, partial


def read_metrics(path: str) -> List[Dict[str, Any]]:
  """The records of a ``metrics.jsonl`` written by `train`, with null values read back as NaN.

  A partial last line (a crash while it was written) is dropped with a `RuntimeWarning`; a resumed run rewrites
  the file without it.
  """
  records, _ = _read_records(path)
  return [{k: float("nan") if v is None else v for k, v in r.items()} for r in records]


def _truncate_metrics(path: str, step: int) -> None:
  """Keeps one record per step up to ``step`` (the records past it ran after the last checkpoint and will run
  again; a partial last line is dropped, with one warning), atomically."""
  if not os.path.exists(path):
    return
  records, _ = _read_records(path)
  kept, seen = [], set()
  for record in records:
    at = record.get("step", 0)
    if at <= step and at not in seen:
      seen.add(at)
      kept.append(json.dumps(record, allow_nan=False) + "\n")
  atomic_write(path, "".join(kept).encode())


# -- the loop --------------------------------------------------------------------------------------------------------
def train(trainer: MetaTrainer, num_steps: int, key: Optional[jax.Array] = None,
          state: Optional[MetaTrainState] = None, output_dir: Optional[str] = None, checkpoint_every: int = 50,
          eval_every: Optional[int] = None, progress: bool = True,
          log_fn: Optional[Callable[[Dict[str, Any]], None]] = None, handle_signals: bool = False,
          max_skipped_steps: Optional[int] = DEFAULT_MAX_SKIPPED_STEPS, check_memory: bool = True,
          lock_output_dir: bool = True):
  """Runs ``trainer``'s meta-steps until ``state.step == num_steps``; returns ``(state, history)``.

  With ``output_dir``, an existing checkpoint there is resumed (refused if it belongs to a different run or holds
  non-finite meta-parameters), a checkpoint is written atomically every ``checkpoint_every`` steps and at the
  end, and every logged record is appended to ``metrics.jsonl`` (see the module docstring). With ``eval_every`` and
  an ``eval_family``, `MetaTrainer.evaluate` runs every that many steps and at the end (held-out instances, key
  derived from the step). ``history`` is the list of records (step, metrics, inner steps/s, and eval results where
  evaluated).

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
    raises `metafam.io.DirectoryBusyError` before changing anything, and a refused run restores the lock file.
    Pass False when the caller holds the lock.
  """
  loop = _Loop(trainer, output_dir, checkpoint_every, eval_every, progress, log_fn, max_skipped_steps)
  lock = DirectoryLock(output_dir).acquire() if loop.writes and lock_output_dir else None
  with _holding(lock, loop):
    return loop.train(num_steps, key, state, handle_signals, check_memory)


@contextlib.contextmanager
def _holding(lock: Optional[DirectoryLock], loop: "_Loop"):
  """Releases ``lock`` at the end; a refusal (`REFUSALS`) before ``loop`` wrote anything gives the lock file back
  its bytes (`DirectoryLock.release`), so the directory is as it was."""
  try:
    yield
  except REFUSALS:
    if lock is not None and not loop.wrote:
      lock.release(restore=True)
    raise
  finally:
    if lock is not None:
      lock.release()


@dataclasses.dataclass
class _Loop:
  """The state of one `train` call: where it writes, what it wrote, and its settings."""
  trainer: MetaTrainer
  output_dir: Optional[str]
  checkpoint_every: int
  eval_every: Optional[int]
  progress: bool
  log_fn: Optional[Callable[[Dict[str, Any]], None]]
  max_skipped_steps: Optional[int]
  wrote: bool = False

  def __post_init__(self):
    self.writes = bool(self.output_dir) and self.trainer.is_main_process  # on several processes: process 0 only
    self.ckpt = os.path.join(self.output_dir, CHECKPOINT_NAME) if self.output_dir else None
    self.metrics_path = os.path.join(self.output_dir, METRICS_NAME) if self.output_dir else None
    self.last_saved = 0

  def train(self, num_steps: int, key: Optional[jax.Array], state: Optional[MetaTrainState], handle_signals: bool,
            memory: bool):
    check_number("num_steps", num_steps, low=0, integer=True)
    check_positive("checkpoint_every", self.checkpoint_every, integer=True)
    if self.max_skipped_steps is not None:
      check_positive("max_skipped_steps", self.max_skipped_steps, integer=True)
    if self.eval_every is not None:
      check_positive("eval_every", self.eval_every, integer=True)
      if self.trainer.evaluator is None:
        raise ValueError("eval_every needs an eval_family (MetaTrainer(..., eval_family=...)).")
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

  def start(self, num_steps: int, key: Optional[jax.Array], state: Optional[MetaTrainState], memory: bool):
    """The state to start from (a checkpoint in the directory, else ``state``, else a fresh one): checks first,
    then compiles and restores; returns ``(state, whether the directory had a checkpoint)``."""
    trainer, had_checkpoint, error = self.trainer, False, None
    if self.writes:
      try:
        legacy = os.path.join(self.output_dir, LEGACY_CHECKPOINT_NAME)
        if not os.path.exists(self.ckpt) and os.path.exists(legacy):  # refuse rather than silently start over
          raise checkpoint.legacy_error(legacy, self.ckpt)
        os.makedirs(self.output_dir, exist_ok=True)
        had_checkpoint = os.path.exists(self.ckpt)
        if had_checkpoint and state is None:  # a checkpoint that will be refused is refused before compiling
          check_checkpoint(trainer, self.ckpt)
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
        state = restore(trainer, self.ckpt, state)
        if self.writes:
          self.write(self.metrics_path, lambda: _truncate_metrics(self.metrics_path, int(state.step)))
    self.last_saved = int(state.step)
    return state, had_checkpoint

  def run(self, state: MetaTrainState, num_steps: int, had_checkpoint: bool, stop: Any):
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
          self.write(self.ckpt, lambda: save(trainer, state, self.ckpt))
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
    if self.output_dir and step == start_step and not had_checkpoint:
      self.write(self.ckpt, lambda: save(trainer, state, self.ckpt))
    return state, history

  def record(self, step: int, names: List[str], packed: jax.Array, *, state: Optional[MetaTrainState],
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
      result = trainer.evaluate(state.theta, jax.random.fold_in(jax.random.key(EVAL_KEY), step))
      record.update(eval_final_loss=float(result["eval_final_loss"]), eval_mean_loss=float(result["eval_mean_loss"]))
      clock["last"] = time.perf_counter()  # the evaluation's time is not the next step's
    bar.update(1)
    bar.set_postfix(meta_loss=f"{record['meta_loss']:.4f}", grad_norm=f"{record['grad_norm']:.3g}")
    if self.writes:
      line = json.dumps(_finite_or_null(record), allow_nan=False)
      self.write(self.metrics_path, lambda: append_line(self.metrics_path, line))
    if self.log_fn is not None:
      self.log_fn(record)
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


# -- the run object --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RunResult:
  """What `MetaTrainingRun.run` returns (process 0; ``comparison`` and ``written`` are None elsewhere).

  Attributes:
    state: the final `MetaTrainState`; meta_steps: its step.
    train_seconds: wall time of this session's meta-training (compilation included).
    totals: `metafam.evaluation.report.meta_train_totals` over every session of the run.
    inner_steps_per_meta_step: inner steps of all lanes per meta-step.
    comparison: the closing `metafam.evaluation.comparison.HeldOutComparison`.
    written: the report's file names in the run directory, ``summary.json`` first.
  """
  state: MetaTrainState
  meta_steps: int
  train_seconds: float
  totals: Dict[str, Any]
  inner_steps_per_meta_step: int
  comparison: Any = None
  written: Optional[List[str]] = None

  def format_summary(self) -> str:
    """Meta-steps, meta-step time (over all sessions and this one), inner steps, then the comparison's table."""
    totals, per_step = self.totals, self.inner_steps_per_meta_step
    text = (f"meta-steps: {self.meta_steps}; meta-step time over all sessions: "
            f"{totals['meta_step_seconds_total']:.0f} s (this session {self.train_seconds:.0f} s); inner steps: "
            f"{totals['inner_steps_total']:,} ({per_step:,} per meta-step)")
    return text + ("\n\n" + self.comparison.format_table() if self.comparison is not None else "")


class MetaTrainingRun:
  """``recipe`` meta-trained with ``seed`` into ``output_dir`` (see the module docstring for the directory).

  Building it builds the learned optimizer, the estimators (lanes over ``devices``) and the `MetaTrainer` (whose
  config is the run's identity); nothing is compiled or written. `run` trains (resuming a checkpoint of the same run),
  then writes the closing report.

  Args:
    recipe: the `Recipe` (for ``metafam meta-train``'s flags: `metafam.outer_trainers.recipes.recipe_from_flags`).
    output_dir: the run directory (None: nothing is written, nothing resumed).
    seed: the run's seed: its key is ``jax.random.key(seed)``; part of its identity.
    eval_tasks, eval_steps: held-out instances and inner steps of evaluations and of the closing report.
    devices: spread the lanes over this many devices (or these devices; None: one).
  """

  def __init__(self, recipe: Recipe, output_dir: Optional[str], *, seed: int = 0, eval_tasks: int = 16,
               eval_steps: int = 200, devices: Any = None):
    if not isinstance(recipe, Recipe):
      raise TypeError(f"recipe must be a Recipe (metafam.outer_trainers.recipes), got {type(recipe).__name__}.")
    self.recipe, self.output_dir, self.seed = recipe, output_dir, int(check_number("seed", seed, low=0, integer=True))
    self.lopt, self.trainer = recipe.build(devices=devices, eval_num_tasks=eval_tasks, eval_steps=eval_steps,
                                           seed=seed)

  @property
  def identity(self) -> Dict[str, Any]:
    """What must match to resume a checkpoint in the run directory (`Recipe.identity`)."""
    return self.recipe.identity(self.seed)

  @property
  def key(self) -> jax.Array:
    return jax.random.key(self.seed)

  def run(self, *, num_steps: Optional[int] = None, checkpoint_every: int = 50, eval_every: Optional[int] = None,
          progress: bool = True, log_fn: Optional[Callable[[Dict[str, Any]], None]] = None,
          handle_signals: bool = True, max_skipped_steps: Optional[int] = DEFAULT_MAX_SKIPPED_STEPS,
          report: bool = True) -> RunResult:
    """Meta-trains to ``num_steps`` (default the recipe's) with the directory locked (process 0), then, with
    ``report``, compares and writes the closing report (process 0). A refusal leaves the directory as it was."""
    num_steps = self.recipe.num_steps if num_steps is None else num_steps
    main = self.trainer.is_main_process and distributed.is_main_process()
    lock = _lock_dir(self.output_dir) if self.output_dir and main else None
    loop = _Loop(self.trainer, self.output_dir, checkpoint_every, eval_every, progress and main, log_fn,
                 max_skipped_steps)
    with _holding(lock, loop):
      start = time.perf_counter()
      state, _ = loop.train(num_steps, self.key, None, handle_signals, True)
      train_seconds = time.perf_counter() - start
      # Host copies of the thetas to compare: process 0 evaluates alone, so no array of a multi-process mesh may
      # enter its programs (placing the initial theta on that mesh is itself a collective: every process takes part).
      thetas = {"learned (init)": distributed.to_host(self.trainer.initial_theta(self.key)),
                "learned (final)": distributed.to_host(state.theta)}
      history = self.history() if main else []
      from metafam.evaluation.report import meta_train_totals
      per_step = self.trainer.inner_steps_per_meta_step
      result = RunResult(state, int(state.step), train_seconds, meta_train_totals(history, int(state.step), per_step),
                         per_step)
      return self.report(result, thetas, history) if report and main else result

  def history(self) -> List[Dict[str, Any]]:
    """The records of the run directory's ``metrics.jsonl`` (every session's; ``[]`` if none)."""
    path = os.path.join(self.output_dir, METRICS_NAME) if self.output_dir else None
    return read_metrics(path) if path and os.path.exists(path) else []

  def report(self, result: RunResult, thetas: Dict[str, Any], history: List[Dict[str, Any]]) -> RunResult:
    """The closing comparison (`metafam.evaluation.comparison.compare_with_tuned_adam` on fresh test instances,
    key ``seed + REPORT_KEY_OFFSET``) and, with a run directory, its report files."""
    from metafam.evaluation.comparison import compare_with_tuned_adam
    from metafam.evaluation.report import write_meta_train_report
    comparison = compare_with_tuned_adam(self.trainer.evaluator, self.lopt, thetas,
                                         jax.random.key(self.seed + REPORT_KEY_OFFSET), min_tasks=1)
    written = None
    if self.output_dir:
      try:
        written = write_meta_train_report(self.output_dir, history, comparison, self.trainer.config,
                                          meta_steps=result.meta_steps, train_seconds=result.train_seconds,
                                          inner_steps_per_meta_step=result.inner_steps_per_meta_step)
      except OSError as e:  # the run itself is checkpointed: only the report is missing
        raise WriteFailedError(getattr(e, "filename", None) or self.output_dir, e,
                               os.path.join(self.output_dir, CHECKPOINT_NAME), result.meta_steps) from e
    return dataclasses.replace(result, comparison=comparison, written=written)


def tensorboard_logger(output_dir: str) -> Callable[[Dict[str, Any]], None]:
  """A ``log_fn`` writing each record's numbers to ``OUTPUT_DIR/tensorboard`` (needs tensorboardX), created at the
  first record: a refused run writes nothing."""
  writers: List[Any] = []

  def log(record: Dict[str, Any]) -> None:
    if not writers:
      from tensorboardX import SummaryWriter
      writers.append(SummaryWriter(os.path.join(output_dir, "tensorboard")))
    for k, v in record.items():
      if k != "step" and isinstance(v, (int, float)):
        writers[0].add_scalar(k, v, record["step"])
    writers[0].flush()
  return log
