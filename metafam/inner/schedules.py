"""Truncation schedules: how many inner steps a trajectory lasts before its lane resets.

A schedule is a small frozen dataclass with ``sample(key) -> int32[]`` (a trajectory length >= 1), usable inside
jitted and vmapped code.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from metafam._checks import check_positive_int

NEVER = np.iinfo(np.int32).max  # the length of a trajectory that never ends


@dataclasses.dataclass(frozen=True)
class ConstantSchedule:
  """Every trajectory lasts ``length`` steps."""
  length: int

  def __post_init__(self):
    check_positive_int("ConstantSchedule.length", self.length)

  def sample(self, key: jax.Array) -> jax.Array:
    del key
    return jnp.asarray(self.length, jnp.int32)


@dataclasses.dataclass(frozen=True)
class LogUniformSchedule:
  """Lengths ``round(exp(U(log low, log high)))``, clipped to ``[low, high]``."""
  low: int
  high: int

  def __post_init__(self):
    ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in (self.low, self.high))
    if not ints or not 1 <= self.low <= self.high:
      raise ValueError(f"LogUniformSchedule needs ints (not bools) with 1 <= low <= high, got low={self.low!r}, "
                       f"high={self.high!r}.")

  def sample(self, key: jax.Array) -> jax.Array:
    u = jax.random.uniform(key, (), jnp.float32, np.log(self.low), np.log(self.high))
    return jnp.clip(jnp.round(jnp.exp(u)), self.low, self.high).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class NeverEndingSchedule:
  """Trajectories never end (length ``2**31 - 1``); lanes reset only when they go non-finite."""

  def sample(self, key: jax.Array) -> jax.Array:
    del key
    return jnp.asarray(NEVER, jnp.int32)
