"""`learned_optimization.outer_trainers.truncated_grad`: `TruncatedGrad` is metafam's
`metafam.outer_trainers.TruncatedBPTT` (backpropagation through each truncation of ``unroll_length`` steps of
``truncated_step``'s lanes), with the reference's arguments; ``steps_per_jit`` must divide ``unroll_length``."""

from __future__ import annotations

from typing import Any

from metafam.compat.learned_optimization.outer_trainers import _adapter, gradient_learner
from metafam.outer_trainers import estimators as _estimators

__all__ = ["TruncatedGrad"]


class TruncatedGrad(_adapter.LOEstimatorFace, _estimators.TruncatedBPTT):

  def __init__(self, truncated_step: Any, unroll_length: int = 20, steps_per_jit: int = 10, **metafam_kwargs: Any):
    _adapter.check_truncation_args("TruncatedGrad", truncated_step, unroll_length, "unroll_length", steps_per_jit)
    super().__init__(truncated_step, unroll_length=unroll_length, **metafam_kwargs)
    self.truncated_step, self.steps_per_jit = truncated_step, steps_per_jit


gradient_learner.GradientEstimator.register(TruncatedGrad)
