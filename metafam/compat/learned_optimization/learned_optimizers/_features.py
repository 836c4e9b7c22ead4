"""Feature helpers shared by LO's Adafactor-MLP learned optimizers (`adafac_mlp_lopt`, `adafac_nominal`).

``second_moment_normalizer(x, axis, eps)``: ``x / sqrt(eps + mean(x^2 over axis))``;
``tanh_embedding(x)``: ``tanh(x / s - 1)`` for the 11 timescales ``s`` in 1, 3, 10, ..., 100000 (leading axis);
``decay_to_param(d) = log(1 - d) / 10`` and its inverse ``param_to_decay(p) = 1 - exp(10 p)``;
``clip_log_abs(v, scale, factor) = factor * clip(log(1e-8 + |v scale|), -5, 5)``; ``sorted_values(d)``: a mapping's
values in the order of its sorted keys. Each module of the reference keeps its own private copy of these (with its
own constants); the compat modules expose them under the reference's private names.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PRNGKey = jax.Array

_TIMESCALES = (1, 3, 10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000)


def second_moment_normalizer(x, axis, eps=1e-5):
  return x * jax.lax.rsqrt(eps + jnp.mean(jnp.square(x), axis=axis, keepdims=True))


def tanh_embedding(x):
  scales = jnp.asarray(_TIMESCALES, jnp.float32).reshape((-1,) + (1,) * jnp.ndim(x))
  return jnp.tanh(jnp.asarray(x, jnp.float32) / scales - 1.0)


def clip_log_abs(v, scale=1.0, factor=0.5):
  return jnp.clip(jnp.log(1e-8 + jnp.abs(v * scale)), -5, 5) * factor


def sorted_values(mapping):
  return tuple(value for _, value in sorted(mapping.items(), key=lambda kv: kv[0]))


def decay_to_param(x):
  return jnp.log(1 - x) / 10.0


def param_to_decay(x):
  return 1 - jnp.exp(x * 10.0)
