"""`learned_optimization.tasks.parametric.lopt_trunc`: a family of learned-optimizer meta-objectives estimated
from truncated unrolls.

`ParametricLOptTrunc(task_family, lopt, trunc_sched, unroll_length, outer_batch_size, max_length, mode)` has one
member (configuration ``CFGNamed("ParametricLOpt", {})``): `tasks.fixed.lopt.TruncGradEstTask` of ``lopt`` with the
estimator ``mode`` (``"TruncatedPES"``, ``"TruncatedES"`` or ``"TruncatedGrad"``, metafam's estimators under
`outer_trainers`) over a `VectorizedLOptTruncatedStep` of ``outer_batch_size`` lanes; ``max_length > 0`` staggers
the lanes' first trajectories. The reference's research estimators ``"TruncatedSNES"`` and
``"TruncatedESSharedNoiseV2"`` (``research.hyper_lopt``) are not provided: NotImplementedError names them.
`sample_lopt_trunc` draws a configuration (see its docstring); `timed_sample_lopt_trunc` needs the reference's
learned runtime models and raises NotImplementedError. The tasks are data-free (the estimator samples its batches
on the device).
"""

from __future__ import annotations

from typing import Any

import jax

from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.outer_trainers import lopt_truncated_step, truncated_es, truncated_grad
from metafam.compat.learned_optimization.outer_trainers import truncated_pes, truncation_schedule
from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.fixed import lopt as lopt_mod
from metafam.compat.learned_optimization.tasks.parametric import cfgobject
from metafam.compat.learned_optimization.tasks.parametric import image_mlp as para_image_mlp
from metafam.compat.learned_optimization.tasks.parametric import parametric_utils as pu
from metafam.compat.learned_optimization.tasks.parametric.lopt import sample_lopt_cfg

Batch = Any
Params = Any
ModelState = Any
PRNGKey = jax.Array

__all__ = ["Batch", "Params", "ModelState", "ParametricLOptTrunc", "sample_lopt_trunc", "timed_sample_lopt_trunc",
           "MODES"]

# mode -> the estimator class; each takes (truncated_step, unroll_length, steps_per_jit=...)
MODES = {"TruncatedPES": truncated_pes.TruncatedPES, "TruncatedES": truncated_es.TruncatedES,
         "TruncatedGrad": truncated_grad.TruncatedGrad}
_RESEARCH_MODES = ("TruncatedSNES", "TruncatedESSharedNoiseV2")


class ParametricLOptTrunc(base.TaskFamily):
  """`TruncGradEstTask` of ``lopt`` trained on ``task_family`` by the estimator ``mode`` (see the module)."""

  def __init__(self, task_family: base.TaskFamily, lopt: lopt_base.LearnedOptimizer,
               trunc_sched: truncation_schedule.TruncationSchedule, unroll_length: int, outer_batch_size: int,
               max_length: int, mode: str):
    super().__init__()
    if mode in _RESEARCH_MODES:
      raise NotImplementedError(f"mode={mode!r} is an estimator of the reference's research.hyper_lopt, which "
                                f"metafam does not provide; use one of {sorted(MODES)}.")
    if mode not in MODES:
      raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}.")
    for name, value in (("unroll_length", unroll_length), ("outer_batch_size", outer_batch_size)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
      raise ValueError(f"max_length must be a non-negative int, got {max_length!r}.")
    self.lopt, self.mode = lopt, mode
    tstep = lopt_truncated_step.VectorizedLOptTruncatedStep(task_family, lopt, trunc_sched, outer_batch_size,
                                                            random_initial_iteration_offset=max_length)
    self.grad_est = MODES[mode](tstep, unroll_length, steps_per_jit=unroll_length)
    self.datasets = None

  def sample(self, key: PRNGKey) -> cfgobject.CFGNamed:
    return cfgobject.CFGNamed("ParametricLOpt", {})

  def task_fn(self, task_params: cfgobject.CFGNamed) -> base.Task:
    return lopt_mod.TruncGradEstTask(self.lopt, self.grad_est)


def sample_lopt_trunc(key: PRNGKey) -> cfgobject.CFGObject:
  """A `ParametricLOptTrunc` configuration: a `ParametricImageMLP` configuration, a learned optimizer
  (`parametric.lopt.sample_lopt_cfg`), ``outer_batch_size`` log-uniform in [8, 64), a constant truncation schedule
  of length log-uniform in [10, 10000) or a log-uniform one between two lengths in [10, 1000), ``unroll_length`` in
  [1, 100) and one of the reference's five estimator modes (two of which `ParametricLOptTrunc` refuses)."""
  keys = jax.random.split(key, 9)
  lf = cfgobject.LogFeature
  schedule = pu.choice(keys[3], ["ConstantTruncationSchedule", "LogUniformLengthSchedule"])
  if schedule == "ConstantTruncationSchedule":
    max_length = lf(pu.log_int(keys[4], 10, 10000))
    trunc_sched = cfgobject.CFGObject(schedule, {"total_length": max_length})
  else:
    min_length, max_length = pu.log_int(keys[4], 10, 1000), pu.log_int(keys[5], 10, 1000)
    trunc_sched = cfgobject.CFGObject(schedule, {"min_length": lf(min_length), "max_length": lf(max_length)})
  mode = pu.choice(keys[7], ["TruncatedPES", "TruncatedES", "TruncatedSNES", "TruncatedGrad",
                             "TruncatedESSharedNoiseV2"])
  return cfgobject.CFGObject("ParametricLOptTrunc", {
      "lopt": sample_lopt_cfg(keys[1]),
      "task_family": para_image_mlp.sample_image_mlp(keys[0]),
      "unroll_length": lf(pu.log_int(keys[6], 1, 100)),
      "trunc_sched": trunc_sched,
      "outer_batch_size": lf(pu.log_int(keys[2], 8, 64)),
      "max_length": max_length,
      "mode": mode,
  })


def timed_sample_lopt_trunc(key: PRNGKey, max_time: float = 1e-4):
  """Not available offline (the reference's learned runtime model); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_lopt_trunc", "sample_lopt_trunc")
