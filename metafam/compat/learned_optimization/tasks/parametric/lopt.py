"""`learned_optimization.tasks.parametric.lopt`: a family of learned-optimizer meta-objectives (full unrolls).

`ParametricLOpt(task_family, lopt, num_steps, outer_batch_size)` has one member: its configuration is the empty
``CFGNamed("ParametricLOpt", {})`` (so ``sample`` and ``task_fn`` vmap) and its task is
`tasks.fixed.lopt.LOptTaskFamilyTask`; a batch is ``[outer_batch_size, num_steps]`` stacked batches of the family.
`sample_lopt` draws a family configuration (a `CFGObject` for `cfgobject.object_from_config`): a
`ParametricImageMLP` configuration (`sample_image_mlp`), one of five learned optimizers (the MLP ones with a sampled
width, depth, ``exp_mult`` and ``step_mult``), ``num_steps`` log-uniform in [1, 100) and ``outer_batch_size`` in
[1, 8). `timed_sample_lopt` needs the reference's learned runtime models and raises NotImplementedError.
"""

from __future__ import annotations

from typing import Any

import jax

from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.fixed import lopt as lopt_mod
from metafam.compat.learned_optimization.tasks.parametric import cfgobject
from metafam.compat.learned_optimization.tasks.parametric import image_mlp as para_image_mlp
from metafam.compat.learned_optimization.tasks.parametric import parametric_utils as pu

Batch = Any
Params = Any
ModelState = Any
PRNGKey = jax.Array

__all__ = ["Batch", "Params", "ModelState", "ParametricLOpt", "sample_lopt", "timed_sample_lopt",
           "sample_lopt_cfg"]

_LOPT_NAMES = ["LearnableAdam", "LearnableSGDM", "LearnableSGD", "MLPLOpt", "AdafacMLPLOpt"]


class ParametricLOpt(base.TaskFamily):
  """`LOptTaskFamilyTask` of ``lopt`` on ``task_family`` (``num_steps`` steps, ``outer_batch_size`` tasks)."""

  def __init__(self, task_family: base.TaskFamily, lopt: lopt_base.LearnedOptimizer, num_steps: int,
               outer_batch_size: int):
    super().__init__()
    task = lopt_mod.LOptTaskFamilyTask(task_family, lopt, num_steps=num_steps, outer_batch_size=outer_batch_size)
    self.task_family, self.lopt = task_family, lopt  # the arguments, checked by the task
    self.num_steps, self.outer_batch_size = task.num_steps, task.outer_batch_size
    self.datasets = task.datasets

  def sample(self, key: PRNGKey) -> cfgobject.CFGNamed:
    return cfgobject.CFGNamed("ParametricLOpt", {})

  def task_fn(self, task_params: cfgobject.CFGNamed) -> base.Task:
    return lopt_mod.LOptTaskFamilyTask(self.task_family, self.lopt, num_steps=self.num_steps,
                                       outer_batch_size=self.outer_batch_size)


def sample_lopt_cfg(key: PRNGKey) -> cfgobject.CFGObject:
  """The learned-optimizer part of `sample_lopt` / `sample_lopt_trunc`: one of five learned optimizers; the MLP
  ones with ``hidden_size`` log-uniform in [2, 512), ``hidden_layers`` in [1, 4), ``exp_mult`` and ``step_mult``
  log-uniform in [1e-5, 1)."""
  name_key, size_key, layers_key, exp_key, step_key = jax.random.split(key, 5)
  name = pu.choice(name_key, _LOPT_NAMES)
  kwargs = {}
  if name in ("MLPLOpt", "AdafacMLPLOpt"):
    lf = cfgobject.LogFeature
    kwargs = {"hidden_size": lf(pu.log_int(size_key, 2, 512)), "hidden_layers": pu.log_int(layers_key, 1, 4),
              "exp_mult": lf(pu.log_float(exp_key, 1e-5, 1)), "step_mult": lf(pu.log_float(step_key, 1e-5, 1))}
  return cfgobject.CFGObject(name, kwargs)


def sample_lopt(key: PRNGKey) -> cfgobject.CFGObject:
  """A `ParametricLOpt` configuration (see the module docstring)."""
  family_key, lopt_key, steps_key, batch_key = jax.random.split(key, 4)
  lf = cfgobject.LogFeature
  return cfgobject.CFGObject("ParametricLOpt", {
      "lopt": sample_lopt_cfg(lopt_key),
      "task_family": para_image_mlp.sample_image_mlp(family_key),
      "num_steps": lf(pu.log_int(steps_key, 1, 100)),
      "outer_batch_size": lf(pu.log_int(batch_key, 1, 8)),
  })


def timed_sample_lopt(key: PRNGKey, max_time: float = 1e-4):
  """Not available offline (the reference's learned runtime model); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_lopt", "sample_lopt")
