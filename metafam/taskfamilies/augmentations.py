"""Family augmentations: apply a `metafam.tasks.augmentations` wrapper to every task of a family.

A wrapped family's config is ``{"inner": inner_cfg, **own_leaves}``, where the own leaves are the augmentation's
sampled per-instance values (f32 scalars, or a params-shaped tree for per-leaf reparameterization). The inner config
is sampled with the *same* key as the unwrapped family would use (own leaves come from ``fold_in(key, tag)``), so an
augmented family pairs instance by instance with its base family. Shape-changing choices (batch size, dtype) are
fixed per family object and add no config leaves.
"""

from __future__ import annotations

from typing import Any, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metafam._checks import check_positive_int
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks import augmentations as aug
from metafam.tasks.base import Task

Range = Tuple[float, float]

# fold_in tag for the augmentation's own config leaves.
_OWN_TAG = 0x61756720


def _range(name: str, value: Range, positive: bool = False, nonnegative: bool = False) -> Range:
  try:
    low, high = (float(v) for v in value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a pair (low, high) of numbers, got {value!r}.") from None
  if not low <= high or (positive and not low > 0) or (nonnegative and not low >= 0):
    bound = " and 0 < low" if positive else " and 0 <= low" if nonnegative else ""
    raise ValueError(f"{name} must satisfy low <= high{bound}, got {value!r}.")
  return low, high


def _uniform(key: jax.Array, low: float, high: float, shape: Tuple[int, ...] = ()) -> jax.Array:
  return jax.random.uniform(key, shape, jnp.float32, low, high)


class FamilyWrapper(TaskFamily):
  """Base of the family augmentations: ``sample`` nests the inner config under ``"inner"``.

  Subclasses implement `sample_own(key) -> dict` (their own config leaves; default none) and
  `wrap(task, cfg) -> Task`.
  """

  def __init__(self, family: TaskFamily, suffix: str):
    super().__init__()
    if not isinstance(family, TaskFamily):
      raise TypeError(f"{type(self).__name__} wraps a TaskFamily, got {type(family).__name__}.")
    self.family = family
    self.datasets = family.datasets
    self.name = f"{family.name}_{suffix}"

  def sample_own(self, key: jax.Array) -> dict:
    return {}

  def wrap(self, task: Task, cfg: dict) -> Task:
    raise NotImplementedError

  def sample(self, key):
    return {"inner": self.family.sample(key), **self.sample_own(jax.random.fold_in(key, _OWN_TAG))}

  def task_fn(self, cfg):
    return self.wrap(self.family.task_fn(cfg["inner"]), cfg)


class ReparamFamily(FamilyWrapper):
  """`ReparamWeights` with a sampled scale ``exp(log_scale)``, ``log_scale ~ U(log_scale_range)`` (natural log).

  Config: ``{"inner": cfg, "log_scale": f32[]}``, or with ``per_leaf=True`` ``"log_scale"`` is a tree shaped like the
  params with one independent f32 scalar per leaf (the params' structure is read once with `jax.eval_shape`).
  """

  def __init__(self, family: TaskFamily, log_scale_range: Range = (-2.0, 2.0), per_leaf: bool = False):
    super().__init__(family, "reparam")
    self.log_scale_range = _range("log_scale_range", log_scale_range)
    self.per_leaf = bool(per_leaf)
    self._treedef = None
    if self.per_leaf:
      def init_params(key):
        return family.task_fn(family.sample(key)).init_with_state(key)[0]
      self._treedef = jax.tree.structure(jax.eval_shape(init_params, jax.random.key(0)))

  def sample_own(self, key):
    if not self.per_leaf:
      return {"log_scale": _uniform(key, *self.log_scale_range)}
    values = _uniform(key, *self.log_scale_range, shape=(self._treedef.num_leaves,))
    return {"log_scale": jax.tree.unflatten(self._treedef, list(values))}

  def wrap(self, task, cfg):
    return aug.ReparamWeights(task, jax.tree.map(jnp.exp, cfg["log_scale"]))


class LossScaleFamily(FamilyWrapper):
  """`LossScale` by ``exp(log_loss_scale)``, ``log_loss_scale ~ U(log_scale_range)`` (natural log).

  Config: ``{"inner": cfg, "log_loss_scale": f32[]}``; the task's ``normalizer`` undoes the scale.
  """

  def __init__(self, family: TaskFamily, log_scale_range: Range = (-3.0, 3.0)):
    super().__init__(family, "lossscale")
    self.log_scale_range = _range("log_scale_range", log_scale_range)

  def sample_own(self, key):
    return {"log_loss_scale": _uniform(key, *self.log_scale_range)}

  def wrap(self, task, cfg):
    return aug.LossScale(task, jnp.exp(cfg["log_loss_scale"]))


class NoisyGradientsFamily(FamilyWrapper):
  """`NoisyGradients` with ``noise_std ~ U(noise_std_range)``. Config: ``{"inner": cfg, "noise_std": f32[]}``."""

  def __init__(self, family: TaskFamily, noise_std_range: Range = (0.0, 0.1)):
    super().__init__(family, "gradnoise")
    self.noise_std_range = _range("noise_std_range", noise_std_range, nonnegative=True)

  def sample_own(self, key):
    return {"noise_std": _uniform(key, *self.noise_std_range)}

  def wrap(self, task, cfg):
    return aug.NoisyGradients(task, cfg["noise_std"])


class ClipGradientsFamily(FamilyWrapper):
  """`ClipGradients` with ``max_norm`` log-uniform in ``max_norm_range``. Config: ``{"inner": cfg, "max_norm": f32[]}``.
  """

  def __init__(self, family: TaskFamily, max_norm_range: Range = (0.1, 10.0)):
    super().__init__(family, "gradclip")
    self.max_norm_range = _range("max_norm_range", max_norm_range, positive=True)

  def sample_own(self, key):
    low, high = np.log(self.max_norm_range[0]), np.log(self.max_norm_range[1])
    return {"max_norm": jnp.exp(_uniform(key, float(low), float(high)))}

  def wrap(self, task, cfg):
    return aug.ClipGradients(task, cfg["max_norm"])


class ReducedBatchSizeFamily(FamilyWrapper):
  """`ReducedBatchSize` with a fixed ``batch_size`` (it changes shapes, so it is not sampled). Config:
  ``{"inner": cfg}``."""

  def __init__(self, family: TaskFamily, batch_size: int):
    super().__init__(family, f"bs{batch_size}")
    batch_size = check_positive_int("batch_size", batch_size)
    if family.datasets is not None:
      full = max(x.shape[0] for x in jax.tree.leaves(family.datasets.abstract_batch))
      if batch_size > full:
        raise ValueError(f"batch_size {batch_size} exceeds the datasets' batch size {full}.")
    self.batch_size = batch_size

  def wrap(self, task, cfg):
    return aug.ReducedBatchSize(task, self.batch_size)


class LowPrecisionFamily(FamilyWrapper):
  """`LowPrecision` with a fixed ``dtype`` (default bfloat16; a name such as ``"float16"`` works). Config:
  ``{"inner": cfg}``."""

  def __init__(self, family: TaskFamily, dtype: Any = "bfloat16"):
    self.dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(self.dtype, jnp.floating):
      raise ValueError(f"LowPrecisionFamily needs a floating dtype, got {self.dtype}.")
    super().__init__(family, self.dtype.name)

  def wrap(self, task, cfg):
    return aug.LowPrecision(task, self.dtype)
