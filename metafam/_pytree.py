"""Objects whose device arrays are pytree leaves: the engine objects pass themselves through `jax.jit`.

A `TruncatedStep` holds its datasets on the device, an estimator holds its step, `MetaTrainer` its estimators. As
pytrees whose leaves are exactly those arrays (``_data_fields``) and whose static part is the object itself, they are
arguments of their own jitted programs: the arrays enter the compiled program as inputs, not as baked-in constants,
and no ``data`` argument has to be threaded through every layer.

The static part is a token that compares by the identity of the original object, so every call with the same object
hits the same compiled program. The token holds the object; it lives in the caches of the object's own jitted
functions, so it dies with the object (the cycle is collected).

Plain state records are frozen dataclasses registered with ``@jax.tree_util.register_dataclass``: their fields are
declared once, as dataclass fields, leaves in declaration order, with the static ones marked by `static_field`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import jax


def static_field(**kwargs: Any) -> Any:
  """A dataclass field that ``jax.tree_util.register_dataclass`` treats as static (part of the treedef and of
  `jax.jit`'s cache key, not a leaf): ``dataclasses.field(metadata={"static": True}, **kwargs)``. Its values must be
  hashable."""
  return dataclasses.field(metadata={"static": True}, **kwargs)


class _Static:
  """The static part of a `DataPytree`: the original object, compared by identity."""
  __slots__ = ("owner",)

  def __init__(self, owner: Any):
    self.owner = owner

  def __hash__(self) -> int:
    return id(self.owner)

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, _Static) and other.owner is self.owner


class DataPytree:
  """Base for objects that are pytrees with the attributes named in ``_data_fields`` as children.

  Every subclass is registered when it is defined. Flattening yields those attributes (each itself a pytree: arrays,
  dicts of arrays, other `DataPytree` objects, or None); unflattening builds a shallow copy of the original object
  with the attributes replaced (inside `jax.jit`: by tracers). Attributes must not change after construction.
  """

  _data_fields: Tuple[str, ...] = ()

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    jax.tree_util.register_pytree_node(cls, cls._tree_flatten, cls._tree_unflatten)

  def _tree_flatten(self):
    static = self.__dict__.get("_pytree_static")
    if static is None:
      static = self.__dict__["_pytree_static"] = _Static(self)
    return tuple(getattr(self, name) for name in self._data_fields), static

  @classmethod
  def _tree_unflatten(cls, static: _Static, children):
    obj = object.__new__(cls)
    obj.__dict__.update(static.owner.__dict__)
    obj.__dict__.update(zip(cls._data_fields, children))
    return obj
