"""`learned_optimization.checkpoints`: `save_state(path, state)` / `load_state(path, like)` over metafam's
checkpoint format (`metafam.outer_trainers.checkpoint`: one atomic ``.npz`` whose loader runs no code).

Any pytree of arrays works. `ParameterCheckpoint` keeps its ``gen_id`` and ``step`` and `OptCheckpoint` its two
counters in the file's JSON metadata (both defined here and exported by `outer_trainers.gradient_learner` too, where
the reference defines them, so that this module needs nothing above it). ``load_state`` checks the stored tree
against ``like`` (structure, shapes, dtypes; `metafam.outer_trainers.checkpoint.CheckpointError` naming the first
mismatch otherwise) and returns a tree of ``like``'s types; the reference's flax-msgpack files are not readable.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, TypeVar

import jax

from metafam.outer_trainers import checkpoint as _checkpoint

__all__ = ["save_state", "load_state", "ParameterCheckpoint", "OptCheckpoint"]

T = TypeVar("T")


@functools.partial(jax.tree_util.register_dataclass, data_fields=["params", "step"], meta_fields=["gen_id"])
@dataclasses.dataclass(frozen=True)
class ParameterCheckpoint:
  """What the reference writes out for using a learned optimizer: its ``params`` (theta), a ``gen_id`` string and
  the outer ``step`` (`checkpoints.save_state` stores ``gen_id`` and ``step`` in the file's metadata)."""
  params: Any
  gen_id: str
  step: int


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["gradient_learner_state", "elapsed_time", "total_inner_steps"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class OptCheckpoint:
  """What the reference writes out for resuming meta-training: the `GradientLearnerState` and two counters."""
  gradient_learner_state: Any  # gradient_learner.GradientLearnerState
  elapsed_time: Any
  total_inner_steps: Any


def save_state(path: str, state: Any) -> None:
  """Writes ``state`` to ``path`` (directories created)."""
  directory = os.path.dirname(path)
  if directory:
    os.makedirs(directory, exist_ok=True)
  if isinstance(state, ParameterCheckpoint):
    _checkpoint.save(path, {"params": state.params},
                     metadata={"kind": "ParameterCheckpoint", "gen_id": str(state.gen_id), "step": int(state.step)})
  elif isinstance(state, OptCheckpoint):
    _checkpoint.save(path, {"gradient_learner_state": state.gradient_learner_state},
                     metadata={"kind": "OptCheckpoint", "elapsed_time": float(state.elapsed_time),
                               "total_inner_steps": int(state.total_inner_steps)})
  else:
    _checkpoint.save(path, state, metadata={"kind": type(state).__name__})


def load_state(path: str, state: T) -> T:
  """The tree stored at ``path``, rebuilt with the types of ``state`` (whose values are not used)."""
  if isinstance(state, ParameterCheckpoint):
    tree, metadata = _checkpoint.load(path, like={"params": state.params})
    return ParameterCheckpoint(tree["params"], metadata.get("gen_id", ""), metadata.get("step", 0))
  if isinstance(state, OptCheckpoint):
    tree, metadata = _checkpoint.load(path, like={"gradient_learner_state": state.gradient_learner_state})
    return OptCheckpoint(tree["gradient_learner_state"], metadata.get("elapsed_time", 0.0),
                                          metadata.get("total_inner_steps", 0))
  tree, _ = _checkpoint.load(path, like=state)
  return tree
