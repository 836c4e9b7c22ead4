"""`learned_optimization.tasks.quadratics`: the quadratic tasks and families, with the reference's arguments.

Losses, initializations and config layouts follow the reference library. The data of `BatchQuadraticTask` and
`FixedDimQuadraticFamilyData` come from seeded `ArraySplit`s (the reference draws them from unseeded numpy
generators), so they can be sampled on the device by `metafam.inner.TruncatedStep`; a data batch of
`FixedDimQuadraticFamilyData` is ``f32[1]`` (the reference's is a scalar), and its loss adds the batch's sum.
Data-free tasks ignore their batch, so ``batch=()`` (as the reference's tests pass) and ``None`` both work.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from metafam.compat.learned_optimization.tasks import base
from metafam.datasets.base import SPLITS, ArraySplit, Datasets, dataset_lru_cache

Params = Any
ModelState = Any
TaskParams = Any
PRNGKey = jax.Array

__all__ = ["Params", "ModelState", "TaskParams", "PRNGKey", "NoisyMeanQuadraticTask", "QuadraticTask", "BatchQuadraticTask", "LogQuadraticTask", "SumQuadraticTask", "FixedDimQuadraticFamily",
           "FixedDimQuadraticFamilyData", "NoisyQuadraticFamily", "batch_datasets", "noise_datasets"]


def _check_dim(dim: Any) -> int:
  if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim < 1:
    raise ValueError(f"dim must be a positive int, got {dim!r}.")
  return int(dim)


def _seeded_datasets(example_shape, batch_size: int, num_examples: int, seed: int) -> Datasets:
  splits = {}
  for i, name in enumerate(SPLITS):
    values = np.random.default_rng([seed, i]).standard_normal((num_examples,) + tuple(example_shape))
    splits[name] = ArraySplit(values.astype(np.float32), batch_size, seed=seed * len(SPLITS) + i)
  return Datasets(**splits)


class QuadraticTask(base.Task):
  """``sum(params ** 2)`` over ``params: f32[dim]`` initialized from N(0, 1); no data."""

  def __init__(self, dim: int = 10):
    super().__init__()
    self._dim = _check_dim(dim)

  def loss(self, params, key, data):
    return jnp.sum(jnp.square(params))

  def init(self, key):
    return jax.random.normal(key, (self._dim,), jnp.float32)


class NoisyMeanQuadraticTask(base.Task):
  """``(x - n)^T H (x - n)`` with ``n ~ noise_stdev * N(0, I)`` drawn from the loss key and the fixed PSD
  ``H = A A^T`` (``A`` standard normal from ``PRNGKey(7)``, as the reference); ``params: f32[dim, 1]`` from
  ``10 * N(0, 1)``; no data."""

  def __init__(self, dim: int = 2, noise_stdev: float = 1.):
    super().__init__()
    self._dim = _check_dim(dim)
    if not (isinstance(noise_stdev, (int, float)) and np.isfinite(noise_stdev) and noise_stdev >= 0):
      raise ValueError(f"noise_stdev must be a finite number >= 0, got {noise_stdev!r}.")
    a = jax.random.normal(jax.random.PRNGKey(7), (self._dim, self._dim))
    self.hess, self.stdev = a @ a.T, float(noise_stdev)

  def loss(self, params, key, data):
    noise = self.stdev * jax.random.normal(jax.random.split(key)[1], jnp.shape(params))
    centered = params - noise
    return jnp.sum(centered.T @ self.hess @ centered)

  def init(self, key):
    return 10.0 * jax.random.normal(key, (self._dim, 1), jnp.float32)


@dataset_lru_cache
def batch_datasets(seed: int = 0) -> Datasets:
  """Batches ``f32[4, 2]`` of N(0, 1) values (seeded; the data of `BatchQuadraticTask`)."""
  return _seeded_datasets((2,), batch_size=4, num_examples=1024, seed=seed)


class BatchQuadraticTask(base.Task):
  """`QuadraticTask` over 10 dimensions with a (unused) data batch ``f32[4, 2]``."""

  @property
  def datasets(self) -> Datasets:
    return batch_datasets()

  def loss(self, params, key, data):
    return jnp.sum(jnp.square(params))

  def init(self, key):
    return jax.random.normal(key, (10,), jnp.float32)


class LogQuadraticTask(base.Task):
  """``log(sum(params ** 2))`` over ``f32[10]``; no data."""

  def loss(self, params, key, data):
    return jnp.log(jnp.sum(jnp.square(params)))

  def init(self, key):
    return jax.random.normal(key, (10,), jnp.float32)


class SumQuadraticTask(base.Task):
  """``sum((a + b) ** 2)`` over ``{"a": f32[10], "b": f32[10]}``; no data."""

  def loss(self, params, key, data):
    return jnp.sum(jnp.square(params["a"] + params["b"]))

  def init(self, key):
    ka, kb = jax.random.split(key)
    return {"a": jax.random.normal(ka, (10,), jnp.float32), "b": jax.random.normal(kb, (10,), jnp.float32)}


class _TargetQuadratic(base.Task):
  """``sum((target - params) ** 2)``; params ``f32[dim]`` from N(0, 1)."""

  def __init__(self, target, dim: int):
    self.target, self.dim = target, dim

  def loss(self, params, key, data):
    return jnp.sum(jnp.square(self.target - params))

  def init(self, key):
    return jax.random.normal(key, (self.dim,), jnp.float32)


class FixedDimQuadraticFamily(base.TaskFamily):
  """Quadratics ``sum((target - params) ** 2)`` whose config is the target ``f32[dim] ~ N(0, 1)``; no data."""

  def __init__(self, dim: int = 10):
    super().__init__()
    self._dim = _check_dim(dim)

  def sample(self, key):
    return jax.random.normal(key, (self._dim,), jnp.float32)

  def task_fn(self, task_params) -> base.Task:
    return _TargetQuadratic(task_params, self._dim)


@dataset_lru_cache
def noise_datasets(seed: int = 0) -> Datasets:
  """Batches ``f32[1]`` of N(0, 1) noise (seeded; the data of `FixedDimQuadraticFamilyData`)."""
  return _seeded_datasets((), batch_size=1, num_examples=4096, seed=seed)


class _NoisyTargetQuadratic(_TargetQuadratic):
  """``sum((target - params) ** 2) + sum(data)``, with l1 / l2 aux and losses clipped to [0, 1000] as normalizer."""

  def __init__(self, target, dim: int, datasets: Datasets):
    super().__init__(target, dim)
    self.datasets = datasets

  def loss(self, params, key, data):
    return jnp.sum(jnp.square(self.target - params)) + jnp.sum(data)

  def loss_and_aux(self, params, key, data):
    return self.loss(params, key, data), {"l2": jnp.mean(params ** 2), "l1": jnp.mean(jnp.abs(params))}

  def normalizer(self, loss):
    return jnp.clip(loss, 0, 1000)


class FixedDimQuadraticFamilyData(base.TaskFamily):
  """`FixedDimQuadraticFamily` whose loss adds a noise scalar from its datasets (`noise_datasets`)."""

  def __init__(self, dim: int):
    super().__init__()
    self._dim = _check_dim(dim)
    self.datasets = noise_datasets()

  def sample(self, key):
    return jax.random.normal(key, (self._dim,), jnp.float32)

  def task_fn(self, task_params) -> base.Task:
    return _NoisyTargetQuadratic(task_params, self._dim, self.datasets)


class _NoisyGradQuadratic(base.Task):
  """``sum((scale * (center - params)) ** 2)`` whose gradient (not value) carries noise ``cov * N(0, 1) * params``."""

  def __init__(self, center, scale, dim: int, cov: float):
    self.center, self.scale, self.dim, self.cov = center, scale, dim, cov

  def loss(self, params, key, data):
    noise = self.cov * jax.random.normal(key, (self.dim,), jnp.float32) * params
    grad_noise = noise - jax.lax.stop_gradient(noise)  # zero in value, noisy in gradient
    return jnp.sum(jnp.square(self.scale * (self.center - params)) + grad_noise)

  def init(self, key):
    return jax.random.normal(key, (self.dim,), jnp.float32)


class NoisyQuadraticFamily(base.TaskFamily):
  """Quadratics with a random center ``N(0, 1)`` and per-coordinate scale ``U(0, 25)``, and noisy gradients.

  Config: the tuple ``(center f32[dim], scale f32[dim])``; no data.
  """

  def __init__(self, dim: int, cov: float):
    super().__init__()
    self._dim = _check_dim(dim)
    self._cov = float(cov)
    self.datasets = None
    self.scale_constant = 25.0

  def sample(self, key):
    k_center, k_scale = jax.random.split(key)
    return (jax.random.normal(k_center, (self._dim,), jnp.float32),
            jax.random.uniform(k_scale, (self._dim,), jnp.float32) * self.scale_constant)

  def task_fn(self, task_params) -> base.Task:
    center, scale = task_params
    return _NoisyGradQuadratic(center, scale, self._dim, self._cov)
