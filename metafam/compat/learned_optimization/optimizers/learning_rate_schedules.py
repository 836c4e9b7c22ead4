"""`learned_optimization.optimizers.learning_rate_schedules`: scalar schedules ``f(global_step, max_steps=None)``.

Plain jnp functions of the step (jit- and vmap-safe); `optimizers.optax_opts` and
`outer_trainers.truncation_schedule.ScheduledTruncationSchedule` take them. Values match the reference's formulas:

* `PiecewiseLinear(times, vals)`: linear between the points, ``vals[0]`` before and ``vals[-1]`` after.
* `ExponentialDecay(base_lr, decay_amount)`: ``base_lr * (1 - decay_amount) ** step``.
* `LinearRampupSqrtDecay(peak_lr, warmup_steps)`: ``peak_lr * min(step / warmup, sqrt(warmup / step))``.
* `CosineLearningRateSchedule(learning_rate, min_learning_rate_mult, constant_fraction, warmup_fraction)`: needs
  ``max_steps``; a linear warmup from 0 over ``max(warmup_fraction, constant_fraction) * max_steps`` steps (when
  ``warmup_fraction > 0``), ``learning_rate`` until ``constant_fraction * max_steps``, then a half cosine down to
  ``min_learning_rate_mult * learning_rate`` at ``max_steps``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from metafam.compat.learned_optimization.optimizers.optax_opts import piecewise_linear

__all__ = ["ScalarSchedule", "PiecewiseLinear", "ExponentialDecay", "LinearRampupSqrtDecay",
           "CosineLearningRateSchedule"]


class ScalarSchedule:
  """Base class: ``schedule(global_step, max_steps=None) -> scalar``."""

  def __call__(self, global_step: Any, max_steps: Optional[Any] = None) -> Any:
    raise NotImplementedError


class PiecewiseLinear(ScalarSchedule):

  def __init__(self, times: Sequence[float], vals: Sequence[float]):
    if len(times) != len(vals):
      raise ValueError(f"PiecewiseLinear needs as many times as values, got {len(times)} and {len(vals)}.")
    self.times, self.vals = list(times), list(vals)
    self._fn = piecewise_linear(times, vals)

  def __call__(self, global_step, max_steps=None):
    return self._fn(global_step)


class ExponentialDecay(ScalarSchedule):

  def __init__(self, base_lr: float, decay_amount: float):
    self.base_lr, self.decay_amount = base_lr, decay_amount

  def __call__(self, global_step, max_steps=None):
    return self.base_lr * (1.0 - self.decay_amount) ** jnp.asarray(global_step, jnp.float32)


class LinearRampupSqrtDecay(ScalarSchedule):

  def __init__(self, peak_lr: float = 1e-3, warmup_steps: int = 1000):
    self.peak_lr, self.warmup_steps = peak_lr, warmup_steps

  def __call__(self, global_step, max_steps=None):
    step = jnp.asarray(global_step, jnp.float32)
    warmup = jnp.float32(self.warmup_steps)
    return self.peak_lr * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))


class CosineLearningRateSchedule(ScalarSchedule):

  def __init__(self, learning_rate: float, min_learning_rate_mult: float = 0.0, constant_fraction: float = 0.5,
               warmup_fraction: float = 0.01):
    self.learning_rate, self.min_learning_rate_mult = learning_rate, min_learning_rate_mult
    self.constant_fraction, self.warmup_fraction = constant_fraction, warmup_fraction

  def __call__(self, global_step, max_steps=None):
    if max_steps is None:
      raise ValueError("CosineLearningRateSchedule needs max_steps.")
    total = jnp.asarray(max_steps, jnp.float32)
    step = jnp.minimum(jnp.asarray(global_step, jnp.float32), total)
    hold = total * self.constant_fraction
    low = self.min_learning_rate_mult * self.learning_rate
    phase = (jnp.maximum(step, hold) - hold) / (total - hold)
    decayed = low + (self.learning_rate - low) * (jnp.cos(phase * np.pi) / 2.0 + 0.5)
    # jnp, not Python, control flow: the fractions may be traced (OptList with a traced index).
    warmup = total * jnp.maximum(self.warmup_fraction, self.constant_fraction)
    ramp = step / jnp.where(warmup > 0, warmup, 1.0) * self.learning_rate
    return jnp.where((jnp.asarray(self.warmup_fraction) > 0) & (step < warmup), ramp, decayed)
