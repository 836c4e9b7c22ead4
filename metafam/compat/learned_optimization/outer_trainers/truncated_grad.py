"""`learned_optimization.outer_trainers.truncated_grad`: `TruncatedGrad` is metafam's
`metafam.outer_trainers.TruncatedBPTT` (backpropagation through each truncation of ``unroll_length`` steps of
``truncated_step``'s lanes), with the reference's arguments; ``steps_per_jit`` must divide ``unroll_length``;
``loss_type`` is "avg" (the only type metafam's estimator computes). ``unroll_info``: every lane of the truncation,
``[unroll_length, num_tasks]`` (see `_adapter`)."""

from __future__ import annotations

from typing import Any

import jax

from metafam.compat.learned_optimization.outer_trainers import _adapter, gradient_learner
from metafam.outer_trainers import estimators as _estimators

__all__ = ["TruncatedGrad", "PRNGKey", "UnrollState"]

PRNGKey = jax.Array
UnrollState = Any  # the worker state: metafam's lane state


class TruncatedGrad(_adapter.LOEstimatorFace, _estimators.TruncatedBPTT):

  def __init__(self, truncated_step: Any, unroll_length: int = 20, steps_per_jit: int = 10, loss_type: str = "avg",
               **metafam_kwargs: Any):
    _adapter.check_truncation_args("TruncatedGrad", truncated_step, unroll_length, "unroll_length", steps_per_jit)
    if loss_type != "avg":
      raise NotImplementedError(f"TruncatedGrad: loss_type={loss_type!r}; metafam's truncated backpropagation "
                                "averages the truncation's meta-losses (only loss_type='avg').")
    self.loss_type = loss_type
    super().__init__(truncated_step, unroll_length=unroll_length, **metafam_kwargs)
    self.truncated_step, self.steps_per_jit = truncated_step, steps_per_jit


gradient_learner.GradientEstimator.register(TruncatedGrad)
