"""`learned_optimization.circular_buffer`: a fixed-size ring of pytrees kept in a JAX state (jit-friendly).

``CircularBuffer(abstract_value, size)`` (``abstract_value``: a pytree of ``jax.ShapeDtypeStruct`` /
``ShapedArray``) is stateless; its state is ``CircularBufferState(values=(buffer, slot_index), idx)`` where
``buffer`` has a leading axis of ``size``, ``slot_index[i]`` is the insertion count of the value in slot ``i``
(negative while empty) and ``idx`` counts insertions. ``add`` writes slot ``idx % size``.
``stack_with_idx`` returns ``(buffer, position)`` with ``position`` the slot's age order (``0`` the oldest of the
last ``size`` values, ``size - 1`` the newest, ``-1`` empty); ``stack_reorder`` returns the buffer rolled oldest
first and a 0/1 mask of filled slots; ``gather_from_present(state, idxs)`` reads ``idxs`` steps into the past
(``-1``: the newest).
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Generic, Tuple, TypeVar

import jax
import jax.numpy as jnp

__all__ = ["CircularBufferState", "T", "CircularBuffer"]

T = TypeVar("T")

CircularBufferState = collections.namedtuple("CircularBufferState", ["values", "idx"])


class CircularBuffer(Generic[T]):
  """A ring buffer of ``size`` values shaped like ``abstract_value`` (see the module docstring)."""

  def __init__(self, abstract_value: T, size: int):
    if not isinstance(size, int) or size < 1:
      raise ValueError(f"CircularBuffer: size must be a positive int, got {size!r}.")
    self.abstract_value = abstract_value
    self.size = size

  @functools.partial(jax.jit, static_argnums=0)
  def init(self, default: Any = 0.0) -> CircularBufferState:
    """An empty buffer whose slots hold ``default``."""
    buffer = jax.tree.map(lambda a: jnp.full((self.size,) + tuple(a.shape), default, a.dtype), self.abstract_value)
    return CircularBufferState(values=(buffer, jnp.full((self.size,), -self.size, jnp.int32)),
                               idx=jnp.asarray(0, jnp.int32))

  @functools.partial(jax.jit, static_argnums=0)
  def add(self, state: CircularBufferState, value: T) -> CircularBufferState:
    """``state`` with ``value`` written over the oldest slot."""
    slot = state.idx % self.size
    buffer, slot_index = state.values
    buffer = jax.tree.map(lambda b, v: b.at[slot].set(v), buffer, value)
    return CircularBufferState(values=(buffer, slot_index.at[slot].set(state.idx)), idx=state.idx + 1)

  def _positions(self, state: CircularBufferState) -> jax.Array:
    position = state.values[1] - state.idx + self.size
    return jnp.where(state.values[1] < 0, -1, position)

  @functools.partial(jax.jit, static_argnums=0)
  def stack_with_idx(self, state: CircularBufferState) -> Tuple[T, jax.Array]:
    """``(buffer, position)`` in slot order (see the module docstring)."""
    return state.values[0], self._positions(state)

  @functools.partial(jax.jit, static_argnums=0)
  def stack_reorder(self, state: CircularBufferState) -> Tuple[T, jax.Array]:
    """The buffer rolled oldest first, and the mask of filled slots in that order."""
    shift = -(state.idx % self.size)
    mask = jnp.roll(jnp.where(self._positions(state) < 0, 0, 1), shift)
    return jax.tree.map(lambda b: jnp.roll(b, shift, axis=0), state.values[0]), mask

  @functools.partial(jax.jit, static_argnums=0)
  def gather_from_present(self, state: CircularBufferState, idxs: jax.Array) -> T:
    """The values ``idxs`` insertions back (``-1``: the newest, ``-size``: the oldest kept)."""
    slots = (state.idx + idxs % self.size) % self.size
    return jax.tree.map(lambda b: b[slots], state.values[0])
