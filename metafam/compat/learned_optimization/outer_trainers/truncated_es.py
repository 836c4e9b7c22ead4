"""`learned_optimization.outer_trainers.truncated_es`: `TruncatedES` is metafam's
`metafam.outer_trainers.TruncatedES` (antithetic ES over one truncation from the shared unperturbed state) built
with the reference's arguments (``unroll_length``, ``std`` -> ``sigma``, ``stack_antithetic_samples``); see
`truncated_pes` for the shared conventions. ``unroll_info`` (``[unroll_length, num_tasks]``) holds the positive
particles (``theta + eps``) of the truncation's pairs, as in the reference; the plain unroll that advances the shared
state is not reported."""

from __future__ import annotations

from typing import Any, Optional

import jax

from metafam.compat.learned_optimization.outer_trainers import _adapter, gradient_learner
from metafam.outer_trainers import estimators as _estimators

__all__ = ["TruncatedES", "PRNGKey", "MetaParams", "UnrollState"]

PRNGKey = jax.Array
MetaParams = Any
UnrollState = Any  # the worker state: metafam's lane state


class TruncatedES(_adapter.LOEstimatorFace, _estimators.TruncatedES):

  def __init__(self, truncated_step: Any, unroll_length: int = 20, steps_per_jit: int = 10, std: float = 0.01,
               stack_antithetic_samples: bool = False, sign_delta_loss_scalar: Optional[float] = None,
               **metafam_kwargs: Any):
    _adapter.check_truncation_args("TruncatedES", truncated_step, unroll_length, "unroll_length", steps_per_jit,
                                   sign_delta_loss_scalar)
    super().__init__(truncated_step, unroll_length=unroll_length, sigma=std,
                     stack_antithetic=stack_antithetic_samples, **metafam_kwargs)
    self.truncated_step, self.std, self.steps_per_jit = truncated_step, std, steps_per_jit


gradient_learner.GradientEstimator.register(TruncatedES)
