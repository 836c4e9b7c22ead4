"""Reading and writing flax's msgpack checkpoints (``flax.serialization.to_bytes``), the format of
google/learned_optimization's ``checkpoints.save_state`` and of every published LO-era learned optimizer (VeLO's
``theta.state`` / ``params`` files), without flax and without running code.

The format: one msgpack document holding flax's *state dict* of the tree: dicts with their keys as strings, lists,
tuples and namedtuples as dicts (``{"0": ..., "1": ...}``, namedtuples and dataclasses by field name), arrays as
msgpack extension type 1 (the msgpack of ``(shape, dtype name, C-order bytes)``), numpy scalars as extension type 3
(the same, 0-d) and Python complex numbers as extension type 2; Python ints, floats, strings, bools and None are
msgpack's own. Arrays over 2**30 bytes are split into ``{"__msgpack_chunked_array__": True, "shape", "chunks"}``.

Why it is safe: msgpack is data. The decoder builds only dicts, lists, strings, numbers and, through the extension
hook here, numpy arrays of numeric dtypes (booleans, integers, floats, complex, and ml_dtypes such as bfloat16 by
their names) whose byte count must equal their shape's; any other extension type, dtype or a malformed header is a
`CheckpointError`. Nothing names a class to build: `load` rebuilds the caller's own tree type from a template.

Why a dependency, and why optional: parsing msgpack by hand would be a second, less tested parser; the `msgpack`
package is small, pure data, and what flax itself uses. metafam's own checkpoints are ``.npz`` files
(`metafam.runs.checkpoint`), so only this format needs it: install it with ``pip install
'metafam[msgpack]'``; without it, reading or writing such a file raises an ImportError saying so.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Dict, Optional

import jax
import numpy as np

from metafam.io import atomic_write
from metafam.runs.checkpoint import CheckpointError
from metafam.runs.checkpoint_leaves import extension_dtype

MAX_CHUNK_BYTES = 2 ** 30  # flax splits arrays above this size
_CHUNKED = "__msgpack_chunked_array__"
_EXT_NDARRAY, _EXT_COMPLEX, _EXT_NPSCALAR = 1, 2, 3
# A msgpack document starts with a map (a state dict): fixmap 0x80-0x8f, map16 0xde or map32 0xdf.
_MAP_FIRST_BYTES = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


def _msgpack():
  try:
    return importlib.import_module("msgpack")
  except ImportError:
    raise ImportError("reading or writing flax-msgpack checkpoints (learned_optimization's format) needs the "
                      "optional package msgpack: pip install 'metafam[msgpack]' (or pip install msgpack).") from None


def looks_like_msgpack(path: str) -> bool:
  """Whether the file at ``path`` starts like a msgpack map (a flax state dict); reads two bytes.

  A pickle (protocol 2+) starts with 0x80, an empty fixmap; an empty map followed by more bytes is no state dict,
  so such a file is not taken for one (and stays refused by the pickle checks).
  """
  with open(path, "rb") as f:
    head = f.read(2)
  return bool(head) and head[0] in _MAP_FIRST_BYTES and not (head[0] == 0x80 and len(head) > 1)


# -- state dicts --------------------------------------------------------------------------------------------------
def to_state_dict(tree: Any) -> Any:
  """flax's state dict of ``tree``: containers become string-keyed dicts, arrays numpy arrays, other leaves kept."""
  if isinstance(tree, dict):
    keys = [str(k) for k in tree]
    if len(set(keys)) != len(keys):
      raise ValueError(f"dict keys {list(tree)} do not have distinct string forms.")
    return {str(k): to_state_dict(v) for k, v in tree.items()}
  if isinstance(tree, tuple) and hasattr(tree, "_fields"):
    return {f: to_state_dict(getattr(tree, f)) for f in tree._fields}
  if isinstance(tree, (list, tuple)):
    return {str(i): to_state_dict(v) for i, v in enumerate(tree)}
  if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
    return {f.name: to_state_dict(getattr(tree, f.name)) for f in dataclasses.fields(tree)}
  if isinstance(tree, jax.Array):
    return np.asarray(tree)
  return tree


def _key_name(entry: Any) -> str:
  for attr in ("key", "idx", "name"):  # DictKey, SequenceKey, GetAttrKey
    if hasattr(entry, attr):
      return str(getattr(entry, attr))
  raise CheckpointError(f"cannot map tree entry {entry!r} to a flax state-dict key.")


def restore(like: Any, state_dict: Any, where: str = "") -> Any:
  """The leaves of ``state_dict`` at ``like``'s key paths, in ``like``'s tree type (``like``'s values unused).

  Array leaves must have ``like``'s shapes; they keep their stored dtype (as flax returns them). A missing entry or
  a different shape is a `CheckpointError` naming the path.
  """
  path_leaves, treedef = jax.tree_util.tree_flatten_with_path(like)
  out = []
  for key_path, want in path_leaves:
    node, name = state_dict, ""
    for entry in key_path:
      key = _key_name(entry)
      name += f"/{key}"
      if not isinstance(node, dict) or key not in node:
        raise CheckpointError(f"{where}: the file has no entry {name} (the template's tree differs from the stored "
                              f"one; stored keys there: {sorted(node) if isinstance(node, dict) else type(node)}).")
      node = node[key]
    if hasattr(want, "shape") and np.shape(node) != tuple(want.shape):
      raise CheckpointError(f"{where}: entry {name or '(root)'} has shape {np.shape(node)}, the template "
                            f"{tuple(want.shape)}.")
    out.append(node)
  return jax.tree_util.tree_unflatten(treedef, out)


# -- bytes ----------------------------------------------------------------------------------------------------------
def _array_dtype(name: str) -> np.dtype:
  ext = extension_dtype(name)
  if ext is not None:
    return ext
  try:
    dtype = np.dtype(name)
  except TypeError:
    dtype = None
  if dtype is None or dtype.kind not in "biufc" or dtype.name != name:
    raise CheckpointError(f"array of dtype {name!r}: only boolean, integer, float and complex dtypes (and ml_dtypes "
                          "such as bfloat16) are read.")
  return dtype


def _decode_array(data: bytes) -> np.ndarray:
  header = _msgpack().unpackb(data, raw=True)
  if not (isinstance(header, list) and len(header) == 3 and isinstance(header[0], list)
          and isinstance(header[1], bytes) and isinstance(header[2], bytes)):
    raise CheckpointError("malformed array record (expected [shape, dtype name, bytes]).")
  shape, name, buffer = header
  if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
    raise CheckpointError(f"malformed array shape {shape!r}.")
  dtype = _array_dtype(name.decode("ascii", "replace"))
  if len(buffer) != math.prod(shape) * dtype.itemsize:
    raise CheckpointError(f"array of shape {tuple(shape)} and dtype {dtype.name} needs "
                          f"{math.prod(shape) * dtype.itemsize} bytes, the record holds {len(buffer)}.")
  return np.frombuffer(buffer, dtype=dtype).reshape(shape).copy()


def _ext_hook(code: int, data: bytes) -> Any:
  if code == _EXT_NDARRAY:
    return _decode_array(data)
  if code == _EXT_NPSCALAR:
    return _decode_array(data)[()]
  if code == _EXT_COMPLEX:
    pair = _msgpack().unpackb(data)
    if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) for x in pair)):
      raise CheckpointError("malformed complex-number record.")
    return complex(pair[0], pair[1])
  raise CheckpointError(f"unknown msgpack extension type {code} (flax writes 1, 2 and 3).")


def _unchunk(node: Any) -> Any:
  if not isinstance(node, dict):
    return node
  if node.get(_CHUNKED) is True:
    try:
      shape = tuple(node["shape"][str(i)] for i in range(len(node["shape"])))
      flat = np.concatenate([node["chunks"][str(i)] for i in range(len(node["chunks"]))])
      return flat.reshape(shape)
    except (KeyError, TypeError, ValueError) as e:
      raise CheckpointError(f"malformed chunked array: {e}.") from None
  return {k: _unchunk(v) for k, v in node.items()}


def decode(data: bytes, where: str = "bytes") -> Any:
  """The state dict in flax-msgpack ``data``; `CheckpointError` saying what is wrong for anything else."""
  msgpack = _msgpack()
  try:
    tree = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False)
  except CheckpointError as e:
    raise CheckpointError(f"{where} is not a readable flax-msgpack checkpoint: {e}") from None
  except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as e:  # ExtraData, FormatError, ...
    raise CheckpointError(f"{where} is not a flax-msgpack checkpoint ({type(e).__name__}: {e}).") from None
  return _unchunk(tree)


def _ext_default(x: Any) -> Any:
  msgpack = _msgpack()
  record = lambda a: msgpack.packb((a.shape, a.dtype.name, a.tobytes("C")), use_bin_type=True)  # noqa: E731
  if isinstance(x, (np.ndarray, jax.Array)):
    return msgpack.ExtType(_EXT_NDARRAY, record(np.asarray(x)))
  if isinstance(x, np.generic):
    return msgpack.ExtType(_EXT_NPSCALAR, record(np.asarray(x)))
  if isinstance(x, complex):
    return msgpack.ExtType(_EXT_COMPLEX, msgpack.packb((x.real, x.imag)))
  raise TypeError(f"cannot write a leaf of type {type(x).__name__} to a flax-msgpack checkpoint.")


def _check_array(x: np.ndarray) -> np.ndarray:
  if x.dtype.kind not in "biufc" and extension_dtype(x.dtype.name) is None:
    raise ValueError(f"cannot write an array of dtype {x.dtype} (numeric dtypes only).")
  if x.nbytes > MAX_CHUNK_BYTES:
    chunk = max(1, MAX_CHUNK_BYTES // x.dtype.itemsize)
    flat = x.reshape(-1)
    return {_CHUNKED: True, "shape": {str(i): d for i, d in enumerate(x.shape)},
            "chunks": {str(i): flat[s:s + chunk] for i, s in enumerate(range(0, flat.size, chunk))}}
  return x


def encode(tree: Any) -> bytes:
  """``flax.serialization.to_bytes(tree)``: the msgpack of `to_state_dict` ``(tree)``."""
  def prepare(node):
    if isinstance(node, dict):
      return {k: prepare(v) for k, v in node.items()}
    return _check_array(np.asarray(node)) if isinstance(node, (np.ndarray, jax.Array)) else node
  return _msgpack().packb(prepare(to_state_dict(tree)), default=_ext_default, strict_types=True)


def save(path: str, tree: Any) -> None:
  """Writes ``tree`` to ``path`` in flax's format, atomically."""
  atomic_write(path, encode(tree))


def load(path: str, like: Optional[Any] = None) -> Any:
  """The tree stored at ``path``: its state dict (plain dicts, numpy arrays) or, with ``like``, `restore` ``(like,
  ...)``."""
  with open(path, "rb") as f:
    state_dict = decode(f.read(), where=path)
  return state_dict if like is None else restore(like, state_dict, where=path)


def plain_theta(state_dict: Dict[str, Any]) -> Any:
  """The meta-parameters in a learned_optimization parameter file: ``params`` of a ``ParameterCheckpoint``
  (``{"params", "gen_id", "step"}``), item ``"0"`` of the ``(theta, gen_id, step)`` tuple VeLO's loader reads,
  else the whole tree."""
  if isinstance(state_dict, dict) and {"params", "gen_id", "step"} <= set(state_dict):
    return state_dict["params"]
  if isinstance(state_dict, dict) and set(state_dict) == {"0", "1", "2"} and isinstance(state_dict["1"], str):
    return state_dict["0"]
  return state_dict
