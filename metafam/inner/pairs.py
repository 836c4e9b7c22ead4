"""The antithetic pair layout, in one place.

ES estimators train ``2N`` lanes in pairs: pair ``i`` runs ``theta + eps_i`` on lane ``2i`` and ``theta - eps_i`` on
lane ``2i + 1`` (the *interleaved* layout). The two lanes of a pair draw the same keys (so the same task configs,
initial params, trajectory lengths and batches) and reset together, so they differ only through their theta.
Because a pair is two neighbouring lanes, lanes split over D devices in contiguous shards keep every pair on one
device whenever D divides N: the pair bookkeeping (resets, differences, per-pair accumulators) then needs no
cross-device traffic, and the layout, hence a checkpoint, is the same for every device and process count. Every
piece of code that depends on the layout is here:

* `lane_keys`: one key per lane; with ``paired``, both lanes of a pair get the same key;
* `pair_done`: a pair resets when either of its lanes does;
* `antithetic_thetas` / `tile_pairs` / `join`: the ``[2N]``-leading thetas and inner states of the pairs;
* `halves` / `first_half`: the per-pair ``[N]`` views (positive lanes, negative lanes) of a per-lane value;
* `pair_differences`: ``L+ - L-`` per pair and step, with the pair mask.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp

from metafam.optimizers import low_rank


def halves(x: jax.Array, axis: int = 0) -> Tuple[jax.Array, jax.Array]:
  """The per-pair views ``(positive lanes, negative lanes)``, each with ``N`` pairs along ``axis``, of a ``2N``-lane
  value."""
  x = jnp.moveaxis(x, axis, 0)
  split = x.reshape((x.shape[0] // 2, 2) + x.shape[1:])
  return jnp.moveaxis(split[:, 0], 0, axis), jnp.moveaxis(split[:, 1], 0, axis)


def join(pos: Any, neg: Any) -> Any:
  """The ``[2N]``-leading lanes of ``N`` pairs from their positive and negative ``[N]``-leading values (trees)."""
  return jax.tree.map(lambda p, n: jnp.stack([p, n], axis=1).reshape((2 * p.shape[0],) + p.shape[1:]), pos, neg)


def lane_keys(key: jax.Array, num_lanes: int, groups: int = 1, paired: bool = False) -> jax.Array:
  """``[num_lanes]`` keys. With ``paired``, the two lanes of each antithetic pair get the same key; with
  ``groups > 1``, lane ``i`` of each of ``groups`` consecutive groups does."""
  if paired:
    keys = jax.random.split(key, num_lanes // 2)
    return join(keys, keys)
  if groups == 1:
    return jax.random.split(key, num_lanes)
  return jnp.concatenate([jax.random.split(key, num_lanes // groups)] * groups)


def pair_done(is_done: jax.Array) -> jax.Array:
  """``[2N]`` flags: a lane is done when it or its partner is."""
  pos, neg = halves(is_done)
  either = pos | neg
  return join(either, either)


def antithetic_thetas(theta: Any, eps: Any) -> Any:
  """``[2N]``-leading theta: ``theta + eps_i`` on pair ``i``'s positive lane, ``theta - eps_i`` on its partner.

  A leaf whose ``eps`` is a `low_rank.LowRank` ``(a [N, m, r], b [N, n, r])`` becomes a `low_rank.Perturbed`: the
  shared leaf and per-lane factors ``(+-a_i, b_i)``, never ``2N`` dense matrices.
  """
  def one(t, e):
    if isinstance(e, low_rank.LowRank):
      return low_rank.Perturbed(t, low_rank.LowRank(join(e.a, -e.a), join(e.b, e.b)))
    return join(t[None] + e, t[None] - e)
  return jax.tree.map(one, theta, eps)


def tile_pairs(tree: Any) -> Any:
  """``[N]``-leading ``tree`` (e.g. unperturbed lane states) as the ``[2N]`` lanes of N pairs."""
  return join(tree, tree)


def first_half(x: jax.Array, axis: int = 0) -> jax.Array:
  """The per-pair view (positive lanes) of a per-lane value both lanes of a pair share."""
  return halves(x, axis)[0]


def pair_differences(losses: jax.Array, mask: jax.Array, clip: Optional[float]):
  """Splits ``[T, 2N]`` antithetic losses into ``(delta [T, N], pair_mask [T, N], mean_loss)``.

  A step counts only when both particles are finite there; ``clip`` bounds ``|L+ - L-|``. ``mean_loss`` is the
  masked mean of the pairs' average loss (NaN when no step counts).
  """
  (pos, neg), (mask_pos, mask_neg) = halves(losses, 1), halves(mask, 1)
  pair_mask = mask_pos * mask_neg
  delta = (pos - neg) * pair_mask
  if clip is not None:
    delta = jnp.clip(delta, -clip, clip)
  mean_loss = masked_mean_or_nan(jnp.sum(0.5 * (pos + neg) * pair_mask), jnp.sum(pair_mask))
  return delta, pair_mask, mean_loss


def masked_mean_or_nan(total: jax.Array, count: jax.Array) -> jax.Array:
  """``total / count``, or NaN when ``count == 0``: an estimate with nothing finite to average reports NaN, not 0.

  The value is ``total / max(count, 1)`` otherwise (bit for bit), and the derivative where ``count == 0`` is 0.
  """
  return jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)
