"""The reference's estimator methods on metafam's estimators (shared by `truncated_pes`, `full_es`, ...).

`LOEstimatorFace` is a mixin placed before a metafam estimator class: ``init_worker_state`` accepts the reference's
`WorkerWeights` (or theta, as metafam's `MetaTrainer` passes it) and ``compute_gradient_estimate`` runs the metafam
estimator's jitted ``estimate``. The estimate itself is the metafam class's, unchanged.

``unroll_info`` (`lo_unroll_info`): the reference's `gradient_learner.UnrollInfo` of ``[steps, lanes]`` arrays,
from the per-step outputs metafam's estimate returns with ``with_unroll_info=True`` (the same unroll as the
estimate; that program is compiled separately from the default ``estimate``, which `MetaTrainer` uses).
``compute_gradient_estimate`` runs the default ``estimate`` and returns a `LazyUnrollInfo`: reading any of its
fields (or testing it) runs the with-unroll_info program once, from the same theta, worker state and key -- the
estimate is a pure function of them, so it is the same unroll -- and caches the result. Code that never reads
``unroll_info`` never compiles or runs that program. Its fields are:

* ``loss``: each step's loss of the estimator's ``loss_kind`` (by default the task-normalized meta-loss, the value
  the estimate averages; 0 on a masked, non-finite step);
* ``iteration``: the lane's inner step *after* the step, as the reference counts it (``1 .. length`` over a
  trajectory; metafam's `UnrollOutput.iteration` is the step's index, one less);
* ``task_param``: the task config of the trajectory the step belongs to (leaves ``[steps, lanes, ...]``);
* ``is_done``: the step is the last of its trajectory (its length reached, or non-finite); the lane resets after
  it. metafam has no separate reset step: the step after ``is_done`` already trains the new instance.

Lanes: TBPTT (`TruncatedGrad`) reports all of its lanes; the ES estimators (`TruncatedPES`, `TruncatedES`,
`FullES`) the positive particle of each antithetic pair (``theta + eps``, ``[steps, num_tasks]``), as the reference
does. Estimators with ``reports_unroll_info = False`` (`FullGrad`, like the reference's) return None.
"""

from __future__ import annotations

from typing import Any, Optional

import jax

from metafam.compat.learned_optimization.outer_trainers import gradient_learner
from metafam.inner.truncated_step import TruncatedStep


class LazyUnrollInfo:
  """The reference's `UnrollInfo` of one estimate, computed on first use (see the module docstring): its fields
  ``loss``, ``iteration``, ``task_param`` and ``is_done`` are the computed
  `gradient_learner.UnrollInfo`'s (``value()`` returns it)."""

  def __init__(self, compute):
    self._compute, self._value = compute, None

  def value(self) -> Any:
    if self._value is None:
      self._value, self._compute = self._compute(), None
    return self._value

  def __getattr__(self, name: str) -> Any:
    if name.startswith("__"):
      raise AttributeError(name)
    return getattr(self.value(), name)

  def __bool__(self) -> bool:
    return True

  def __repr__(self) -> str:
    return f"LazyUnrollInfo({'not computed' if self._value is None else self._value!r})"


class LOEstimatorFace:
  """Mixin: the reference's estimator interface over the metafam estimator that follows it in the MRO."""

  truncated_step: Any = None

  @property
  def task_family(self) -> Any:
    return self.truncated_step.family

  @property
  def learned_opt(self) -> Any:
    return self.truncated_step.learned_opt

  def task_name(self) -> str:
    """The truncated step's task name (for logging), as the reference's estimators report it."""
    name_fn = getattr(self.truncated_step, "task_name", None)
    return name_fn() if callable(name_fn) else "default_task"

  def cfg_name(self) -> str:
    """The truncated step's configuration name (for logging)."""
    name_fn = getattr(self.truncated_step, "cfg_name", None)
    return name_fn() if callable(name_fn) else "default_cfg"

  def init_worker_state(self, worker_weights: Any, key: jax.Array) -> Any:
    return super().init_worker_state(gradient_learner.theta_of(worker_weights), key)

  def compute_gradient_estimate(self, worker_weights: Any, key: jax.Array, state: Any, with_summary: bool = False,
                                datas_list: Optional[Any] = None, eager_unroll_info: bool = False):
    """``(GradientEstimatorOut(mean_loss, grad, unroll_state, unroll_info), metrics)`` from one ``estimate``
    (``unroll_info``: a `LazyUnrollInfo`, see the module docstring; ``eager_unroll_info=True``, for a caller that
    reads it every time such as `gradient_learner.gradient_worker_compute`, runs the with-unroll_info program
    instead of the default one, so the unroll runs once)."""
    if datas_list is not None:
      raise NotImplementedError("datas_list: metafam samples the batches on the device from the family's datasets.")
    theta = gradient_learner.theta_of(worker_weights)
    reports = bool(getattr(self, "reports_unroll_info", False))
    estimate, new_state = self.estimate(theta, state, key, with_unroll_info=reports and eager_unroll_info)
    info = None
    if reports and eager_unroll_info:
      info = lo_unroll_info(estimate.unroll_info, self.loss_kind)
    elif reports:
      info = LazyUnrollInfo(
          lambda: lo_unroll_info(self.estimate(theta, state, key, with_unroll_info=True)[0].unroll_info,
                                 self.loss_kind))
    out = gradient_learner.GradientEstimatorOut(mean_loss=estimate.meta_loss, grad=estimate.grad,
                                                unroll_state=new_state, unroll_info=info)
    return out, gradient_learner._as_metrics(estimate.metrics)


def lo_unroll_info(out: Any, loss_kind: str = "normalized_meta_loss") -> Any:
  """The reference's `gradient_learner.UnrollInfo` of metafam's per-step outputs (an `UnrollOutput` with ``cfg``;
  None gives None): ``loss`` of ``loss_kind``, ``iteration`` counted after the step, ``task_param``, ``is_done``."""
  if out is None:
    return None
  return gradient_learner.UnrollInfo(loss=getattr(out, loss_kind), iteration=out.iteration + 1,
                                     task_param=out.cfg, is_done=out.is_done)


def vec_key_split(key: jax.Array):
  """``(k1, k2)``: each key of a stack of keys split in two (the reference's per-device key split)."""
  return jax.vmap(lambda k: tuple(jax.random.split(k)))(key)


class DeviceSpread:
  """Mixin for the reference's multi-device estimators (``PMAPFullES``, ``TruncatedPESPMAP``).

  metafam spreads lanes over devices with `jax.sharding` in the truncated step itself (``devices=`` of
  `VectorizedLOptTruncatedStep` / metafam's `TruncatedStep`), not with ``pmap``; the estimator is the single-device
  one on that sharded step. ``num_devices`` (None: the step's own placement) must equal the number of devices the
  step's lanes are spread over (ValueError otherwise); ``replicate_data_across_devices=True`` is not modelled
  (NotImplementedError: every lane draws its own batches).
  """

  def _check_devices(self, num_devices: Any, replicate_data_across_devices: bool, owner: str) -> None:
    if replicate_data_across_devices:
      raise NotImplementedError(f"{owner}: replicate_data_across_devices=True has no counterpart in metafam (each "
                                "lane samples its own batches on the device).")
    mesh = getattr(self.truncated_step, "mesh", None)
    spread = 1 if mesh is None else int(mesh.size)
    if num_devices is not None and int(num_devices) != spread:
      raise ValueError(f"{owner}: num_devices={num_devices} but the truncated step's lanes are on {spread} "
                       "device(s); build the truncated step with devices=num_devices.")
    self.num_devices = spread
    self.replicate_data_across_devices = False


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
