"""The antithetic pair layout, in one place.

ES estimators train ``2N`` lanes in pairs: lane ``i`` runs ``theta + eps_i`` and lane ``i + N`` runs
``theta - eps_i`` (the *stacked* layout: the positive half first, then the negative half). The two lanes of a pair
draw the same keys (so the same task configs, initial params, trajectory lengths and batches) and reset together,
so they differ only through their theta. Every piece of code that depends on this layout is here:

* `lane_keys`: one key per lane, repeated for every lane group (a pair is lane ``i`` of groups 0 and 1);
* `pair_done`: a pair resets when either of its lanes does;
* `antithetic_thetas` / `tile_pairs`: the ``[2N]``-leading thetas and inner states of the pairs;
* `first_half`: the per-pair view of a per-lane flag both lanes share;
* `pair_differences`: ``L+ - L-`` per pair and step, with the pair mask.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp


def lane_keys(key: jax.Array, num_lanes: int, groups: int = 1) -> jax.Array:
  """``[num_lanes]`` keys; with ``groups > 1``, lane ``i`` of every group gets the same key."""
  if groups == 1:
    return jax.random.split(key, num_lanes)
  return jnp.concatenate([jax.random.split(key, num_lanes // groups)] * groups)


def pair_done(is_done: jax.Array) -> jax.Array:
  """``[2N]`` flags: a lane is done when it or its partner is."""
  n = is_done.shape[0] // 2
  either = is_done[:n] | is_done[n:]
  return jnp.concatenate([either, either])


def antithetic_thetas(theta: Any, eps: Any) -> Any:
  """``[2N]``-leading theta: ``theta + eps`` for lanes ``0..N-1`` and ``theta - eps`` for lanes ``N..2N-1``."""
  return jax.tree.map(lambda t, e: jnp.concatenate([t[None] + e, t[None] - e]), theta, eps)


def tile_pairs(tree: Any) -> Any:
  """``[N]``-leading ``tree`` (e.g. unperturbed lane states) as the ``[2N]`` lanes of N pairs."""
  return jax.tree.map(lambda x: jnp.concatenate([x, x]), tree)


def first_half(x: jax.Array, axis: int = 0) -> jax.Array:
  """The per-pair view (positive lanes) of a per-lane value both lanes of a pair share."""
  return jax.lax.slice_in_dim(x, 0, x.shape[axis] // 2, axis=axis)


def pair_differences(losses: jax.Array, mask: jax.Array, clip: Optional[float]):
  """Splits ``[T, 2N]`` antithetic losses into ``(delta [T, N], pair_mask [T, N], mean_loss)``.

  A step counts only when both particles are finite there; ``clip`` bounds ``|L+ - L-|``. ``mean_loss`` is the
  masked mean of the pairs' average loss (NaN when no step counts).
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
