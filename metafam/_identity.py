"""Caches keyed by an object's identity that never keep a dead object alive.

`IdentityCache` maps ``(object, hashable key)`` to a value built once (e.g. a compiled program). The object is held by
a weak reference where it supports one and its entries are dropped when it dies; objects that are not
weak-referenceable are held strongly (their ``id`` could otherwise be reused by a new object).

A cached value must not hold the object strongly itself, or the object lives as long as the cache: let it reach the
object through `held_weakly` instead.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Hashable, Optional


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
