"""`HyperV2`'s building blocks that need no network (private): the loss buffer behind its loss features, the choice
of factored axes and the floored reciprocal square root (`metafam.optimizers.hyper_v2` re-exports them)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

NUM_LOSS_DECAYS = 10


# -- the loss buffer ----------------------------------------------------------------------------------------------
def loss_buffer_init(num_steps: Any, dtype: Any = jnp.float32) -> Dict[str, jax.Array]:
  """Running means of the loss at 10 half-lives log-spaced from 10 to ``num_steps`` steps (``dtype``: float32, or
  float64 for float64 params, where the features' ratios of small differences need the precision)."""
  halflife = jnp.logspace(1.0, jnp.log10(jnp.asarray(num_steps, jnp.float32)), NUM_LOSS_DECAYS)
  decays = jnp.exp(-1.0 / halflife).astype(dtype)
  return {"means": jnp.zeros((NUM_LOSS_DECAYS,), dtype), "iteration": jnp.asarray(0, jnp.int32),
          "running_min": jnp.full((NUM_LOSS_DECAYS,), 999999999999.0, dtype), "decays": decays}


def loss_buffer_update(buf: Dict[str, jax.Array], loss: jax.Array) -> Dict[str, jax.Array]:
  """Adds ``loss``, first capped at twice the largest bias-corrected mean (the first loss is taken as is)."""
  d, t = buf["decays"], buf["iteration"]
  top = jnp.max(buf["means"] / (1 - d ** (t + 1)))
  loss = jnp.minimum(jnp.abs(jnp.where(t == 0, loss, top)) * 2, loss)
  means = buf["means"] * d + loss * (1.0 - d)
  running_min = jnp.minimum(buf["running_min"], means / (1 - d ** (t + 1)))
  return {"means": means, "iteration": t + 1, "running_min": running_min, "decays": d}


def loss_buffer_features(buf: Dict[str, jax.Array]) -> jax.Array:
  """``f32[9]``: for each of the 9 shorter half-lives, where its mean lies between the running minimum (-1) and the
  next longer mean (0), clipped to [-1, 1]; zeros for the first two steps."""
  mean = buf["means"] / (1 - buf["decays"] ** buf["iteration"])
  low = buf["running_min"][:-1]
  feat = jnp.clip((mean[:-1] - low) / jnp.maximum(1e-8, mean[1:] - low) - 1.0, -1, 1)
  return jnp.where(buf["iteration"] <= 2, feat * 0, feat)


def factored_dims(shape: Sequence[int]) -> Optional[Tuple[int, int]]:
  """``(d1, d0)``: the second-largest and the largest axis (ties: the later axis counts as larger), or None below
  rank 2."""
  if len(shape) < 2:
    return None
  order = np.argsort(shape, kind="stable")
  return int(order[-2]), int(order[-1])


def _clip_log_abs(v: jax.Array) -> jax.Array:
  return jnp.clip(jnp.log(1e-8 + jnp.abs(v * 10.0)), -5, 5) * 0.5


def safe_rsqrt(x: jax.Array) -> jax.Array:
  """``1 / sqrt(max(x, 1e-9))``: finite for zero (and tiny negative) second moments."""
  return jax.lax.rsqrt(jnp.maximum(x, 1e-9))
