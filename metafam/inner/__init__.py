"""Inner training: the one single-lane step (`step`); one step of every lane (`lane_step`: `LaneState`,
`UnrollOutput`, NaN-safe masking); `TruncatedStep`, which runs those steps in truncated unrolls (schedules, resets,
antithetic pairs, lanes spread over devices); and `Runner` (`runner`), fixed-length training with evaluation
points, which evaluation and training drive."""

from metafam.inner.runner import Runner
from metafam.inner.schedules import NEVER, ConstantSchedule, LogUniformSchedule, NeverEndingSchedule
from metafam.inner.step import StepKeys, split_step_key, train_step
from metafam.inner.lane_step import LaneState, UnrollOutput
from metafam.inner.truncated_step import TruncatedStep

__all__ = ["NEVER", "ConstantSchedule", "LogUniformSchedule", "NeverEndingSchedule", "StepKeys", "split_step_key",
           "train_step", "LaneState", "TruncatedStep", "UnrollOutput", "Runner"]
