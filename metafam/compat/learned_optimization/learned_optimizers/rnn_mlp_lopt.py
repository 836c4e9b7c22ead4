"""`learned_optimization.learned_optimizers.rnn_mlp_lopt`: metafam's `RNNMLPLOpt` (a per-tensor LSTM giving
context to a per-parameter MLP) under the reference's name and arguments.

``step_multiplier`` / ``magnitude_rate`` are metafam's ``step_mult`` / ``exp_mult``; ``hidden_size`` and
``hidden_layer`` the MLP's widths; ``lstm_hidden_size`` the LSTM width; ``lstm_to_ff`` the context fed to the MLP.
The sizes of the reference's internal projections (``from_mlp_size``, ``from_lstm_size``) are supported at their
defaults only (other values raise NotImplementedError).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.learned_optimizers._features import (  # noqa: F401  LO's private names
    _TIMESCALES, clip_log_abs, second_moment_normalizer as _second_moment_normalizer, sorted_values)
from metafam.compat.learned_optimization.learned_optimizers.base import LOOptFn, reject_unsupported
from metafam.optimizers import rnn_mlp_lopt as _rnn

PRNGKey = jax.Array

__all__ = ["RNNMLPLOpt"]


def _sin_embedding(iteration: jax.Array) -> jax.Array:
  """``f32[11, *shape]``: ``sin(iteration / (s pi))`` for the timescales ``s`` = 1, 3, 10, ..., 100000."""
  scales = jnp.asarray(_TIMESCALES, jnp.float32).reshape((-1,) + (1,) * jnp.ndim(iteration))
  return jnp.sin(jnp.asarray(iteration, jnp.float32) / (scales * jnp.pi))


def _avg_square_mean(tree: Any) -> jax.Array:
  """The mean over leaves of each leaf's mean square."""
  leaves = jax.tree.leaves(tree)
  return sum(jnp.mean(jnp.square(x)) for x in leaves) / len(leaves)


def _clip_log_abs(value: jax.Array) -> jax.Array:
  """``clip(log(1e-8 + |value|), -5, 5)`` (this module's variant has no factor 1/2)."""
  return clip_log_abs(value, factor=1.0)


def _sorted_values(dd: Any) -> Any:
  """The mapping's values in the order of its sorted keys."""
  return sorted_values(dd)


def _unstack(a: jax.Array, axis: int = 0) -> Sequence[jax.Array]:
  """The slices of ``a`` along ``axis``, that axis removed (the inverse of ``jnp.stack``)."""
  return [jnp.squeeze(b, axis=axis) for b in jnp.split(a, a.shape[axis], axis=axis)]


class RNNMLPLOpt(LOOptFn, _rnn.RNNMLPLOpt):

  def __init__(self, step_multiplier: float = 0.001, magnitude_rate: float = 0.001, hidden_size: int = 32,
               hidden_layer: int = 2, from_mlp_size: int = 16, from_lstm_size: int = 18, lstm_to_ff: int = 17,
               lstm_hidden_size: int = 64, decays: Sequence[float] = (0.5, 0.9, 0.99, 0.999, 0.9999)):
    reject_unsupported("RNNMLPLOpt", from_mlp_size=(from_mlp_size, 16), from_lstm_size=(from_lstm_size, 18))
    super().__init__(hidden_sizes=(hidden_size,) * hidden_layer, lstm_hidden=lstm_hidden_size,
                     context_size=lstm_to_ff, decays=tuple(decays), step_mult=step_multiplier,
                     exp_mult=magnitude_rate)
