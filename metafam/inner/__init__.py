"""Inner training: the one single-lane step (`step`); `TruncatedStep`, which vectorizes it over lanes in truncated
unrolls (schedules, antithetic pairs, NaN-safe masking, lanes spread over devices); and `Runner` (`runner`),
fixed-length training with evaluation points, which evaluation and training drive."""

from metafam.inner.runner import Runner
from metafam.inner.schedules import NEVER, ConstantSchedule, LogUniformSchedule, NeverEndingSchedule
from metafam.inner.step import StepKeys, split_step_key, train_step
from metafam.inner.truncated_step import LaneState, TruncatedStep, UnrollOutput

__all__ = ["NEVER", "ConstantSchedule", "LogUniformSchedule", "NeverEndingSchedule", "StepKeys", "split_step_key",
           "train_step", "LaneState", "TruncatedStep", "UnrollOutput", "Runner"]
