"""A run directory: the checkpoint of a trainer's state and its identity check, ``metrics.jsonl``, the refusal rule.

What a directory holds is listed in `metafam.runs.run`. A checkpoint stores the run's *identity* as its
``config`` (`run_identity`: a JSON-able dict; resuming a checkpoint of another identity is refused). The functions
here take any trainer that has ``estimators``, ``learned_opt``, ``nonfinite``, ``place``, ``multi_process`` and
``is_main_process`` (`metafam.outer_trainers.meta_trainer.MetaTrainer`); this module imports neither the trainer nor
the recipes. A checkpoint belongs to the run whose identity equals its stored config as JSON (`same_config`).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metafam import distributed, resources
from metafam.io import DirectoryLock, atomic_write
from metafam.runs import checkpoint

CHECKPOINT_NAME = "checkpoint.npz"
METRICS_NAME = "metrics.jsonl"
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


# -- checkpoints of a trainer's state --------------------------------------------------------------------------------
def run_identity(trainer: Any, config: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """The identity a checkpoint of ``trainer``'s run stores: ``config`` (a JSON-able description of the run, e.g.
  `metafam.runs.recipes.Recipe.identity`), completed with the estimators' and the learned optimizer's
  class names (``estimators``, ``learned_opt``) and the trainer's ``nonfinite`` policy when it is not the default,
  unless ``config`` sets them."""
  identity = dict(config or {})
  if trainer.nonfinite != "skip":  # the default is left out, so that the configs of older checkpoints still match
    identity.setdefault("nonfinite", trainer.nonfinite)
  identity.setdefault("estimators", [type(e).__name__ for e in trainer.estimators])
  identity.setdefault("learned_opt", type(trainer.learned_opt).__name__)
  return identity


def save(trainer: Any, state: Any, path: str, identity: Mapping[str, Any]) -> None:
  """Writes ``state`` to ``path`` atomically with ``{"step", "config": identity}``. On several processes the
  lanes are gathered first (every process must call this) and process 0 writes the global state: a checkpoint does
  not depend on the process count."""
  tree = distributed.to_host(state) if trainer.multi_process else state
  if trainer.is_main_process:
    checkpoint.save(path, tree, {"step": int(tree.step), "config": identity})


def restore(trainer: Any, path: str, like: Any, identity: Mapping[str, Any]) -> Any:
  """Loads a checkpoint written by `save` for the run of ``identity`` (`check_checkpoint`); ``like`` gives the
  structure.

  The state is rebuilt into ``like``'s types (structure, shapes and dtypes must match; see `checkpoint.load`). On
  several processes (every one must call this) process 0 reads the file and broadcasts the state, which is then split
  over this run's devices, whatever the process count of the run that wrote it; an error on process 0 stops every
  process.
  """
  def read(like):
    check_checkpoint(path, identity, read_theta=False)
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


def same_config(stored: Any, mine: Any) -> bool:
  """Whether a checkpoint's stored config and ``mine`` (a run's identity) are equal as stored JSON (tuples become
  lists): the identity check of `check_checkpoint`."""
  return stored == json.loads(json.dumps(mine, sort_keys=True))


def check_checkpoint(path: str, identity: Mapping[str, Any], read_theta: bool = True) -> None:
  """Raises `checkpoint.CheckpointError` unless ``path`` is a checkpoint of the run of ``identity`` (`same_config`)
  whose theta is finite (``read_theta``); cheap next to compiling, so a resume checks it first."""
  stored = checkpoint.read_metadata(path).get("config")
  if not same_config(stored, identity):
    raise checkpoint.CheckpointError(
        f"{path} belongs to a different run: its config is {json.dumps(stored, sort_keys=True)}, this run's is "
        f"{json.dumps(identity, sort_keys=True)}.")
  if read_theta:
    header, tree = checkpoint.read(path)
    if header.root_class == "MetaTrainState":
      checkpoint.check_finite(tree["theta"], path, "meta-parameter theta")


def recorded_decay_steps(output_dir: str) -> Optional[int]:
  """The meta-learning-rate decay (``meta_lr_decay_steps``) recorded in ``output_dir``'s checkpoint, or None (no
  checkpoint, or none readable: the run's own checks then report it). A resumed run keeps the schedule it began with."""
  path = os.path.join(output_dir, CHECKPOINT_NAME)
  if not os.path.isfile(path):
    return None
  try:
    config = checkpoint.read_metadata(path).get("config") or {}
  except (checkpoint.CheckpointError, OSError, ValueError):
    return None
  recipe = config.get("recipe") if isinstance(config, dict) else None  # `Recipe.identity`'s part
  value = recipe.get("meta_lr_decay_steps") if isinstance(recipe, dict) else None
  return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# -- metrics.jsonl ---------------------------------------------------------------------------------------------------
def finite_or_null(record: Dict[str, Any]) -> Dict[str, Any]:
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


def truncate_metrics(path: str, step: int) -> None:
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


# -- refusals ---------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def holding(lock: Optional[DirectoryLock], loop: Any):
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

