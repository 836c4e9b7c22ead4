"""`learned_optimization.learning_rate_schedules` (the reference's early location): the schedules of
`optimizers.learning_rate_schedules`."""

from metafam.compat.learned_optimization.optimizers.learning_rate_schedules import (
    CosineLearningRateSchedule, ExponentialDecay, LinearRampupSqrtDecay, PiecewiseLinear, ScalarSchedule)

__all__ = ["ScalarSchedule", "PiecewiseLinear", "ExponentialDecay", "LinearRampupSqrtDecay",
           "CosineLearningRateSchedule"]
