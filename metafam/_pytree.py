"""Objects whose device arrays are pytree leaves: the engine objects pass themselves through `jax.jit`.

A `TruncatedStep` holds its datasets on the device, an estimator holds its step, `MetaTrainer` its estimators. As
pytrees whose leaves are exactly those arrays (``_data_fields``) and whose static part is the object itself, they are
arguments of their own jitted programs: the arrays enter the compiled program as inputs, not as baked-in constants,
and no ``data`` argument has to be threaded through every layer.

The static part is a `metafam._identity.IdentityKey` of the object: it compares by the object's identity, so every
call with the same object hits the same compiled program, and it holds the object weakly, so neither the object's
own programs nor JAX's global tracing caches (which keep the tree structures they have seen) keep the object and its
device data alive once its caller drops it.

Plain state records are frozen dataclasses registered with ``@jax.tree_util.register_dataclass``: their fields are
declared once, as dataclass fields, leaves in declaration order, with the static ones marked by `static_field`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import jax

from metafam._identity import IdentityKey


def static_field(**kwargs: Any) -> Any:
  """A dataclass field that ``jax.tree_util.register_dataclass`` treats as static (part of the treedef and of
  `jax.jit`'s cache key, not a leaf): ``dataclasses.field(metadata={"static": True}, **kwargs)``. Its values must be
  hashable."""
  return dataclasses.field(metadata={"static": True}, **kwargs)


class DataPytree:
  """Base for objects that are pytrees with the attributes named in ``_data_fields`` as children.

  Every subclass is registered when it is defined. Flattening yields those attributes (each itself a pytree: arrays,
  dicts of arrays, other `DataPytree` objects, or None); unflattening builds a shallow copy of the original object
  with the attributes replaced (inside `jax.jit`: by tracers), while the original is alive; the copy is a new object
  with a static part of its own. Attributes must not change after construction (its own programs, `own_program`,
  are added on first use).
  """

  _data_fields: Tuple[str, ...] = ()

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    jax.tree_util.register_pytree_node(cls, cls._tree_flatten, cls._tree_unflatten)

  def _tree_flatten(self):
    static = self.__dict__.get("_pytree_static")
    if static is None:
      static = self.__dict__["_pytree_static"] = IdentityKey(self)
    return tuple(getattr(self, name) for name in self._data_fields), static

  @classmethod
  def _tree_unflatten(cls, static: IdentityKey, children):
    owner = static.value
    if owner is None:
      raise ReferenceError(f"cannot rebuild a {cls.__name__} from a tree structure whose object has been "
                           "garbage-collected; flatten a live one.")
    obj = object.__new__(cls)
    obj.__dict__.update(owner.__dict__)
    obj.__dict__.pop("_pytree_static", None)  # the copy is keyed by its own identity
    obj.__dict__.update(zip(cls._data_fields, children))
    return obj
