"""Quadratic tasks in plain JAX (no neural-network library): the simplest problems with known answers."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from metafam._checks import check_positive_int
from metafam.tasks.base import Task


class QuadraticTask(Task):
  """``loss(x) = 0.5 * scale * ||x - target||^2`` over ``x: f32[dim]`` initialized from N(0, 1); no data.

  The gradient is ``scale * (x - target)``, so gradient descent with learning rate ``lr`` contracts the error by
  ``|1 - lr * scale|`` per step. ``target`` defaults to zeros.
  """

  def __init__(self, dim: int = 10, scale: float = 1.0, target=None):
    dim = check_positive_int("dim", dim)
    self.dim = dim
    self.scale = scale
    self.target = jnp.zeros((dim,), jnp.float32) if target is None else jnp.asarray(target, jnp.float32)
    if self.target.shape != (dim,):
      raise ValueError(f"target must have shape ({dim},), got {self.target.shape}.")
    self.name = f"Quadratic{dim}"

  def init(self, key):
    return jax.random.normal(key, (self.dim,), jnp.float32)

  def loss(self, params, key, batch):
    return 0.5 * self.scale * jnp.sum(jnp.square(params - self.target))
