"""`learned_optimization.outer_trainers.full_es`: `FullES` is metafam's `metafam.outer_trainers.FullES`
(antithetic ES over complete trajectories from fresh task instances) with the reference's arguments.

The trajectory length is ``unroll_length`` if given (the reference's early signature), else the length of
``truncation_schedule`` (or of ``truncated_step``'s schedule), which must be constant. As in the reference, a
``truncation_schedule`` needs a ``truncated_step`` whose own schedule never ends (ValueError otherwise).
``loss_type``: "avg", "last", "min" (metafam's) or "last_recompute": the meta-loss of each perturbed trajectory is
its final params' mean meta-loss (the loss, or the step's ``meta_loss_with_aux_key`` value) over
``recompute_samples`` batches of ``recompute_split`` (drawn on the device, the same
batches for every lane; normalized as metafam's loss kind says); anything else: ValueError, as in the reference.
``steps_per_jit`` must divide the length. ``unroll_info`` (``[length, num_tasks]``) holds the whole trajectories of
the positive particles (``theta + eps``), for every ``loss_type`` (the reference: for "last_recompute" only its
last ``steps_per_jit`` steps); its ``is_done`` stays False, as the trajectories' schedule never ends.

The only math of this module is "last_recompute" (`FullES._recomputed_losses`): metafam's `FullES` has no such loss
type, so it is supplied through the engine's ``trajectory_losses`` hook; perturbation, unroll and estimate are the
engine's.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.outer_trainers import _adapter, gradient_learner, truncation_schedule
from metafam.inner.schedules import ConstantSchedule, NeverEndingSchedule
from metafam.optimizers import low_rank
from metafam.outer_trainers import estimators as _estimators

__all__ = ["FullES", "PMAPFullES", "vec_key_split", "OverrideStepVectorizedTruncatedStep", "UnrollState",
           "PRNGKey", "MetaParams"]

PRNGKey = jax.Array
MetaParams = Any
UnrollState = Any  # FullES is stateless: its worker state is {}
vec_key_split = _adapter.vec_key_split


class OverrideStepVectorizedTruncatedStep(Protocol):
  """A vectorized truncated step whose ``init_step_state`` / ``unroll_step`` take a ``num_steps_override`` (the
  reference's requirement on steps used by `FullES`; `VectorizedLOptTruncatedStep` is one)."""

  def init_step_state(self, theta, outer_state, key, theta_is_vector=False, num_steps_override=None):
    ...

  def unroll_step(self, theta, unroll_state, key, data, outer_state, theta_is_vector=False,
                  override_num_steps=None):
    ...

LOSS_TYPES = _estimators.FULL_ES_LOSS_TYPES + ("last_recompute",)


def _constant_length(schedule: Any) -> int:
  mf = truncation_schedule.as_metafam_schedule(schedule)
  if not isinstance(mf, ConstantSchedule):
    raise NotImplementedError(f"FullES runs trajectories of one fixed length; got a {type(schedule).__name__}. Use "
                              "ConstantTruncationSchedule (or pass unroll_length).")
  return mf.length


class FullES(_adapter.LOEstimatorFace, _estimators.FullES):

  def __init__(self, truncated_step: Any, truncation_schedule: Any = None, std: float = 0.01,
               steps_per_jit: int = 10, loss_type: str = "avg", recompute_samples: int = 50,
               clip_loss_diff: Optional[float] = None, stack_antithetic_samples: bool = False,
               sign_delta_loss_scalar: Optional[float] = None, recompute_split: str = "train",
               unroll_length: Optional[int] = None, **metafam_kwargs: Any):
    _adapter.check_step(truncated_step, "FullES")
    if loss_type not in LOSS_TYPES:
      raise ValueError(f"Unsupported loss type {loss_type}.")
    _adapter.reject_sign_delta(sign_delta_loss_scalar, "FullES")
    if truncation_schedule is not None and not isinstance(truncated_step.schedule, NeverEndingSchedule):
      raise ValueError("FullES with a truncation_schedule needs a truncated_step whose trunc_sched is "
                       "NeverEndingTruncationSchedule (FullES decides the trajectory length).")
    if unroll_length is None:
      unroll_length = _constant_length(truncated_step.schedule if truncation_schedule is None
                                       else truncation_schedule)
    _adapter.check_steps_per_jit(unroll_length, steps_per_jit, "unroll_length")
    recompute = loss_type == "last_recompute"
    if recompute:
      if isinstance(recompute_samples, bool) or not isinstance(recompute_samples, int) or recompute_samples < 1:
        raise ValueError(f"recompute_samples must be a positive int, got {recompute_samples!r}.")
      datasets = truncated_step.family.datasets
      if datasets is not None:
        datasets.split(recompute_split)  # ValueError for an unknown split
    super().__init__(truncated_step, trajectory_length=unroll_length, sigma=std,
                     loss_type="last" if recompute else loss_type, clip_loss_diff=clip_loss_diff,
                     stack_antithetic=stack_antithetic_samples, **metafam_kwargs)
    self.truncated_step, self.std, self.steps_per_jit = truncated_step, std, steps_per_jit
    self.unroll_length = unroll_length
    self.lo_loss_type = loss_type
    self.recompute_samples, self.recompute_split = recompute_samples, recompute_split
    self._recompute = recompute

  def _particle_step(self, truncated_step: Any) -> Any:
    # The reference runs FullES's trajectories on the never-ending schedule its truncated step was given: no step
    # is done, and an optimizer that reads the run's length is told that one (metafam's FullES tells it the
    # trajectory's length instead).
    return truncated_step.replace(schedule=NeverEndingSchedule(), random_initial_iteration=False)

  def _recomputed_losses(self, thetas, lanes, key):
    """``f32[2N]``: each lane's mean loss at its final params over ``recompute_samples`` shared batches."""
    step = self.step
    datasets = step.family.datasets
    data = None if datasets is None else datasets.device_data(self.recompute_split)
    normalized = self.loss_kind.startswith("normalized")

    def lane_loss(theta, cfg, opt_state, k, batch):
      opt = step.opt_fn(theta)
      task = step.family.task_fn(cfg)
      loss = task.loss_with_state_and_aux(opt.get_params(opt_state), opt.get_state(opt_state), k, batch)[0]
      return task.normalizer(loss) if normalized else loss

    def sample_loss(k):
      k_data, k_loss = jax.random.split(k)
      batch = None if data is None else data.sample(k_data)
      return jax.vmap(lane_loss, in_axes=(low_rank.lane_axes(thetas), 0, 0, None, None))(
          thetas, lanes.cfg, lanes.opt_state, k_loss, batch)

    return jnp.mean(jax.lax.map(sample_loss, jax.random.split(key, self.recompute_samples)), axis=0)

  def trajectory_losses(self, losses, thetas, lanes, key):
    if not self._recompute:
      return super().trajectory_losses(losses, thetas, lanes, key)
    return self._recomputed_losses(thetas, lanes, key)


gradient_learner.GradientEstimator.register(FullES)


class PMAPFullES(_adapter.DeviceSpread, FullES):
  """`FullES` over a truncated step whose lanes are spread over several devices (see `_adapter.DeviceSpread`)."""

  def __init__(self, *args: Any, num_devices: Optional[int] = None, replicate_data_across_devices: bool = False,
               **kwargs: Any):
    super().__init__(*args, **kwargs)
    self._check_devices(num_devices, replicate_data_across_devices, "PMAPFullES")


gradient_learner.GradientEstimator.register(PMAPFullES)
