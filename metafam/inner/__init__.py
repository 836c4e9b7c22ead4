"""Vectorized truncated inner training."""

from metafam.inner.schedules import NEVER, ConstantSchedule, LogUniformSchedule, NeverEndingSchedule
from metafam.inner.truncated_step import LaneState, TruncatedStep, UnrollOutput

__all__ = ["NEVER", "ConstantSchedule", "LogUniformSchedule", "NeverEndingSchedule", "LaneState", "TruncatedStep",
           "UnrollOutput"]
