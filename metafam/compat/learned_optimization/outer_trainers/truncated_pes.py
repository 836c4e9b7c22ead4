"""`learned_optimization.outer_trainers.truncated_pes`: `TruncatedPES` is metafam's `metafam.outer_trainers.PES`.

``TruncatedPES(truncated_step, trunc_length, std, steps_per_jit, stack_antithetic_samples)`` builds metafam's PES
on ``truncated_step`` (``truncated_step.num_tasks`` antithetic pairs; ``unroll_length=trunc_length``,
``sigma=std``, ``stack_antithetic=stack_antithetic_samples``); the class is a subclass of metafam's PES that adds the
reference's methods (``init_worker_state(worker_weights, key)``, ``compute_gradient_estimate``). metafam jits a
whole truncation, so ``steps_per_jit`` only keeps the reference's check that it divides ``trunc_length``.

Difference on purpose: metafam credits the last step of a finished trajectory to the perturbations that shaped it
and starts the new trajectory's credit at its first step; the reference credits that boundary step to the new
noise only. Further keyword arguments (``resample_every``, ``loss_kind``, ``clip_loss_diff``) go to metafam's PES.

``compute_gradient_estimate`` fills ``unroll_info`` (``[trunc_length, num_tasks]``) with the positive particles
(``theta + eps``) of the truncation's pairs, as the reference does; the fields are described in `_adapter`.
"""

from __future__ import annotations

from typing import Any, Optional

import jax

from metafam.compat.learned_optimization.outer_trainers import _adapter, gradient_learner
from metafam.outer_trainers import pes as _pes

__all__ = ["TruncatedPES", "TruncatedPESPMAP", "PESWorkerState", "vec_key_split", "PRNGKey", "MetaParams",
           "TruncatedUnrollState"]

PRNGKey = jax.Array
MetaParams = Any
TruncatedUnrollState = Any
# The worker state of `TruncatedPES`: metafam's (lanes, accumulator, ...).
PESWorkerState = _pes.PESWorkerState
vec_key_split = _adapter.vec_key_split


class TruncatedPES(_adapter.LOEstimatorFace, _pes.PES):

  def __init__(self, truncated_step: Any, trunc_length: int = 10, std: float = 0.01, steps_per_jit: int = 10,
               stack_antithetic_samples: bool = False, sign_delta_loss_scalar: Optional[float] = None,
               **metafam_kwargs: Any):
    _adapter.check_truncation_args("TruncatedPES", truncated_step, trunc_length, "trunc_length", steps_per_jit,
                                   sign_delta_loss_scalar)
    super().__init__(truncated_step, unroll_length=trunc_length, sigma=std,
                     stack_antithetic=stack_antithetic_samples, **metafam_kwargs)
    self.truncated_step, self.trunc_length = truncated_step, trunc_length
    self.std, self.steps_per_jit = std, steps_per_jit


gradient_learner.GradientEstimator.register(TruncatedPES)


class TruncatedPESPMAP(_adapter.DeviceSpread, TruncatedPES):
  """`TruncatedPES` over a truncated step whose lanes are spread over several devices (`_adapter.DeviceSpread`).
  ``num_devices`` defaults to the reference's 8 only when given; None takes the step's placement."""

  def __init__(self, *args: Any, num_devices: Optional[int] = None, replicate_data_across_devices: bool = False,
               **kwargs: Any):
    super().__init__(*args, **kwargs)
    self._check_devices(num_devices, replicate_data_across_devices, "TruncatedPESPMAP")


gradient_learner.GradientEstimator.register(TruncatedPESPMAP)
