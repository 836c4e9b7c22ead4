"""The gradient-estimator interface shared by every outer trainer, and the pieces the ES family shares.

An estimator is functional (evosax-style): ``init_worker_state(theta, key) -> worker_state`` and
``estimate(theta, worker_state, key) -> (GradientEstimate, new_worker_state)``; both are pure and jittable, so a
meta-training step can fuse estimation and the meta-update in one program.

ES scaling, used by every ES estimator here: perturbations are ``eps = sigma * z`` with ``z ~ N(0, I)`` (``sigma`` is a
standard deviation), each applied antithetically (``theta + eps`` and ``theta - eps`` share keys and data), and the
estimate is ``mean_pairs((L+ - L-) * eps) / (2 sigma^2)``: unbiased for the gradient of the Gaussian-smoothed
meta-loss ``E_z[L(theta + sigma z)]``, which equals the true gradient on a quadratic.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metafam.inner import sharding
from metafam.inner.truncated_step import UnrollOutput

LOSS_KINDS = ("meta_loss", "normalized_meta_loss", "loss", "normalized_loss")


@functools.partial(jax.tree_util.register_dataclass, data_fields=["grad", "meta_loss", "metrics"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class GradientEstimate:
  """One meta-gradient estimate.

  Attributes:
    grad: pytree like theta.
    meta_loss: f32 scalar, the mean (unperturbed or antithetic-average) meta-loss the estimate is about; NaN when
      every step (or pair) was non-finite, so the estimate carries no information (its gradient is then 0).
    metrics: dict of f32 scalars, e.g. ``num_nonfinite`` (masked steps or pairs) and ``inner_steps``.
  """
  grad: Any
  meta_loss: jax.Array
  metrics: Dict[str, jax.Array]


class GradientEstimator:
  """Base class: ``init_worker_state(theta, key)`` and ``estimate(theta, worker_state, key)``."""

  name = "estimator"
  mesh = None  # the `jax.sharding.Mesh` the lanes are spread over, or None (one device)

  def place_theta(self, theta: Any) -> Any:
    """``theta`` (or any tree of shared values, e.g. a meta-optimizer state) replicated on the estimator's devices."""
    return sharding.put_replicated(theta, self.mesh)

  def lane_major(self, worker_state: Any) -> Any:
    """A tree of bools like ``worker_state``: which leaves have a leading lane axis (by default all of them)."""
    return jax.tree.map(lambda _: True, worker_state)

  def place_worker_state(self, worker_state: Any) -> Any:
    """Outside jit: ``worker_state`` on the estimator's devices, lane-major leaves split by lane, the rest replicated."""
    if self.mesh is None:
      return worker_state
    return jax.device_put(worker_state, sharding.layout_shardings(self.lane_major(worker_state), self.mesh))

  def constrain_worker_state(self, worker_state: Any) -> Any:
    """Inside jit: keep ``worker_state`` laid out as `place_worker_state` puts it (so the next call reuses the
    compiled program instead of compiling one for another layout)."""
    if self.mesh is None:
      return worker_state
    return jax.lax.with_sharding_constraint(worker_state,
                                            sharding.layout_shardings(self.lane_major(worker_state), self.mesh))

  def init_worker_state(self, theta: Any, key: jax.Array) -> Any:
    raise NotImplementedError

  def estimate(self, theta: Any, worker_state: Any, key: jax.Array):
    raise NotImplementedError

  @property
  def inner_steps_per_estimate(self) -> int:
    """Inner steps (summed over lanes) one estimate runs; for throughput metrics."""
    raise NotImplementedError


def check_loss_kind(loss_kind: str) -> str:
  if loss_kind not in LOSS_KINDS:
    raise ValueError(f"loss_kind must be one of {LOSS_KINDS}, got {loss_kind!r}.")
  return loss_kind


def check_positive(name: str, value: Any, integer: bool = False) -> Any:
  """``value`` if it is a positive finite number (a positive int with ``integer``), else ValueError naming ``name``.

  Bools, NaN and infinities are refused (``nan <= 0`` is False, so a plain comparison would let NaN through).
  """
  ok = isinstance(value, int) if integer else isinstance(value, numbers.Real)
  if not ok or isinstance(value, (bool, np.bool_)) or not np.isfinite(value) or not value > 0:
    raise ValueError(f"{name} must be a positive {'int' if integer else 'number'} (finite, not a bool), got {value!r}.")
  return value


def step_losses(out: UnrollOutput, loss_kind: str):
  """``(losses, mask)``, both ``[num_steps, num_lanes]``; masked entries are 0."""
  return getattr(out, loss_kind), out.mask


def sample_perturbations(theta: Any, key: jax.Array, num: int, sigma: float) -> Any:
  """``num`` perturbations ``sigma * z`` shaped like theta with a leading ``num`` axis (one key per leaf)."""
  leaves, treedef = jax.tree.flatten(theta)
  keys = jax.random.split(key, max(len(leaves), 1))
  eps = [sigma * jax.random.normal(k, (num,) + jnp.shape(x), jnp.result_type(x)) for k, x in zip(keys, leaves)]
  return jax.tree.unflatten(treedef, eps)


def antithetic_thetas(theta: Any, eps: Any) -> Any:
  """``[2N]``-leading theta: ``theta + eps`` for lanes ``0..N-1`` and ``theta - eps`` for lanes ``N..2N-1``."""
  return jax.tree.map(lambda t, e: jnp.concatenate([t[None] + e, t[None] - e]), theta, eps)


def pair_differences(losses: jax.Array, mask: jax.Array, clip: Optional[float]):
  """Splits ``[T, 2N]`` antithetic losses into ``(delta [T, N], pair_mask [T, N], mean_loss)``.

  A step counts only when both particles are finite there; ``clip`` bounds ``|L+ - L-|``.
  """
  n = losses.shape[1] // 2
  pair_mask = mask[:, :n] * mask[:, n:]
  delta = (losses[:, :n] - losses[:, n:]) * pair_mask
  if clip is not None:
    delta = jnp.clip(delta, -clip, clip)
  mean_loss = masked_mean_or_nan(jnp.sum(0.5 * (losses[:, :n] + losses[:, n:]) * pair_mask), jnp.sum(pair_mask))
  return delta, pair_mask, mean_loss


def masked_mean_or_nan(total: jax.Array, count: jax.Array) -> jax.Array:
  """``total / count``, or NaN when ``count == 0``: an estimate with nothing finite to average reports NaN, not 0.

  The value is ``total / max(count, 1)`` otherwise (bit for bit), and the derivative where ``count == 0`` is 0.
  """
  return jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)


def weighted_noise_sum(coef: jax.Array, noise: Any) -> Any:
  """``sum_i coef[i] * noise[i]`` per leaf (``coef: [N]``, noise leaves ``[N, ...]``)."""
  return jax.tree.map(lambda e: jnp.tensordot(coef.astype(e.dtype), e, axes=1), noise)


def count_nonfinite(tree: Any) -> jax.Array:
  """The number of non-finite entries of ``tree`` (int32)."""
  leaves = jax.tree.leaves(tree)
  return sum(jnp.sum(~jnp.isfinite(x)) for x in leaves) if leaves else jnp.asarray(0)


def zero_nonfinite(tree: Any):
  """Replaces non-finite entries by 0; returns ``(tree, number of replaced entries)``."""
  return jax.tree.map(lambda x: jnp.where(jnp.isfinite(x), x, 0.0), tree), count_nonfinite(tree)
