"""`learned_optimization.optimizers.alias`: two named Adam configurations with decaying learning rates."""

from __future__ import annotations

from metafam.compat.learned_optimization.optimizers import learning_rate_schedules, optax_opts

__all__ = ["AdamSqrtDecayLR", "AdamExpDecayLR"]


def AdamSqrtDecayLR(learning_rate: float) -> optax_opts.Adam:  # noqa: N802 -- the reference's name
  """Adam whose learning rate ramps up linearly over 1,000 steps, then decays as ``1 / sqrt(step)``."""
  return optax_opts.Adam(learning_rate_schedules.LinearRampupSqrtDecay(learning_rate, warmup_steps=1000))


def AdamExpDecayLR(learning_rate: float) -> optax_opts.Adam:  # noqa: N802 -- the reference's name
  """Adam whose learning rate decays as ``learning_rate * (1 - 7e-5) ** step`` (about 1,000x over 100,000 steps)."""
  return optax_opts.Adam(learning_rate_schedules.ExponentialDecay(learning_rate, 7e-5))
