"""The reference's estimator methods on metafam's estimators (shared by `truncated_pes`, `full_es`, ...).

`LOEstimatorFace` is a mixin placed before a metafam estimator class: ``init_worker_state`` accepts the reference's
`WorkerWeights` (or theta, as metafam's `MetaTrainer` passes it) and ``compute_gradient_estimate`` runs the metafam
estimator's jitted ``estimate``. The estimate itself is the metafam class's, unchanged.
"""

from __future__ import annotations

from typing import Any, Optional

import jax

from metafam.compat.learned_optimization.outer_trainers import gradient_learner
from metafam.inner.truncated_step import TruncatedStep


class LOEstimatorFace:
  """Mixin: the reference's estimator interface over the metafam estimator that follows it in the MRO."""

  truncated_step: Any = None

  @property
  def task_family(self) -> Any:
    return self.truncated_step.family

  @property
  def learned_opt(self) -> Any:
    return self.truncated_step.learned_opt

  def init_worker_state(self, worker_weights: Any, key: jax.Array) -> Any:
    return super().init_worker_state(gradient_learner.theta_of(worker_weights), key)

  def compute_gradient_estimate(self, worker_weights: Any, key: jax.Array, state: Any, with_summary: bool = False,
                                datas_list: Optional[Any] = None):
    """``(GradientEstimatorOut(mean_loss, grad, unroll_state, unroll_info=None), metrics)`` from one ``estimate``."""
    if datas_list is not None:
      raise NotImplementedError("datas_list: metafam samples the batches on the device from the family's datasets.")
    estimate, new_state = self.estimate(gradient_learner.theta_of(worker_weights), state, key)
    out = gradient_learner.GradientEstimatorOut(mean_loss=estimate.meta_loss, grad=estimate.grad,
                                                unroll_state=new_state, unroll_info=None)
    return out, gradient_learner._as_metrics(estimate.metrics)


def check_step(truncated_step: Any, owner: str) -> None:
  if not isinstance(truncated_step, TruncatedStep):
    raise TypeError(f"{owner} needs a truncated step (VectorizedLOptTruncatedStep or metafam's TruncatedStep) as its "
                    f"first argument, got {type(truncated_step).__name__}.")


def check_steps_per_jit(length: Any, steps_per_jit: Any, length_name: str) -> None:
  """The reference's rule: the unroll length must be a multiple of ``steps_per_jit`` (ValueError otherwise)."""
  for name, value in ((length_name, length), ("steps_per_jit", steps_per_jit)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be a positive int, got {value!r}.")
  if length % steps_per_jit:
    raise ValueError(f"Pass a {length_name} and steps_per_jit that are multiples of each other (got {length_name}="
                     f"{length}, steps_per_jit={steps_per_jit}).")


def check_truncation_args(owner: str, truncated_step: Any, length: Any, length_name: str, steps_per_jit: Any,
                          sign_delta_loss_scalar: Any = None) -> None:
  """The reference's argument checks of an estimator over truncations of ``length`` steps, in its order."""
  check_step(truncated_step, owner)
  check_steps_per_jit(length, steps_per_jit, length_name)
  reject_sign_delta(sign_delta_loss_scalar, owner)


def reject_sign_delta(sign_delta_loss_scalar: Any, owner: str) -> None:
  if sign_delta_loss_scalar is not None:
    raise NotImplementedError(f"{owner}: sign_delta_loss_scalar has no counterpart in metafam (see clip_loss_diff).")
