"""Quadratic task families (plain JAX): sampled targets and curvatures, optionally noisy data."""

from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metafam._checks import check_positive_int
from metafam.datasets.base import ArraySplit, Datasets, SPLITS, dataset_lru_cache
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks.base import Task


def _log_uniform(key, low: float, high: float) -> jax.Array:
  return jnp.exp(jax.random.uniform(key, (), jnp.float32, np.log(low), np.log(high)))


def _check_range(name: str, value: Tuple[float, float]) -> Tuple[float, float]:
  low, high = value
  if not 0 < low <= high:
    raise ValueError(f"{name} must satisfy 0 < low <= high, got {value!r}.")
  return float(low), float(high)


class _QuadraticInstance(Task):
  """``0.5 * scale * ||x - target - noise||^2`` averaged over the batch's noise rows (no batch: noise = 0)."""

  def __init__(self, cfg, dim, datasets):
    self.cfg, self.dim, self.datasets = cfg, dim, datasets

  def init(self, key):
    return jax.random.normal(key, (self.dim,), jnp.float32)

  def loss(self, params, key, batch):
    err = params - self.cfg["target"]
    if batch is None:
      return 0.5 * self.cfg["scale"] * jnp.sum(jnp.square(err))
    return 0.5 * self.cfg["scale"] * jnp.mean(jnp.sum(jnp.square(err[None, :] - batch["noise"]), axis=-1))


class QuadraticFamily(TaskFamily):
  """Quadratics ``0.5 * scale * ||x - target||^2`` over ``x: f32[dim]``.

  Config: ``{"target": f32[dim] ~ N(0, target_std^2), "scale": f32[] log-uniform in scale_range}``.
  """

  def __init__(self, dim: int = 10, target_std: float = 1.0, scale_range: Tuple[float, float] = (1.0, 1.0)):
    super().__init__()
    dim = check_positive_int("dim", dim)
    self.dim, self.target_std = dim, float(target_std)
    self.scale_range = _check_range("scale_range", scale_range)
    self.name = f"QuadraticFamily{dim}"

  def sample(self, key):
    k1, k2 = jax.random.split(key)
    return {"target": self.target_std * jax.random.normal(k1, (self.dim,), jnp.float32),
            "scale": _log_uniform(k2, *self.scale_range)}

  def task_fn(self, cfg):
    return _QuadraticInstance(cfg, self.dim, self.datasets)


@dataset_lru_cache
def gaussian_noise_datasets(dim: int, batch_size: int, noise_std: float, num_examples: int = 4096,
                            seed: int = 0) -> Datasets:
  """Batches ``{"noise": f32[B, dim]}`` of N(0, noise_std^2) vectors; each split is its own fixed draw."""
  splits = {}
  for i, name in enumerate(SPLITS):
    rng = np.random.default_rng([seed, i])
    noise = (noise_std * rng.standard_normal((num_examples, dim))).astype(np.float32)
    splits[name] = ArraySplit({"noise": noise}, batch_size, seed=seed * len(SPLITS) + i)
  return Datasets(**splits, extra_info={"noise_std": noise_std})


class NoisyQuadraticFamily(QuadraticFamily):
  """Quadratics whose minibatch loss sees Gaussian noise: ``mean_b 0.5 * scale * ||x - target - noise_b||^2``.

  The noise comes from a `Datasets` (default: `gaussian_noise_datasets`), so the expected loss equals the
  noise-free quadratic plus ``0.5 * scale * dim * noise_std^2``, and minibatch gradients are unbiased.
  """

  def __init__(self, dim: int = 10, noise_std: float = 0.5, batch_size: int = 16, target_std: float = 1.0,
               scale_range: Tuple[float, float] = (1.0, 1.0), datasets: Datasets = None):
    super().__init__(dim, target_std, scale_range)
    self.noise_std = float(noise_std)
    self.datasets = datasets if datasets is not None else gaussian_noise_datasets(dim, batch_size, self.noise_std)
    self.name = f"NoisyQuadraticFamily{dim}"
