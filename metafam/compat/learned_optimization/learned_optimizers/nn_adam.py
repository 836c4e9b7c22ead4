"""`learned_optimization.learned_optimizers.nn_adam`: metafam's `NNAdam` (Adam whose per-tensor hyper-parameters
come from an LSTM) under the reference's name and initial hyper-parameter arguments.

``lstm_hidden_size`` sets metafam's ``lstm_hidden``; ``output_scale`` and ``decay_strength`` are supported at the
reference's defaults only (other values raise NotImplementedError).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.learned_optimizers._features import clip_log_abs, sorted_values
from metafam.compat.learned_optimization.learned_optimizers.base import LOOptFn, reject_unsupported
from metafam.compat.learned_optimization.learned_optimizers.common import _InitUpdate  # noqa: F401
from metafam.optimizers import nn_adam as _nn_adam

PRNGKey = jax.Array

__all__ = ["NNAdam", "MeanAndMeanSquareAccumulator"]

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MeanAndMeanSquareAccumulator:
  """The reference's first- and second-moment accumulator (the state of `_first_second_rolling`)."""
  m: Any
  rms: Any
  t: jax.Array

  def replace(self, **changes: Any) -> "MeanAndMeanSquareAccumulator":
    return dataclasses.replace(self, **changes)


def _first_second_rolling() -> _InitUpdate:
  """``(init, update)`` of `MeanAndMeanSquareAccumulator`: ``m <- b1 m + (1 - b1) g``, ``rms <- b2 rms + (1 - b2)
  g^2`` with per-leaf ``beta1`` / ``beta2`` trees (``update(state, grad, beta1, beta2)``), ``t`` counting updates."""

  def init(p):
    zeros = jax.tree.map(jnp.zeros_like, p)
    return MeanAndMeanSquareAccumulator(m=zeros, rms=jax.tree.map(jnp.zeros_like, p), t=jnp.asarray(0))

  def update(state, grad, beta1, beta2):
    m = jax.tree.map(lambda a, g, b: b * a + (1 - b) * g, state.m, grad, beta1)
    rms = jax.tree.map(lambda a, g, b: b * a + (1 - b) * g * g, state.rms, grad, beta2)
    return MeanAndMeanSquareAccumulator(m=m, rms=rms, t=state.t + 1)

  return _InitUpdate(init, update)


def _clip_log_abs(value: jax.Array) -> jax.Array:
  """``0.5 * clip(log(1e-8 + |value|), -5, 5)``."""
  return clip_log_abs(value)


def _sorted_values(value_dict: Any) -> Any:
  """The mapping's values in the order of its sorted keys."""
  return sorted_values(value_dict)


class _Invertable:
  """A hyper-parameter's map to its meta-parameter (``forward``) and back (``inverse``), both jitted."""

  def __init__(self, forward: Callable[[jax.Array], jax.Array], inverse: Callable[[jax.Array], jax.Array]):
    self.forward = jax.jit(forward)
    self.inverse = jax.jit(inverse)

  @functools.partial(jax.jit, static_argnums=0)
  def tree_inverse_forward(self, val: Any) -> Any:
    return jax.tree.map(lambda v: self.forward(self.inverse(v)), val)


_scaled_lr = _Invertable(forward=lambda x: 0.1 * jnp.log(x),
                         inverse=lambda x: jnp.clip(jnp.exp(10.0 * x), 1e-8, 1e3))
_scaled_epsilon = _Invertable(forward=lambda x: 0.1 * jnp.log(x),
                              inverse=lambda x: jnp.clip(jnp.exp(10.0 * x), 1e-11, 1e4))
_scaled_one_minus_log = _Invertable(forward=lambda x: 0.1 * jnp.log(1 - x),
                                    inverse=lambda x: 1 - jnp.exp(jnp.clip(10 * x, -10, 0)))


class NNAdam(LOOptFn, _nn_adam.NNAdam):

  def __init__(self, output_scale: float = 0.01, initial_learning_rate: float = 1e-4, initial_beta1: float = 0.9,
               initial_beta2: float = 0.999, initial_epsilon: float = 1e-8, decay_strength: float = 0.0,
               lstm_hidden_size: int = 32):
    reject_unsupported("NNAdam", output_scale=(output_scale, 0.01), decay_strength=(decay_strength, 0.0))
    super().__init__(initial_lr=initial_learning_rate, beta1=initial_beta1, beta2=initial_beta2,
                     epsilon=initial_epsilon, lstm_hidden=lstm_hidden_size)
