"""Compiled programs and caches keyed by an object's identity that never keep a dead object alive.

The one policy for compiled programs. A program built for one object lives on that object: `own_program` builds it
on first use and keeps it in the object's ``__dict__``, so it dies with the object (`TruncatedStep`'s unroll and
init, every estimator's estimate, `MetaTrainer`'s step). The object is an argument of its own program as a
`metafam._pytree.DataPytree` whose static part is an `IdentityKey` of it, so every call with it hits the same
compiled program and no cache keeps it alive. A program shared across objects is keyed by the identity of the
objects it was built for, held weakly, through one of these two:

* `IdentityKey`: a static argument of a module-level `jax.jit` (`metafam.inner.runner`), so jit's own bounded
  cache serves every (task, optimizer) pair without keeping either alive;
* `IdentityCache`: ``(object, hashable key) -> value`` built once (e.g. an evaluator's programs per learned
  optimizer); an object's entries are dropped when it dies.

Objects that are not weak-referenceable are held strongly (their ``id`` could otherwise be reused by a new object).

A cached value must not hold the object strongly itself, or the object lives as long as the cache: let it reach the
object through `held_weakly` instead.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Hashable, Optional


def own_program(obj: Any, name: str, build: Callable[[], Any]) -> Any:
  """``obj``'s program ``name`` (e.g. a `jax.jit` of one of its class's functions), built by ``build()`` on first use
  and kept in ``obj.__dict__[name]``, so it dies with ``obj``."""
  program = obj.__dict__.get(name)
  if program is None:
    program = obj.__dict__[name] = build()
  return program


def held_weakly(obj: Any, on_death: Optional[Callable[[Any], None]] = None) -> Callable[[], Any]:
  """``weakref.ref(obj, on_death)``, or a strong reference for objects that are not weak-referenceable."""
  try:
    return weakref.ref(obj, on_death)
  except TypeError:  # e.g. __slots__ without __weakref__
    return lambda: obj


class IdentityCache:
  """``{(object identity, key): value}``; an object's values are dropped when it is garbage-collected."""

  def __init__(self):
    self._entries: Dict[int, tuple] = {}  # id(obj) -> (reference to obj, {key: value})

  def get(self, obj: Any, key: Hashable, build: Callable[[], Any]) -> Any:
    """The value cached for ``(obj, key)``, built by ``build()`` the first time."""
    entry = self._entries.get(id(obj))
    if entry is None or entry[0]() is not obj:
      entry = (held_weakly(obj, self._dropper(id(obj))), {})
      self._entries[id(obj)] = entry
    values = entry[1]
    if key not in values:
      values[key] = build()
    return values[key]

  def _dropper(self, ident: int) -> Callable[[Any], None]:
    entries = self._entries  # not self: the callback must not keep the cache alive

    def drop(ref):
      entry = entries.get(ident)
      if entry is not None and entry[0] is ref:
        del entries[ident]
    return drop

  def __len__(self) -> int:
    """The number of live objects with cached values."""
    return sum(entry[0]() is not None for entry in self._entries.values())


class IdentityKey:
  """A static-argument key that hashes and compares by the identity of the wrapped object (a task, an optimizer, a
  `metafam._pytree.DataPytree` as its static part).

  The object is held through a weak reference where it supports one, so `jax.jit`'s cache does not keep every task
  and optimizer ever trained (with their datasets) alive. A cache entry whose object has died never matches again,
  not even a new object that reuses its ``id``; the entry is dropped by jit's bounded cache in due course.
  """
  __slots__ = ("_ref", "_id")

  def __init__(self, value: Any):
    self._id = id(value)
    self._ref = held_weakly(value)

  @property
  def value(self) -> Any:
    return self._ref()  # alive whenever a program is traced: the caller holds it

  def __hash__(self) -> int:
    return self._id

  def __eq__(self, other: Any) -> bool:
    if not isinstance(other, IdentityKey) or other._id != self._id:
      return False
    mine = self._ref()
    return mine is not None and other._ref() is mine
