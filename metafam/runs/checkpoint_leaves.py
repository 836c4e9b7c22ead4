"""How a checkpoint stores one leaf, and the header's ``{"dtype", "shape"}`` spec of it.

numpy's own dtypes (bool, ints, floats, complex) are stored as they are; ml_dtypes (bfloat16, float8, int4, ...) as
the unsigned int of the same width, viewed back by their recorded name (`extension_dtype`, which
`metafam.compat.flax_msgpack` reads its dtypes by too); typed PRNG key arrays as ``jax.random.key_data``, rebuilt
with ``jax.random.wrap_key_data`` and the recorded impl. `encode_leaf` and `decode_leaf` are the two directions;
the file around them is `metafam.runs.checkpoint`'s.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

_NATIVE = {np.dtype(t).name: np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                                     np.uint16, np.uint32, np.uint64, np.float16, np.float32,
                                                     np.float64, np.complex64, np.complex128)}


def _is_key(x: Any) -> bool:
  return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def leaf_spec(x: Any) -> Dict[str, Any]:
  """``{"dtype", "shape"}`` of a leaf (array, ShapeDtypeStruct or scalar) as the header records it."""
  if not hasattr(x, "dtype") or not hasattr(x, "shape"):
    x = np.asarray(x)
  return {"dtype": str(x.dtype) if _is_key(x) else np.dtype(x.dtype).name, "shape": [int(d) for d in x.shape]}


def describe_spec(spec: Dict[str, Any]) -> str:
  """A spec as text, e.g. ``float32[3, 4]``."""
  return f"{spec['dtype']}{spec['shape']}"


def extension_dtype(name: str) -> Optional[np.dtype]:
  """An ml_dtypes dtype (bfloat16, float8_*, int4, ...) by name; None for anything else."""
  if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
    return None
  scalar = getattr(ml_dtypes, name, None)
  if not isinstance(scalar, type) or not issubclass(scalar, np.generic):
    return None
  dtype = np.dtype(scalar)
  return dtype if dtype.kind == "V" and not dtype.hasobject else None


def encode_leaf(x: Any) -> Optional[Tuple[Dict[str, Any], np.ndarray]]:
  """``(spec, stored array)`` of one leaf; None if its dtype is not a numeric array type."""
  if _is_key(x):
    return dict(leaf_spec(x), impl=str(jax.random.key_impl(x))), np.asarray(jax.random.key_data(x))
  arr = np.asarray(x)
  name = arr.dtype.name
  if name in _NATIVE:
    arr = arr.astype(_NATIVE[name], copy=False)  # native byte order
    return leaf_spec(arr), arr
  if extension_dtype(name) == arr.dtype:
    return leaf_spec(arr), np.asarray(arr, order="C").view(np.dtype(f"u{arr.dtype.itemsize}"))
  return None


def decode_leaf(spec: Dict[str, Any], stored: np.ndarray) -> Any:
  """The leaf from its stored array; raises ValueError if they do not agree."""
  shape = tuple(spec["shape"])
  if "impl" in spec:
    if stored.dtype != np.uint32 or stored.shape[:len(shape)] != shape:
      raise ValueError(f"key data {stored.dtype}{list(stored.shape)} does not fit keys of shape {list(shape)}")
    key = jax.random.wrap_key_data(jnp.asarray(stored), impl=spec["impl"])
    if str(key.dtype) != spec["dtype"]:
      raise ValueError(f"key impl {spec['impl']!r} gives {key.dtype}, recorded {spec['dtype']}")
    return key
  dtype = _NATIVE.get(spec["dtype"])
  if dtype is None:
    dtype = extension_dtype(spec["dtype"])
    if dtype is None:
      raise ValueError(f"unknown dtype {spec['dtype']!r}")
    want_stored = np.dtype(f"u{dtype.itemsize}")
  else:
    want_stored = dtype
  if stored.dtype != want_stored or stored.shape != shape:
    raise ValueError(f"stored {stored.dtype}{list(stored.shape)} does not match the header's "
                     f"{spec['dtype']}{list(shape)}")
  return stored if dtype == want_stored else stored.view(dtype)
