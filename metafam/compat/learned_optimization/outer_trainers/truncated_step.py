"""`learned_optimization.outer_trainers.truncated_step`: the vectorized truncated step is metafam's
`metafam.inner.TruncatedStep` (see `lopt_truncated_step.VectorizedLOptTruncatedStep` for the reference's
constructor)."""

from metafam.inner.truncated_step import TruncatedStep as VectorizedTruncatedStep

__all__ = ["VectorizedTruncatedStep"]
