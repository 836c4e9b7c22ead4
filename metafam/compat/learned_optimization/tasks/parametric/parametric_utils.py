"""`learned_optimization.tasks.parametric.parametric_utils`: what the reference's parametric families sample.

* `choice`, `log_int`, `log_float`: a uniform choice, and log-uniform ints / floats in ``[lower, upper]`` (host
  values: they shape the static part of a configuration).
* `SampleImageDataset`: a dataset name of the reference's image datasets and its `LazyDataset` (nothing is read
  until a batch is requested; unavailable ones then raise `DatasetUnavailableError`).
* `SampleActivation`, `SampleInitializer`: per-instance (traced, vmappable) choices, ``{"index": int32}`` (and
  ``"init_scale"``), dispatched with `jax.lax.switch` inside the model.
* The initializers ``(shape, dtype, key, ...)``: `orth_init`, `uniform_scale_init`, `variance_scale_init`,
  `truncated_normal_init`, over `jax.nn.initializers` where it has them (same distributions as the reference; for
  shapes of rank < 2 both fans are the size, as in the reference).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from metafam.compat.learned_optimization.tasks import base as tasks_base
from metafam.compat.learned_optimization.tasks.datasets import base as datasets_base
from metafam.compat.learned_optimization.tasks.datasets import image
from metafam.compat.learned_optimization.tasks.parametric import cfgobject

PRNGKey = jax.Array

__all__ = ["PRNGKey", "choice", "log_int", "log_float", "SampleImageDataset", "SampleActivation", "orth_init",
           "uniform_scale_init", "truncated_normal_init", "variance_scale_init", "SampleInitializer",
           "task_from_sample_task_family_fn"]


def _check_range(lower, upper):
  if not (np.isfinite(lower) and np.isfinite(upper) and 0 < lower <= upper):
    raise ValueError(f"need finite 0 < lower <= upper, got lower={lower!r}, upper={upper!r}.")


def choice(key: PRNGKey, vals):
  """``vals[i]`` for ``i`` uniform in ``[0, len(vals))``: a host value when ``vals`` is a list or tuple, an array
  element (traceable, so it may be sampled under `jax.vmap`) when ``vals`` is an array."""
  index = jax.random.randint(key, [], 0, len(vals))
  return vals[index] if isinstance(vals, (jax.Array, np.ndarray)) else vals[int(index)]


def log_int(key: PRNGKey, lower, upper) -> int:
  """``int(exp(u))`` with ``u`` uniform in ``[log lower, log upper)``."""
  _check_range(lower, upper)
  return int(np.exp(float(jax.random.uniform(key, [], minval=np.log(lower), maxval=np.log(upper)))))


def log_float(key: PRNGKey, lower, upper) -> float:
  """``exp(u)`` with ``u`` uniform in ``[log lower, log upper)``."""
  _check_range(lower, upper)
  return float(np.exp(float(jax.random.uniform(key, [], minval=np.log(lower), maxval=np.log(upper)))))


class SampleImageDataset:
  """The image datasets a parametric family may sample: name -> (function, number of classes)."""
  dataset_fns = {
      "mnist_datasets": (image.mnist_datasets, 10),
      "fashion_mnist_datasets": (image.fashion_mnist_datasets, 10),
      "cifar10_datasets": (image.cifar10_datasets, 10),
      "cifar100_datasets": (image.cifar100_datasets, 100),
      "imagenet16_datasets": (image.imagenet16_datasets, 1000),
  }

  @classmethod
  def sample(cls, key: PRNGKey) -> str:
    return choice(key, sorted(cls.dataset_fns))

  @classmethod
  def num_classes(cls, cfg: str) -> int:
    return cls.dataset_fns[cfg][1]

  @classmethod
  def get_dataset(cls, cfg: str, batch_size: int, image_size) -> datasets_base.LazyDataset:
    fn = cls.dataset_fns[cfg][0]
    return datasets_base.LazyDataset(lambda: fn(batch_size=batch_size, image_size=image_size))


class SampleActivation:
  """Twelve activations (ReLU listed twice, as in the reference, so it is drawn twice as often)."""
  acts = [jax.nn.relu, jax.nn.relu, jax.nn.relu6, jax.nn.selu, jnp.tanh, jnp.cos, jnp.sin, jax.nn.sigmoid,
          jax.nn.silu, jax.nn.swish, jax.nn.gelu, functools.partial(jax.nn.leaky_relu, negative_slope=-0.5)]

  @classmethod
  def sample(cls, key: PRNGKey) -> Mapping[str, jax.Array]:
    return {"index": jax.random.randint(key, [], 0, len(cls.acts))}

  @classmethod
  def get_dynamic(cls, act: Mapping[str, Any]) -> Callable[[jax.Array], jax.Array]:
    return lambda x: jax.lax.switch(act["index"], cls.acts, x)

  @classmethod
  def get_static(cls, act: Mapping[str, Any]) -> Callable[[jax.Array], jax.Array]:
    return cls.acts[int(act["index"])]


def _compute_fans(shape):
  """``(fan_in, fan_out)`` of a weight shape: 1 and 1 for a scalar, the size twice for a vector, the two dims of
  a matrix, and for a conv kernel ``(..., in, out)`` each channel count times the receptive field."""
  shape = tuple(shape)
  if len(shape) < 1:
    return 1, 1
  if len(shape) == 1:
    return shape[0], shape[0]
  if len(shape) == 2:
    return shape[0], shape[1]
  receptive_field = int(np.prod(shape[:-2]))
  return shape[-2] * receptive_field, shape[-1] * receptive_field


def _partial_fn(fn, *args, **kwargs):
  """``f(shape, dtype, key, unused) = fn(shape, dtype, key, *args, **kwargs)`` (the unused fourth argument lets
  initializers be chosen with ``jax.lax.switch``)."""
  def f(shape, dtype, key, _):
    return fn(shape, dtype, key, *args, **kwargs)
  return f


def _low_rank(fn, shape, dtype, key):
  """Entries of ``fn`` for a rank < 2 shape, drawn as a row of a square matrix (both fans = the size)."""
  n = int(np.prod(shape)) if len(shape) else 1
  return jnp.reshape(fn(key, (n, n), dtype)[0], shape)


def orth_init(shape, dtype, key, scale=1.0, axis=-1):
  """``scale`` times a uniformly random orthogonal matrix (`jax.nn.initializers.orthogonal`, columns on ``axis``)."""
  if len(shape) < 2:
    raise ValueError(f"orth_init needs a shape of rank >= 2, got {tuple(shape)}.")
  return jax.nn.initializers.orthogonal(scale, column_axis=axis)(key, tuple(shape), dtype)


def uniform_scale_init(shape, dtype, key, scale=1.0):
  """Uniform in ``±scale * sqrt(3 / prod(shape[:-1]))``."""
  limit = np.sqrt(3.0 / max(int(np.prod(shape[:-1])), 1)) * scale
  return jax.random.uniform(key, shape, dtype, -limit, limit)


def truncated_normal_init(shape, dtype, key, stddev, mean=0.):
  """``mean + stddev * N(0, 1)`` truncated to ``±2`` before scaling."""
  return (jax.lax.convert_element_type(stddev, dtype) * jax.random.truncated_normal(key, -2., 2., shape, dtype)
          + jax.lax.convert_element_type(mean, dtype))


def variance_scale_init(shape, dtype, key, scale, mode="fan_in", distribution="normal"):
  """Variance ``scale / max(1, fan)`` (``mode`` "fan_in", "fan_out" or otherwise their average) with a
  "normal", "truncated_normal" (std corrected for the truncation) or otherwise uniform distribution."""
  mode = mode if mode in ("fan_in", "fan_out") else "fan_avg"
  distribution = distribution if distribution in ("normal", "truncated_normal") else "uniform"
  fn = jax.nn.initializers.variance_scaling(scale, mode, distribution)
  return fn(key, tuple(shape), dtype) if len(shape) >= 2 else _low_rank(fn, tuple(shape), dtype, key)


class SampleInitializer:
  """Five weight initializers (orthogonal, scaled uniform, variance scaling: normal, normal, uniform), each taking
  ``init_scale`` uniform in [0.5, 2)."""
  inits = [
      lambda cfg: functools.partial(orth_init, scale=cfg["init_scale"]),
      lambda cfg: functools.partial(uniform_scale_init, scale=cfg["init_scale"]),
      lambda cfg: functools.partial(variance_scale_init, scale=cfg["init_scale"]),
      lambda cfg: functools.partial(variance_scale_init, scale=cfg["init_scale"], distribution="normal"),
      lambda cfg: functools.partial(variance_scale_init, scale=cfg["init_scale"], distribution="uniform"),
  ]

  @classmethod
  def sample(cls, key: PRNGKey) -> Mapping[str, jax.Array]:
    k1, k2 = jax.random.split(key)
    return {"index": jax.random.randint(k1, [], 0, len(cls.inits)),
            "init_scale": jax.random.uniform(k2, [], jnp.float32, 0.5, 2.)}

  @classmethod
  def get_dynamic(cls, cfg: Mapping[str, Any]) -> Callable:
    """A haiku initializer ``(shape, dtype)`` switching on ``cfg["index"]`` with haiku's rng (may be traced)."""

    def initializer(shape, dtype):
      key = hk.next_rng_key()
      branches = [lambda _, f=init(cfg): f(shape, dtype, key) for init in cls.inits]
      return jax.lax.switch(cfg["index"], branches, None)

    return initializer


def task_from_sample_task_family_fn(sample_task_family_fn: Callable[[PRNGKey], cfgobject.CFGObject],
                                    seed: int) -> tasks_base.Task:
  """A task: ``sample_task_family_fn`` draws a family configuration, `cfgobject.object_from_config` builds it,
  and the family samples a task (keys from ``PRNGKey(seed)``)."""
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  family = cfgobject.object_from_config(sample_task_family_fn(k1))
  return family.task_fn(family.sample(k2))


def timed_sampler_unavailable(name: str, untimed: str) -> None:
  """Raises for the reference's ``timed_*`` samplers, which rejection-sample with learned runtime models that
  are downloaded files metafam does not have."""
  raise NotImplementedError(f"{name} rejection-samples with the reference's learned runtime models, which are not "
                            f"available offline in metafam; use {untimed} (no time limit) instead.")
