"""`learned_optimization.tasks.generative_model_utils`: diagonal Gaussians for VAEs and the ELBO's two terms.

The reference builds on TensorFlow Probability, which metafam does not depend on; `Normal` here is the small
diagonal-Gaussian subset those helpers use (``loc``, ``scale``, ``sample(seed=)``, ``log_prob``, ``kl_divergence``
to another `Normal`, in closed form).

* `LogStddevNormal(mu_and_log_sigma)`: splits ``f32[B, 2k]`` into means and log standard deviations.
* `HKQuantizedNormal(mu_and_log_sigma, bin_size)`: ``log_prob`` of data quantized into bins of ``bin_size``
  (uniform dequantization noise from haiku's rng, plus ``log(bin_size)``); call it inside a haiku transform.
* `log_prob_elbo_components(encoder, decoder, prior, x, key)`: ``(log p(x|z), KL(q(z|x) || p(z)))`` per example,
  ``z`` one reparameterized sample of ``q = encoder(x)``.
"""

from __future__ import annotations

import math
from typing import Callable, Tuple

import haiku as hk
import jax
import jax.numpy as jnp

__all__ = ["Normal", "LogStddevNormal", "HKQuantizedNormal", "log_prob_elbo_components", "quantized_log_prob"]


class Normal:
  """Independent Gaussians with means ``loc`` and standard deviations ``scale`` (same shape)."""

  def __init__(self, loc: jax.Array, scale: jax.Array, name: str = "Normal"):
    self.loc, self.scale, self.name = loc, scale, name

  def sample(self, seed: jax.Array) -> jax.Array:
    return self.loc + self.scale * jax.random.normal(seed, jnp.shape(self.loc), jnp.result_type(self.loc))

  def log_prob(self, x: jax.Array, name: str = "log_prob") -> jax.Array:
    z = (x - self.loc) / self.scale
    return -0.5 * jnp.square(z) - jnp.log(self.scale) - 0.5 * math.log(2 * math.pi)

  def kl_divergence(self, other: "Normal") -> jax.Array:
    """Elementwise ``KL(self || other)``."""
    ratio = jnp.square(self.scale / other.scale)
    return 0.5 * (ratio + jnp.square((self.loc - other.loc) / other.scale) - 1.0 - jnp.log(ratio))


def _split(mu_and_log_sigma: jax.Array) -> Tuple[jax.Array, jax.Array]:
  if mu_and_log_sigma.ndim != 2 or mu_and_log_sigma.shape[1] % 2:
    raise ValueError(f"mu_and_log_sigma must be [B, 2k] (means then log standard deviations), got shape "
                     f"{mu_and_log_sigma.shape}.")
  k = mu_and_log_sigma.shape[1] // 2
  return mu_and_log_sigma[:, :k], mu_and_log_sigma[:, k:]


class LogStddevNormal(Normal):
  """`Normal` from concatenated means and log standard deviations ``[B, 2k]``."""

  def __init__(self, mu_and_log_sigma: jax.Array, slice_dim: int = -1, name: str = "Normal"):
    mu, self._log_sigma = _split(mu_and_log_sigma)
    super().__init__(mu, jnp.exp(self._log_sigma), name)


class HKQuantizedNormal(Normal):
  """`LogStddevNormal` whose ``log_prob`` treats data as quantized to ``bin_size`` (inside a haiku transform)."""

  def __init__(self, mu_and_log_sigma: jax.Array, bin_size: float = 1 / 255, name: str = "noisy_normal"):
    mu, self._log_sigma = _split(mu_and_log_sigma)
    super().__init__(mu, jnp.exp(self._log_sigma), name)
    self._bin_size = bin_size

  def log_prob(self, x: jax.Array, name: str = "log_prob") -> jax.Array:
    return quantized_log_prob(self, x, hk.next_rng_key(), self._bin_size)


def quantized_log_prob(dist: Normal, x: jax.Array, key: jax.Array, bin_size: float) -> jax.Array:
  """``dist.log_prob(x + u) + log(bin_size)`` with ``u ~ U(-bin_size / 2, bin_size / 2)`` drawn from ``key``: a
  one-sample estimate of the log probability of ``x``'s quantization bin."""
  noise = jax.random.uniform(key, jnp.shape(x), jnp.result_type(x), -0.5 * bin_size, 0.5 * bin_size)
  return Normal.log_prob(dist, x + noise) + math.log(bin_size)


def log_prob_elbo_components(encoder: Callable, decoder: Callable, prior: Normal, x: jax.Array,
                             key: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """``(log p(x|z), KL(q(z|x) || p(z)))``, each summed over all but the batch axis (``ELBO = log p - KL``)."""
  q = encoder(x)
  z = q.sample(seed=key)
  total = lambda v: jnp.sum(v, axis=tuple(range(1, jnp.ndim(v))))
  return total(decoder(z).log_prob(x)), total(q.kl_divergence(prior))
