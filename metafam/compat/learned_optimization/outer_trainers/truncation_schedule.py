"""`learned_optimization.outer_trainers.truncation_schedule`: truncation schedules over metafam's schedules.

Each schedule has the reference's ``init(key, outer_state) -> state`` (``state.length``: the current trajectory's
length) and ``next_state(state, step, key, outer_state) -> (state, is_done)`` (``is_done = step >= state.length``; a
finished trajectory's state is re-initialized with ``key``), and metafam's ``sample(key) -> length``, so it can be
handed to `metafam.inner.TruncatedStep` as is. ``schedule.schedule`` is the metafam schedule it forwards to.
`NeverEndingTruncationSchedule`'s length is metafam's "never" (2**30 steps), never done.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, TypeVar

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


# The reference's names: its constant schedule's state type is the shared state here.
T = TypeVar("T")
PRNGKey = jax.Array
ConstantTruncationState = TruncationState


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

  def next_state(self, state: TruncationState, step: Any, key: jax.Array, outer_state: Any):
    """``(state, is_done)``: ``is_done = step >= state.length``; when done, the state of a new trajectory."""
    is_done = jnp.asarray(step) >= state.length
    fresh = self.init(key, outer_state)
    new = jax.tree.map(lambda a, b: jnp.where(is_done, a, b), fresh, state)
    return new, is_done


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
  """The length is ``schedule(outer_state.outer_iteration, max_steps=max_steps)`` (e.g. a
  `optimizers.learning_rate_schedules.PiecewiseLinear`), plus ``N(0, std)`` steps when ``std > 0`` (at least
  ``min_length`` then): it grows (or shrinks) with meta-training. A plain ``f(outer_iteration)`` works too.

  metafam's inner step draws lengths without seeing the outer state, so this schedule offers ``init`` /
  ``next_state`` only; `VectorizedLOptTruncatedStep` refuses it (NotImplementedError).
  """

  def __init__(self, schedule: Callable[..., Any], max_steps: Any = None, std: float = 0, min_length: int = 10):
    self.schedule_fn, self.max_steps, self.std, self.min_length = schedule, max_steps, std, min_length

  def _length(self, iteration):
    try:
      return self.schedule_fn(iteration, max_steps=self.max_steps)
    except TypeError:  # a plain function of the outer iteration
      return self.schedule_fn(iteration)

  def init(self, key, outer_state):
    length = jnp.asarray(self._length(outer_state.outer_iteration))
    if self.std > 0:
      shift = (jax.random.normal(key) * self.std).astype(jnp.int32)
      length = jnp.maximum(length + shift, self.min_length)
    return TruncationState(length=length.astype(jnp.int32))


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
