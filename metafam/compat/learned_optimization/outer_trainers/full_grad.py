"""`learned_optimization.outer_trainers.full_grad`: `FullGrad`, backpropagation through complete trajectories.

Each estimate starts ``truncated_step.num_tasks`` fresh task instances, trains them for the length of
``truncation_schedule`` (which must be constant) and returns the gradient of their meta-loss with respect to theta:
``loss_type="avg"`` the mean over all (finite) steps, ``"last"`` the mean of the last step's. As in the reference,
the truncated step's own schedule must never end (``NeverEndingTruncationSchedule``; ValueError otherwise). The
unroll is metafam's (`TruncatedStep.unroll_fn`, differentiated by `jax.value_and_grad` as metafam's
`TruncatedBPTT` does); non-finite steps are masked out and non-finite gradient entries zeroed. Stateless: the
worker state is an empty `UnrollState`.

Why ``estimate_fn`` is not `TruncatedBPTT.estimate_fn`: that one continues the lanes of its worker state and
averages every step, while FullGrad starts fresh instances inside the differentiated function (their
initialization is part of what is differentiated) and has LO's ``loss_type="last"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.outer_trainers import _adapter, full_es, gradient_learner
from metafam.inner import pairs
from metafam.inner.schedules import NeverEndingSchedule
from metafam.outer_trainers import estimators as _estimators
from metafam.outer_trainers.base import GradientEstimate, step_losses, zero_nonfinite

__all__ = ["FullGrad", "UnrollState", "PRNGKey", "MetaParams"]

PRNGKey = jax.Array
MetaParams = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class UnrollState(gradient_learner.GradientEstimatorState):
  """FullGrad's (empty) worker state: each estimate starts fresh task instances."""

LOSS_TYPES = ("avg", "last")


class FullGrad(_adapter.LOEstimatorFace, _estimators.TruncatedBPTT):
  """Gradient of the meta-loss of complete trajectories from fresh instances (see the module docstring)."""

  name = "full_grad"
  reports_unroll_info = False  # the reference's FullGrad returns unroll_info=None too

  def __init__(self, truncated_step: Any, truncation_schedule: Any, loss_type: str = "avg"):
    _adapter.check_step(truncated_step, "FullGrad")
    if loss_type not in LOSS_TYPES:
      raise ValueError(f"FullGrad: loss_type must be one of {LOSS_TYPES}, got {loss_type!r}.")
    if not isinstance(truncated_step.schedule, NeverEndingSchedule):
      raise ValueError("FullGrad manages the trajectory length itself: build the truncated step with "
                       "trunc_sched=NeverEndingTruncationSchedule().")
    length = full_es._constant_length(truncation_schedule)  # pylint: disable=protected-access
    super().__init__(truncated_step, unroll_length=length)
    self.truncated_step, self.truncation_schedule, self.loss_type = truncated_step, truncation_schedule, loss_type
    self.step = truncated_step.replace(random_initial_iteration=False)

  def init_worker_state(self, worker_weights: Any, key: jax.Array) -> UnrollState:
    del worker_weights, key
    return UnrollState()

  def estimate_fn(self, theta, worker_state, key):
    k_init, k_unroll = jax.random.split(key)
    keys = self._unroll_keys(k_unroll, self.unroll_length)

    def meta_loss(theta):
      lanes = self.step.init_fn(theta, k_init)
      _, out = self.step.unroll_fn(theta, lanes, keys)
      losses, mask = step_losses(out, self.loss_kind)
      if self.loss_type == "last":
        losses, mask = losses[-1:], mask[-1:]
      return pairs.masked_mean_or_nan(jnp.sum(losses * mask), jnp.sum(mask)), mask

    (loss, mask), grad = jax.value_and_grad(meta_loss, has_aux=True)(theta)
    grad, bad = zero_nonfinite(grad)
    return GradientEstimate(grad, loss, {"num_nonfinite": jnp.sum(1.0 - mask) + bad}), worker_state


gradient_learner.GradientEstimator.register(FullGrad)
