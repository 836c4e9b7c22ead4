"""`learned_optimization.tasks.task_augmentation`: the reference's task and family augmentations over metafam's.

* `ReparamWeights(task, param_scale)` is `metafam.tasks.augmentations.ReparamWeights` (``init`` returns
  ``p / scale``, the loss sees ``q * scale``; ``param_scale`` a scalar or a prefix tree of the params).
* `ReparamWeightsFamily(family, level, param_scale_range)`: a scale drawn log-uniformly in ``param_scale_range`` per
  sampled task, one for all params (``level="global"``), one per params leaf (``"tensor"``) or one per parameter
  entry (``"parameter"``); metafam's `ReparamFamily` for the first two. Another level: ValueError.
* `ReducedBatchsizeFamily(family, fraction_of_batchsize)`: the family's datasets (and its tasks' losses) use the first
  ``int(batch_size * fraction)`` examples of each batch (metafam's `ReducedBatchSize`); an `ArraySplit` split becomes
  an `ArraySplit` of the smaller batch size over the same arrays (same seed), so the device path stays.
* `ConvertFloatDType(task, dtype)` / `ConvertFloatDTypeTaskFamily`: metafam's `LowPrecision` (params and float data
  in ``dtype``, the loss returned in float32).
* `ModifyTaskGradient(task, fn)`: ``jax.grad`` of the loss sees ``fn(grad, key)`` (metafam's `GradientModifier`;
  the key is derived from the loss key). `NormalizeTaskGradient` divides the gradient by its global L2 norm;
  `SubsampleDirectionsTaskGradient(task, directions, sign_direction)` replaces it by its projection on
  ``directions`` random unit directions, scaled by ``num_params / directions`` so it is unbiased (with
  ``sign_direction`` the projection coefficients are replaced by their signs). `*TaskFamily` variants wrap every
  task of a family.
* `AsyncDelayedGradients(task, delay_steps)` / `...TaskFamily`: the gradient of each loss call is the gradient at the
  params of ``delay_steps`` calls before (kept in the model state: init fills the buffer with the initial params);
  the loss value is the one at those stale params.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metafam.compat.learned_optimization import tree_utils
from metafam.compat.learned_optimization.outer_trainers import common
from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.parametric import cfgobject
from metafam.datasets.base import ArraySplit, Datasets
from metafam.taskfamilies import augmentations as _faug
from metafam.tasks import augmentations as _aug
from metafam.tasks.base import Task

__all__ = ["ReparamWeights", "ReparamWeightsFamily", "ReducedBatchsizeFamily", "ConvertFloatDType",
           "ConvertFloatDTypeTaskFamily", "ModifyTaskGradient", "NormalizeTaskGradient",
           "NormalizeTaskGradientTaskFamily", "SubsampleDirectionsTaskGradient",
           "SubsampleDirectionsTaskGradientTaskFamily", "AsyncDelayedGradients", "AsyncDelayedGradientsTaskFamily", "ReducedBatchsizeTask", "WrappedTaskFamilyWithTaskWrapper", "LogFeat", "PyTree", "PRNGKey", "Batch", "Params", "ModelState"]

REPARAM_LEVELS = ("global", "tensor", "parameter")
PRNGKey = jax.Array
PyTree = Any
Batch = Any
Params = Any
ModelState = Any
LogFeat = cfgobject.LogFeature


class ReparamWeights(_aug.ReparamWeights):
  """metafam's `ReparamWeights` under the reference's argument name ``param_scale``."""

  def __init__(self, task: Task, param_scale: Any):
    super().__init__(task, param_scale)
    self.param_scale = param_scale


def _log_range(param_scale_range: Tuple[float, float]) -> Tuple[float, float]:
  low, high = _faug._range("param_scale_range", param_scale_range, positive=True)
  return float(np.log(low)), float(np.log(high))


class ReparamWeightsFamily(_faug.ReparamFamily):
  """Tasks of ``task_family`` reparameterized by a log-uniform scale per task at ``level`` granularity."""

  def __init__(self, task_family: Any, level: str, param_scale_range: Tuple[float, float] = (0.001, 1000.0)):
    if level not in REPARAM_LEVELS:
      raise ValueError(f"Unknown reparam level {level!r}; expected one of {REPARAM_LEVELS}.")
    super().__init__(task_family, log_scale_range=_log_range(param_scale_range), per_leaf=level != "global")
    self.level, self.param_scale_range = level, tuple(param_scale_range)
    if level == "parameter":
      family = task_family

      def init_params(key):
        return family.task_fn(family.sample(key)).init_with_state(key)[0]
      self._shapes = jax.eval_shape(init_params, jax.random.PRNGKey(0))

  def sample_own(self, key):
    if self.level != "parameter":
      return super().sample_own(key)
    leaves, treedef = jax.tree.flatten(self._shapes)
    keys = jax.random.split(key, max(len(leaves), 1))
    draws = [_faug._uniform(k, *self.log_scale_range, shape=leaf.shape) for k, leaf in zip(keys, leaves)]
    return {"log_scale": jax.tree.unflatten(treedef, draws)}


def _sliced_split(source: Any, batch_size: int) -> Any:
  if isinstance(source, ArraySplit):
    return ArraySplit(source.arrays, batch_size, seed=source.seed, shuffle=source.shuffle)

  def sliced():
    for batch in source:
      yield jax.tree.map(lambda x: x[:batch_size], batch)
  return sliced()


def reduced_datasets(datasets: Datasets, batch_size: int) -> Datasets:
  """``datasets`` whose every batch has the first ``batch_size`` examples."""
  splits = {name: _sliced_split(datasets.source(name), batch_size)
            for name in ("train", "inner_valid", "outer_valid", "test")}
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct((batch_size,) + tuple(s.shape[1:]), s.dtype),
                          datasets.abstract_batch)
  return Datasets(**splits, extra_info=datasets.extra_info, abstract_batch=abstract)


class ReducedBatchsizeFamily(_faug.ReducedBatchSizeFamily):
  """``task_family`` with batches of ``int(batch_size * fraction_of_batchsize)`` examples."""

  def __init__(self, task_family: Any, fraction_of_batchsize: float):
    if task_family.datasets is None:
      raise ValueError("ReducedBatchsizeFamily needs a family with datasets.")
    if not 0.0 < fraction_of_batchsize <= 1.0:
      raise ValueError(f"fraction_of_batchsize must be in (0, 1], got {fraction_of_batchsize!r}.")
    full = max(s.shape[0] for s in jax.tree.leaves(task_family.datasets.abstract_batch))
    batch_size = max(int(full * fraction_of_batchsize), 1)
    super().__init__(task_family, batch_size)
    self.fraction_of_batchsize = fraction_of_batchsize
    self.datasets = reduced_datasets(task_family.datasets, batch_size)

  def wrap(self, task, cfg):
    task = super().wrap(task, cfg)
    task.datasets = self.datasets
    return task


class ReducedBatchsizeTask(_aug.ReducedBatchSize):
  """``task`` on batches of ``max(1, int(B * fraction_of_batchsize))`` examples: its datasets yield the first
  examples of each batch (`reduced_datasets`) and its abstract batch says so (metafam's `ReducedBatchSize`)."""

  def __init__(self, task: Task, fraction_of_batchsize: float):
    if not (isinstance(fraction_of_batchsize, (int, float)) and 0 < fraction_of_batchsize <= 1):
      raise ValueError(f"fraction_of_batchsize must be in (0, 1], got {fraction_of_batchsize!r}.")
    full = max(x.shape[0] for x in jax.tree.leaves(task.datasets.abstract_batch))
    batch_size = max(1, int(full * fraction_of_batchsize))
    super().__init__(task, batch_size)
    self.datasets = reduced_datasets(task.datasets, batch_size)


class WrappedTaskFamilyWithTaskWrapper(base.TaskFamily):
  """Each task of ``task_family`` passed through ``task_wrapper``; configs are ``CFGNamed(
  "WrappedTaskFamilyWithTaskWrapper", {"inner_cfg": cfg})``."""

  def __init__(self, task_family: Any, task_wrapper: Callable[[Task], Task], name: Optional[str] = None):
    super().__init__()
    self.task_family, self.task_wrapper = task_family, task_wrapper
    self.datasets = task_family.datasets
    if name:
      self.name = name

  def sample(self, key: jax.Array) -> cfgobject.CFGNamed:
    return cfgobject.CFGNamed("WrappedTaskFamilyWithTaskWrapper", {"inner_cfg": self.task_family.sample(key)})

  def task_fn(self, cfg: cfgobject.CFGNamed) -> Task:
    return self.task_wrapper(self.task_family.task_fn(cfg.values["inner_cfg"]))


class ConvertFloatDType(_aug.LowPrecision):
  """metafam's `LowPrecision`: float params and data in ``dtype``, the loss in float32."""

  def __init__(self, task: Task, dtype: Any = jnp.bfloat16):
    super().__init__(task, dtype)


class _FixedWrapFamily(_faug.FamilyWrapper):
  """Every task of ``task_family`` wrapped by ``make(task)`` (no sampled config of its own)."""

  def __init__(self, task_family: Any, make: Callable[[Task], Task], suffix: str):
    super().__init__(task_family, suffix)
    self._make = make

  def wrap(self, task, cfg):
    return self._make(task)


class ConvertFloatDTypeTaskFamily(_FixedWrapFamily):

  def __init__(self, task_family: Any, dtype: Any = jnp.bfloat16):
    self.dtype = jnp.dtype(dtype)
    super().__init__(task_family, lambda task: ConvertFloatDType(task, self.dtype), self.dtype.name)


class ModifyTaskGradient(_aug.GradientModifier):
  """``jax.grad`` of the loss sees ``fn(grad, key)``; the loss value is unchanged."""

  def __init__(self, task: Task, fn: Callable[[Any, jax.Array], Any], suffix: str = "modgrad"):
    super().__init__(task, _call_two_argument_fn, _StaticFn(fn), suffix=suffix)
    self.fn = fn


def _call_two_argument_fn(grads, key, holder):
  return holder.fn(grads, key)


class _StaticFn:
  """A hashable, non-traced holder so a Python function can ride in `gradient_hook`'s hparams."""

  def __init__(self, fn):
    self.fn = fn


jax.tree_util.register_static(_StaticFn)


def _sample_perturbations(variables: Any, key: jax.Array) -> Any:
  """A random direction shaped like ``variables``: Gaussian noise (`outer_trainers.common`'s draw) scaled to unit
  norm over the whole tree."""
  noise = common.sample_perturbations(variables, key, 1.0)
  return tree_utils.tree_div(noise, tree_utils.tree_norm(noise))


def _normalize(grads: Any, key: jax.Array) -> Any:
  leaves = jax.tree.leaves(grads)
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in leaves))
  return jax.tree.map(lambda g: (g / jnp.maximum(norm, 1e-30)).astype(g.dtype), grads)


def _subsample_directions(directions: int, sign_direction: bool) -> Callable:
  def fn(grads, key):
    flat, unravel = jax.flatten_util.ravel_pytree(grads)
    basis = jax.random.normal(key, (directions, flat.shape[0]), jnp.float32)
    basis = basis / jnp.linalg.norm(basis, axis=1, keepdims=True)
    coefs = basis @ flat.astype(jnp.float32)
    if sign_direction:
      coefs = jnp.sign(coefs)
    projected = coefs @ basis * (flat.shape[0] / directions)
    return unravel(projected.astype(flat.dtype))
  return fn


class NormalizeTaskGradient(ModifyTaskGradient):
  """The gradient divided by its global L2 norm."""

  def __init__(self, task: Task):
    super().__init__(task, _normalize, suffix="normgrad")


class SubsampleDirectionsTaskGradient(ModifyTaskGradient):
  """The gradient's projection on ``directions`` random unit directions (times ``num_params / directions``)."""

  def __init__(self, task: Task, directions: int = 1, sign_direction: bool = False):
    if isinstance(directions, bool) or not isinstance(directions, int) or directions < 1:
      raise ValueError(f"directions must be a positive int, got {directions!r}.")
    super().__init__(task, _subsample_directions(directions, bool(sign_direction)), suffix=f"subdir{directions}")
    self.directions, self.sign_direction = directions, bool(sign_direction)


class NormalizeTaskGradientTaskFamily(_FixedWrapFamily):

  def __init__(self, task_family: Any):
    super().__init__(task_family, NormalizeTaskGradient, "normgrad")


class SubsampleDirectionsTaskGradientTaskFamily(_FixedWrapFamily):

  def __init__(self, task_family: Any, directions: int = 1, sign_direction: bool = False):
    super().__init__(task_family, lambda t: SubsampleDirectionsTaskGradient(t, directions, sign_direction),
                     f"subdir{directions}")


class AsyncDelayedGradients(_aug.TaskWrapper):
  """Gradients (and loss values) computed at the params of ``delay_steps`` loss calls ago.

  The model state is ``(inner_state, buffer)``; ``buffer`` holds the last ``delay_steps`` params (oldest first),
  all equal to the initial params after ``init_with_state``. Each loss call evaluates the inner task at the oldest
  params, passes that gradient to the current params, and pushes the current params.
  """

  def __init__(self, task: Task, delay_steps: int = 2):
    if isinstance(delay_steps, bool) or not isinstance(delay_steps, int) or delay_steps < 1:
      raise ValueError(f"delay_steps must be a positive int, got {delay_steps!r}.")
    super().__init__(task, f"delay{delay_steps}")
    self.delay_steps = delay_steps

  def init_with_state(self, key):
    params, state = self.task.init_with_state(key)
    buffer = jax.tree.map(lambda p: jnp.stack([p] * self.delay_steps), params)
    return params, (state, buffer)

  def loss_with_state_and_aux(self, params, state, key, batch):
    inner_state, buffer = state
    stale = jax.tree.map(lambda b: b[0], buffer)
    # Value at the stale params, gradient d/dparams equal to the gradient at the stale params.
    shifted = jax.tree.map(lambda s, p: jax.lax.stop_gradient(s) + (p - jax.lax.stop_gradient(p)), stale, params)
    loss, inner_state, aux = self.task.loss_with_state_and_aux(shifted, inner_state, key, batch)
    buffer = jax.tree.map(lambda b, p: jnp.concatenate([b[1:], jax.lax.stop_gradient(p)[None]]), buffer, params)
    return loss, (inner_state, buffer), aux


class AsyncDelayedGradientsTaskFamily(_FixedWrapFamily):

  def __init__(self, task_family: Any, delay_steps: int = 2):
    super().__init__(task_family, lambda t: AsyncDelayedGradients(t, delay_steps), f"delay{delay_steps}")
