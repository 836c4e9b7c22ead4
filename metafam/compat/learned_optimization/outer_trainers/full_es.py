"""`learned_optimization.outer_trainers.full_es`: `FullES` is metafam's `metafam.outer_trainers.FullES`
(antithetic ES over complete trajectories from fresh task instances) with the reference's arguments.

The trajectory length is ``unroll_length`` if given (the reference's early signature), else the length of
``truncation_schedule`` (or of ``truncated_step``'s schedule), which must be constant. ``loss_type``: "avg",
"last" or "min" ("last_recompute" is not mirrored: NotImplementedError; anything else: ValueError, as in the
reference). ``steps_per_jit`` must divide the length.
"""

from __future__ import annotations

from typing import Any, Optional

from metafam.compat.learned_optimization.outer_trainers import _adapter, gradient_learner, truncation_schedule
from metafam.inner.schedules import ConstantSchedule
from metafam.outer_trainers import estimators as _estimators

__all__ = ["FullES"]


def _constant_length(schedule: Any) -> int:
  mf = truncation_schedule.as_metafam_schedule(schedule)
  if not isinstance(mf, ConstantSchedule):
    raise NotImplementedError(f"FullES runs trajectories of one fixed length; got a {type(schedule).__name__}. Use "
                              "ConstantTruncationSchedule (or pass unroll_length).")
  return mf.length


class FullES(_adapter.LOEstimatorFace, _estimators.FullES):

  def __init__(self, truncated_step: Any, truncation_schedule: Any = None, std: float = 0.01,
               steps_per_jit: int = 10, loss_type: str = "avg", recompute_samples: int = 50,
               recompute_split: str = "train", clip_loss_diff: Optional[float] = None,
               stack_antithetic_samples: bool = False, sign_delta_loss_scalar: Optional[float] = None,
               unroll_length: Optional[int] = None, **metafam_kwargs: Any):
    _adapter.check_step(truncated_step, "FullES")
    if loss_type == "last_recompute":
      raise NotImplementedError("FullES loss_type='last_recompute' is not mirrored; use 'avg', 'last' or 'min'.")
    if loss_type not in _estimators.FULL_ES_LOSS_TYPES:
      raise ValueError(f"Unsupported loss type {loss_type}.")
    _adapter.reject_sign_delta(sign_delta_loss_scalar, "FullES")
    if unroll_length is None:
      unroll_length = _constant_length(truncated_step.schedule if truncation_schedule is None
                                       else truncation_schedule)
    _adapter.check_steps_per_jit(unroll_length, steps_per_jit, "unroll_length")
    super().__init__(truncated_step, trajectory_length=unroll_length, sigma=std, loss_type=loss_type,
                     clip_loss_diff=clip_loss_diff, stack_antithetic=stack_antithetic_samples, **metafam_kwargs)
    self.truncated_step, self.std, self.steps_per_jit = truncated_step, std, steps_per_jit
    self.unroll_length = unroll_length


gradient_learner.GradientEstimator.register(FullES)
