"""`learned_optimization.outer_trainers.truncation_schedule`: truncation schedules over metafam's schedules.

Each schedule has the reference's ``init(key, outer_state) -> state`` and ``next_state(state, key, outer_state)``
(``state.length``: the current trajectory's length) and metafam's ``sample(key) -> length``, so it can be handed
to `metafam.inner.TruncatedStep` as is. ``schedule.schedule`` is the metafam schedule it forwards to.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from metafam.inner import schedules as _schedules

__all__ = ["TruncationState", "TruncationSchedule", "ConstantTruncationSchedule", "LogUniformLengthSchedule",
           "NeverEndingTruncationSchedule", "ScheduledTruncationSchedule", "as_metafam_schedule"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TruncationState:
  """The current trajectory's length (int32)."""
  length: jax.Array


class TruncationSchedule:
  """Base class: ``init(key, outer_state)`` and ``next_state(state, key, outer_state)``; subclasses forwarding to a
  metafam schedule set ``self.schedule``."""

  schedule: Any = None

  def sample(self, key: jax.Array) -> jax.Array:
    if self.schedule is None:
      raise NotImplementedError(f"{type(self).__name__} depends on the outer state and has no metafam schedule.")
    return self.schedule.sample(key)

  def init(self, key: jax.Array, outer_state: Any) -> TruncationState:
    return TruncationState(length=self.sample(key))

  def next_state(self, state: TruncationState, key: jax.Array, outer_state: Any) -> TruncationState:
    return TruncationState(length=self.sample(key))


class ConstantTruncationSchedule(TruncationSchedule):
  """Every trajectory lasts ``total_length`` steps (`metafam.inner.ConstantSchedule`)."""

  def __init__(self, total_length: int):
    self.total_length = total_length
    self.schedule = _schedules.ConstantSchedule(total_length)


class LogUniformLengthSchedule(TruncationSchedule):
  """Lengths drawn log-uniformly in ``[min_length, max_length]`` (`metafam.inner.LogUniformSchedule`)."""

  def __init__(self, min_length: int, max_length: int):
    self.min_length, self.max_length = min_length, max_length
    self.schedule = _schedules.LogUniformSchedule(min_length, max_length)


class NeverEndingTruncationSchedule(TruncationSchedule):
  """Trajectories never end (`metafam.inner.NeverEndingSchedule`)."""

  def __init__(self):
    self.schedule = _schedules.NeverEndingSchedule()


class ScheduledTruncationSchedule(TruncationSchedule):
  """The length is ``schedule_fn(outer_state.outer_iteration)``: it grows (or shrinks) with meta-training.

  metafam's inner step draws lengths without seeing the outer state, so this schedule offers ``init`` /
  ``next_state`` only; `VectorizedLOptTruncatedStep` refuses it (NotImplementedError).
  """

  def __init__(self, schedule_fn: Callable[[Any], Any]):
    self.schedule_fn = schedule_fn

  def init(self, key, outer_state):
    return TruncationState(length=jnp.asarray(self.schedule_fn(outer_state.outer_iteration), jnp.int32))

  def next_state(self, state, key, outer_state):
    return self.init(key, outer_state)


def as_metafam_schedule(trunc_sched: Any) -> Any:
  """The metafam schedule (with ``sample(key)``) behind ``trunc_sched``; a metafam schedule is returned as is."""
  if isinstance(trunc_sched, TruncationSchedule):
    if trunc_sched.schedule is None:
      raise NotImplementedError(f"{type(trunc_sched).__name__} needs the outer state, which metafam's inner step does "
                                "not see; use ConstantTruncationSchedule, LogUniformLengthSchedule or "
                                "NeverEndingTruncationSchedule.")
    return trunc_sched.schedule
  if hasattr(trunc_sched, "sample"):
    return trunc_sched
  raise TypeError(f"trunc_sched must be a truncation schedule, got {type(trunc_sched).__name__}.")
