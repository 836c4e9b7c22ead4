"""`learned_optimization.checkpoints`: `save_state(path, state)` / `load_state(path, like)`.

`load_state` reads both formats and tells them apart by their first bytes: the reference's own files (flax's msgpack,
``flax.serialization.to_bytes``: what LO's ``save_state`` writes and what its published learned optimizers, VeLO's
included, are distributed as; read by `metafam.compat.flax_msgpack`, no flax needed, no code run, the optional
``msgpack`` package) and metafam's ``.npz`` checkpoints (`metafam.runs.checkpoint`). `save_state` writes
metafam's format, or the reference's with ``format="flax"`` (a file LO's ``load_state`` reads).

``load_state`` follows the reference: the stored values are put into ``like``'s tree type (whose values are not
used). From a flax file they come back as numpy arrays of the stored dtypes (as flax gives them), looked up by
``like``'s key paths (dict keys, list and tuple indices, dataclass and namedtuple fields), each array checked against
``like``'s shape; from a ``.npz`` file structure, shapes and dtypes are checked (`CheckpointError` naming the first
mismatch in both cases). `ParameterCheckpoint` keeps its ``gen_id`` and ``step`` and `OptCheckpoint` its two
counters (in the ``.npz`` file's JSON metadata; in a flax file as state-dict entries); both are defined here and
exported by `outer_trainers.gradient_learner` too, where the reference defines them. Non-finite values are returned
as stored; the loaders of meta-parameters (`metafam.benchmark.load_theta`) refuse them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, TypeVar, Union

import jax

from metafam._pytree import static_field
from metafam.compat import flax_msgpack as _flax
from metafam.runs import checkpoint as _checkpoint

__all__ = ["save_state", "load_state", "ParameterCheckpoint", "OptCheckpoint", "save_checkpoint",
           "restore_checkpoint", "last_checkpoint_idx", "has_checkpoint", "periodically_save_checkpoint", "HKTree",
           "FutureMapping"]

HKTree = dict  # haiku's parameter mappings are plain dicts today
FutureMapping = Any

T = TypeVar("T")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ParameterCheckpoint:
  """What the reference writes out for using a learned optimizer: its ``params`` (theta), a ``gen_id`` string and
  the outer ``step`` (`checkpoints.save_state` stores ``gen_id`` and ``step`` in the file's metadata)."""
  params: Any
  gen_id: str = static_field()
  step: int


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OptCheckpoint:
  """What the reference writes out for resuming meta-training: the `GradientLearnerState` and two counters."""
  gradient_learner_state: Any  # gradient_learner.GradientLearnerState
  elapsed_time: Any
  total_inner_steps: Any


def save_state(path: str, state: Any, format: str = "npz") -> None:  # noqa: A002 -- the reader's word
  """Writes ``state`` to ``path`` (directories created): metafam's ``.npz`` format, or with ``format="flax"`` the
  reference's flax-msgpack bytes (needs ``pip install 'metafam[msgpack]'``)."""
  if format not in ("npz", "flax"):
    raise ValueError(f"format must be 'npz' (metafam's checkpoint) or 'flax' (learned_optimization's msgpack), "
                     f"got {format!r}.")
  directory = os.path.dirname(path)
  if directory:
    os.makedirs(directory, exist_ok=True)
  if format == "flax":
    _flax.save(path, state)
  elif isinstance(state, ParameterCheckpoint):
    _checkpoint.save(path, {"params": state.params},
                     metadata={"kind": "ParameterCheckpoint", "gen_id": str(state.gen_id), "step": int(state.step)})
  elif isinstance(state, OptCheckpoint):
    _checkpoint.save(path, {"gradient_learner_state": state.gradient_learner_state},
                     metadata={"kind": "OptCheckpoint", "elapsed_time": float(state.elapsed_time),
                               "total_inner_steps": int(state.total_inner_steps)})
  else:
    _checkpoint.save(path, state, metadata={"kind": type(state).__name__})


def _load_flax(path: str, state: Any) -> Any:
  stored = _flax.load(path)
  if isinstance(state, (ParameterCheckpoint, OptCheckpoint)):
    first = "params" if isinstance(state, ParameterCheckpoint) else "gradient_learner_state"
    if not isinstance(stored, dict) or first not in stored:
      raise _checkpoint.CheckpointError(f"{path}: expected a {type(state).__name__} (an entry {first!r}), found "
                                        f"entries {sorted(stored) if isinstance(stored, dict) else type(stored)}.")
    tree = _flax.restore(getattr(state, first), stored[first], where=path)
    if isinstance(state, ParameterCheckpoint):
      return ParameterCheckpoint(tree, str(stored.get("gen_id", "")), int(stored.get("step", 0)))
    return OptCheckpoint(tree, stored.get("elapsed_time", 0.0), stored.get("total_inner_steps", 0))
  return _flax.restore(state, stored, where=path)


def load_state(path: str, state: T) -> T:
  """The tree stored at ``path`` (either format), rebuilt with the types of ``state`` (whose values are not used)."""
  if _flax.looks_like_msgpack(path):
    return _load_flax(path, state)
  if isinstance(state, ParameterCheckpoint):
    tree, metadata = _checkpoint.load(path, like={"params": state.params})
    return ParameterCheckpoint(tree["params"], metadata.get("gen_id", ""), metadata.get("step", 0))
  if isinstance(state, OptCheckpoint):
    tree, metadata = _checkpoint.load(path, like={"gradient_learner_state": state.gradient_learner_state})
    return OptCheckpoint(tree["gradient_learner_state"], metadata.get("elapsed_time", 0.0),
                         metadata.get("total_inner_steps", 0))
  tree, _ = _checkpoint.load(path, like=state)
  return tree


# -- numbered checkpoints in a directory ------------------------------------------------------------------------
def _numbered(ckpt_dir: str, prefix: str) -> List[Tuple[int, str]]:
  """``(step, path)`` of the files ``<ckpt_dir>/<prefix><step>``, by step."""
  if not os.path.isdir(ckpt_dir):
    return []
  pattern = re.compile(re.escape(prefix) + r"(\d+)")
  found = [(int(m.group(1)), os.path.join(ckpt_dir, name)) for name in os.listdir(ckpt_dir)
           for m in [pattern.fullmatch(name)] if m]
  return sorted(found)


def last_checkpoint_idx(ckpt_dir: str, prefix: str) -> Optional[int]:
  """The largest ``step`` of the files ``<prefix><step>`` in ``ckpt_dir``, or None."""
  found = _numbered(ckpt_dir, prefix)
  return found[-1][0] if found else None


def has_checkpoint(ckpt_dir: str, prefix: str) -> bool:
  return last_checkpoint_idx(ckpt_dir, prefix) is not None


def save_checkpoint(ckpt_dir: str, prefix: str, value: Any, step: int, keep: int = 20,
                    format: str = "npz") -> str:  # noqa: A002
  """Writes ``value`` to ``<ckpt_dir>/<prefix><step>`` (see `save_state` for ``format``), replacing a file of that
  name, then deletes the oldest ``<prefix>*`` files beyond the newest ``keep``; returns the path."""
  if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
    raise ValueError(f"keep must be an int >= 1, got {keep!r}.")
  path = os.path.join(ckpt_dir, f"{prefix}{int(step)}")
  save_state(path, value, format=format)
  for _, old in _numbered(ckpt_dir, prefix)[:-keep]:
    os.remove(old)
  return path


def restore_checkpoint(ckpt_dir: str, value: T, prefix: str) -> T:
  """The newest ``<prefix><step>`` checkpoint in ``ckpt_dir`` in ``value``'s tree type; ``value`` itself if there is
  none (as flax does)."""
  found = _numbered(ckpt_dir, prefix)
  return load_state(found[-1][1], value) if found else value


def periodically_save_checkpoint(train_log_dir: str, current_iteration: Any,
                                 checkpoint_state_map: Mapping[str, Union[Any, Callable[[], Any]]],
                                 time_interval: Optional[int] = 10 * 60, step_interval: Optional[int] = None,
                                 keep: int = 20, background: bool = False) -> Optional[Dict[str, str]]:
  """Saves every ``prefix -> value`` (or ``prefix -> function returning the value``) as the next numbered checkpoint
  when ``step_interval`` divides ``current_iteration`` or, with ``time_interval``, when the newest checkpoint of the
  first prefix is older than that many seconds (its file time: no state is kept in this process). Returns
  ``{prefix: path}`` when it saved, else None. ``background`` is accepted; saving happens in the calling thread."""
  del background
  if time_interval is not None and step_interval is not None:
    raise ValueError("periodically_save_checkpoint: give time_interval or step_interval, not both.")
  first = sorted(checkpoint_state_map)[0]
  found = _numbered(train_log_dir, first)
  if step_interval is not None:
    due = int(current_iteration) % step_interval == 0
  else:
    due = not found or time.time() - os.path.getmtime(found[-1][1]) > (time_interval or 0)
  if not due:
    return None
  step = found[-1][0] + 1 if found else 0
  return {prefix: save_checkpoint(train_log_dir, prefix, value() if callable(value) else value, step, keep=keep)
          for prefix, value in checkpoint_state_map.items()}
