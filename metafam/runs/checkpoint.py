"""Atomic, self-describing checkpoints of pytrees whose loader cannot execute code.

Format ``metafam-checkpoint-v2``: one ``.npz`` file (a zip of ``.npy`` arrays, numpy's own format), written with
`metafam.io.atomic_write` (one file, so a crash never leaves a half-written checkpoint) and read with
``np.load(..., allow_pickle=False)``. Its members are

* ``metafam_header``: uint8 array of UTF-8 JSON ``{"format", "metadata", "structure", "leaves"}``:
  ``metadata`` is the caller's JSON (run config, step); ``structure`` describes the pytree as nested nodes
  ``{"kind": "leaf", "index": i}``, ``{"kind": "none"}``, ``{"kind": "dict", "keys", "children"}``,
  ``{"kind": "list" | "tuple", "children"}`` and ``{"kind": "namedtuple" | "node", "class", "module", "fields",
  "children"}`` (registered dataclasses such as `MetaTrainState`, optax states), children in JAX's flattening order;
  ``leaves[i]`` is ``{"dtype", "shape"}`` of leaf ``i`` (``"impl"`` too for typed PRNG keys).
* ``leaf_<i>``: leaf ``i``. numpy's own dtypes (bool, ints, floats, complex) are stored as they are; ml_dtypes
  (bfloat16, float8, int4, ...) as the unsigned int of the same width, viewed back by their recorded name; typed
  PRNG key arrays as ``jax.random.key_data``, rebuilt with ``jax.random.wrap_key_data`` and the recorded impl
  (`metafam.runs.checkpoint_leaves`).

Nothing in a file names code to run: class names are only compared, never imported. ``load(path, like=template)``
rebuilds the caller's own pytree type after checking that structure, shapes and dtypes match the template
(`CheckpointError` naming the first mismatching leaf path otherwise); ``load(path)`` without a template returns
plain containers (dataclass and namedtuple nodes become dicts of their fields) for inspection.

Why ``.npz``: numpy is already a core dependency, ``allow_pickle=False`` refuses object arrays, zip members carry
CRCs (corruption is detected), and the JSON header holds what the tree needs. safetensors would be a new dependency
whose string-only metadata would hold the same JSON anyway, and its dtype set does not cover every ml_dtype.

A pickle, which runs arbitrary code when loaded, is refused by every load path with a one-line error (recognised
by its bytes or its ``.pkl`` name; nothing is unpickled).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import Any, Dict, List, Optional, Tuple

import jax
import numpy as np

from metafam.io import atomic_write
from metafam.runs.checkpoint_leaves import decode_leaf, describe_spec, encode_leaf, extension_dtype, leaf_spec

FORMAT = "metafam-checkpoint-v2"
HEADER = "metafam_header"
_LEAF = "leaf_{}"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_PICKLE_SUFFIXES = (".pkl", ".pickle")


class CheckpointError(RuntimeError):
  """A checkpoint file is missing, corrupted, a pickle, or from a different run."""


@dataclasses.dataclass(frozen=True)
class Header:
  """The JSON header of a checkpoint: ``metadata``, the tree ``structure`` and per-leaf ``leaves`` specs."""
  metadata: Dict[str, Any]
  structure: Dict[str, Any]
  leaves: Tuple[Dict[str, Any], ...]

  @property
  def root_class(self) -> Optional[str]:
    """The class name of the root node (e.g. ``"MetaTrainState"``), None for plain containers."""
    return self.structure.get("class")


# -- reading ----------------------------------------------------------------------------------------------------------
def _looks_like_pickle(head: bytes, path: str) -> bool:
  """Pickle protocol 2+ starts with ``0x80 <protocol>``; older protocols are only recognised by the file name (a
  zip/npz file is never taken for a pickle, whatever its name)."""
  if head.startswith(_ZIP_MAGIC):
    return False
  return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or path.lower().endswith(_PICKLE_SUFFIXES)


def _read_magic(path: str) -> bytes:
  if not os.path.exists(path):
    raise CheckpointError(f"no checkpoint at {path}.")
  if not os.path.isfile(path):
    raise CheckpointError(f"checkpoint {path} is not a file.")
  with open(path, "rb") as f:
    return f.read(4)


# -- describing a pytree --------------------------------------------------------------------------------------------
def _entry(k: Any) -> Any:
  """The JSON name of one key-path entry: a dict key, a sequence index, or a field name."""
  for attr in ("key", "idx", "name"):
    if hasattr(k, attr):
      return getattr(k, attr)
  raise TypeError(f"unknown pytree key entry {k!r}")


def _child_path(path: str, kind: str, name: Any) -> str:
  if kind in ("namedtuple", "node") and isinstance(name, str):
    return f"{path}.{name}"
  return f"{path}[{name!r}]"


def _flatten(tree: Any) -> Tuple[Dict[str, Any], List[Tuple[str, Any]]]:
  """``(structure, [(path, leaf), ...])``: the JSON description of ``tree`` and its leaves in JAX's order."""
  leaves: List[Tuple[str, Any]] = []

  def walk(node: Any, path: str) -> Dict[str, Any]:
    if node is None:
      return {"kind": "none"}
    treedef = jax.tree.structure(node)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
      leaves.append((path, node))
      return {"kind": "leaf", "index": len(leaves) - 1}
    kids, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    names = [_entry(p[0]) for p, _ in kids]
    cls = type(node)
    if cls is dict:
      desc: Dict[str, Any] = {"kind": "dict", "keys": names}
    elif cls in (list, tuple):
      desc = {"kind": cls.__name__}
    else:
      kind = "namedtuple" if isinstance(node, tuple) and hasattr(node, "_fields") else "node"
      desc = {"kind": kind, "class": cls.__qualname__, "module": cls.__module__, "fields": names}
    for name in names:
      if isinstance(name, bool) or not isinstance(name, (str, int)):
        raise CheckpointError(f"cannot checkpoint {path or 'the tree'}: key {name!r} is not a str or int.")
    desc["children"] = [walk(child, _child_path(path, desc["kind"], name)) for name, (_, child) in zip(names, kids)]
    return desc

  return walk(tree, ""), leaves


def _leaf_paths(structure: Dict[str, Any]) -> List[str]:
  paths: List[str] = []

  def walk(node: Dict[str, Any], path: str) -> None:
    if node["kind"] == "leaf":
      paths.append(path)
    names = node.get("keys", node.get("fields", range(len(node.get("children", [])))))
    for name, child in zip(names, node.get("children", [])):
      walk(child, _child_path(path, node["kind"], name))

  walk(structure, "")
  return paths


def _label(node: Dict[str, Any]) -> str:
  kind = node["kind"]
  if kind in ("namedtuple", "node"):
    return f"a {node['class']} with fields {node['fields']}"
  if kind == "dict":
    return f"a dict with keys {node['keys']}"
  if kind in ("list", "tuple"):
    return f"a {kind} of {len(node['children'])}"
  return {"leaf": "an array", "none": "None"}[kind]


def _first_difference(got: Dict[str, Any], want: Dict[str, Any], path: str = "") -> Optional[str]:
  """Where two structures first differ (module names are not compared, so moved classes still match)."""
  same = {k: v for k, v in got.items() if k not in ("children", "index", "module")} == \
      {k: v for k, v in want.items() if k not in ("children", "index", "module")}
  if not same or len(got.get("children", [])) != len(want.get("children", [])):
    return f"at {path or 'the root'} the checkpoint holds {_label(got)}, expected {_label(want)}"
  names = got.get("keys", got.get("fields", range(len(got.get("children", [])))))
  for name, g, w in zip(names, got.get("children", []), want.get("children", [])):
    diff = _first_difference(g, w, _child_path(path, got["kind"], name))
    if diff:
      return diff
  return None


# -- the file -------------------------------------------------------------------------------------------------------
def save(path: str, tree: Any, metadata: Optional[Dict[str, Any]] = None) -> None:
  """Writes ``tree`` (leaves gathered to host) and JSON ``metadata`` to ``path`` atomically (format above)."""
  structure, leaves = _flatten(tree)
  specs, arrays = [], {}
  for i, (leaf_path, leaf) in enumerate(leaves):
    encoded = encode_leaf(leaf)
    if encoded is None:
      raise CheckpointError(f"cannot checkpoint leaf {leaf_path or '(root)'}: dtype {np.asarray(leaf).dtype} "
                            f"({type(leaf).__name__}) is not a numeric array type.")
    specs.append(encoded[0])
    arrays[_LEAF.format(i)] = encoded[1]
  try:
    text = json.dumps({"format": FORMAT, "metadata": dict(metadata or {}), "structure": structure,
                       "leaves": specs}, sort_keys=True)
  except (TypeError, ValueError) as e:
    raise TypeError(f"checkpoint metadata must be JSON-serializable: {e}") from None
  buf = io.BytesIO()
  np.savez(buf, **{HEADER: np.frombuffer(text.encode("utf-8"), np.uint8)}, **arrays)
  atomic_write(path, buf.getbuffer())


def _check_structure(node: Any, counter: List[int], depth: int = 0) -> None:
  """Validates a header's structure (leaf indices 0, 1, ... in order); raises ValueError if malformed."""
  if not isinstance(node, dict) or depth > 200:
    raise ValueError("a structure node is not an object")
  kind = node.get("kind")
  if kind == "leaf":
    if node.get("index") != counter[0]:
      raise ValueError("leaf indices out of order")
    counter[0] += 1
    return
  if kind == "none":
    return
  children = node.get("children")
  names = node.get({"dict": "keys", "namedtuple": "fields", "node": "fields"}.get(kind, ""), children)
  if kind in ("list", "tuple"):
    names = list(range(len(children))) if isinstance(children, list) else None
  if kind not in ("dict", "list", "tuple", "namedtuple", "node") or not isinstance(children, list) \
     or not isinstance(names, list) or len(names) != len(children):
    raise ValueError(f"bad structure node of kind {kind!r}")
  if kind in ("namedtuple", "node") and not (isinstance(node.get("class"), str)
                                             and isinstance(node.get("module"), str)):
    raise ValueError("a class node without a class name")
  if any(isinstance(n, bool) or not isinstance(n, (str, int)) for n in names):
    raise ValueError("a key is not a str or int")
  for child in children:
    _check_structure(child, counter, depth + 1)


def _parse_header(raw: np.ndarray) -> Header:
  if raw.dtype != np.uint8 or raw.ndim != 1:
    raise ValueError(f"header is {raw.dtype}{list(raw.shape)}, not uint8 bytes")
  doc = json.loads(raw.tobytes().decode("utf-8"))
  if not isinstance(doc, dict) or doc.get("format") != FORMAT:
    found = doc.get("format") if isinstance(doc, dict) else None
    raise CheckpointError(f"is not a {FORMAT} checkpoint (format {found!r})")
  metadata, structure, leaves = doc.get("metadata"), doc.get("structure"), doc.get("leaves")
  if not isinstance(metadata, dict) or not isinstance(leaves, list):
    raise ValueError("header lacks metadata or leaves")
  counter = [0]
  _check_structure(structure, counter)
  if counter[0] != len(leaves):
    raise ValueError(f"structure has {counter[0]} leaves, header lists {len(leaves)}")
  for spec in leaves:
    if not (isinstance(spec, dict) and isinstance(spec.get("dtype"), str) and isinstance(spec.get("shape"), list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in spec["shape"])
            and isinstance(spec.get("impl", ""), str)):
      raise ValueError(f"bad leaf spec {spec!r}")
  return Header(metadata=metadata, structure=structure, leaves=tuple(leaves))


def _read(path: str, with_leaves: bool) -> Tuple[Header, List[Any]]:
  """The header and (if asked) the decoded leaves; every problem is a one-line `CheckpointError`."""
  magic = _read_magic(path)
  if _looks_like_pickle(magic, path):
    raise CheckpointError(f"{path} is a pickle, not a {FORMAT} checkpoint; metafam does not load pickles because "
                          "unpickling can run arbitrary code.")
  if not magic.startswith(_ZIP_MAGIC):
    raise CheckpointError(f"checkpoint {path} is corrupted or not a metafam checkpoint "
                          f"({'empty file' if not magic else 'not an .npz file'}).")
  try:
    with np.load(path, allow_pickle=False) as npz:
      names = set(npz.files)
      if HEADER not in names:
        raise ValueError(f"no {HEADER} member")
      header = _parse_header(npz[HEADER])
      expected = {HEADER} | {_LEAF.format(i) for i in range(len(header.leaves))}
      if names != expected:
        raise ValueError(f"members {sorted(names - expected)[:3]} unexpected, {sorted(expected - names)[:3]} missing")
      leaves = [decode_leaf(spec, npz[_LEAF.format(i)]) for i, spec in enumerate(header.leaves)] if with_leaves \
          else []
  except CheckpointError as e:
    raise CheckpointError(f"{path} {e}") from None
  except Exception as e:  # truncated zip, bad CRC, bad JSON, object arrays, inconsistent header
    if "pickle" in str(e):
      raise CheckpointError(f"checkpoint {path} contains pickled object data, which metafam refuses to load.") \
          from None
    raise CheckpointError(f"checkpoint {path} is corrupted and cannot be read ({type(e).__name__}: {e}).") from None
  return header, leaves


def read_header(path: str) -> Header:
  """The header of the checkpoint at ``path`` (metadata and structure), without reading the arrays."""
  return _read(path, with_leaves=False)[0]


def read_metadata(path: str) -> Dict[str, Any]:
  """The metadata stored with the checkpoint at ``path``."""
  return read_header(path).metadata


def _plain(node: Dict[str, Any], leaves: List[Any]) -> Any:
  """The tree as plain containers: dicts, lists, tuples, None; class nodes become dicts of their fields."""
  kind = node["kind"]
  if kind == "leaf":
    return leaves[node["index"]]
  if kind == "none":
    return None
  children = [_plain(c, leaves) for c in node["children"]]
  if kind == "list":
    return children
  if kind == "tuple":
    return tuple(children)
  return dict(zip(node["keys"] if kind == "dict" else node["fields"], children))


def read(path: str) -> Tuple[Header, Any]:
  """``(header, tree)`` from one read of ``path``, the tree as plain containers (see `load` without a template)."""
  header, leaves = _read(path, with_leaves=True)
  return header, _plain(header.structure, leaves)


def check_finite(tree: Any, path: str, what: str = "meta-parameters") -> None:
  """Raises `CheckpointError` naming the first leaf of ``tree`` (read from ``path``) that holds a NaN or an infinity.

  Meta-parameters must be finite: a learned optimizer with a non-finite theta turns every update into NaN, so such a
  checkpoint is refused by every path that loads theta (resume, `evaluate --checkpoint`, `load_theta`) rather than
  used.
  """
  for key_path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    arr = np.asarray(leaf)
    if arr.dtype.kind in "fc" or extension_dtype(arr.dtype.name) is not None:
      values = arr.astype(np.float64) if arr.dtype.kind not in "fc" else arr
      bad = ~np.isfinite(values)
      if bad.any():
        kinds = " and ".join(k for k, m in (("NaN", np.isnan(values)), ("infinite", np.isinf(values))) if m.any())
        raise CheckpointError(f"checkpoint {path}: {what}{jax.tree_util.keystr(key_path)} holds {int(bad.sum())} "
                              f"{kinds} value(s) of {arr.size}; refusing to load non-finite meta-parameters (the "
                              "run that wrote it had diverged; resume from an earlier checkpoint).")


def load(path: str, like: Any = None) -> Tuple[Any, Dict[str, Any]]:
  """Returns ``(tree, metadata)``; raises `CheckpointError` with the reason if the file is unusable.

  With ``like`` (a pytree of arrays or ``jax.ShapeDtypeStruct``s), the tree is rebuilt with ``like``'s pytree types
  after checking that structure, shapes and dtypes match (the error names the first mismatching leaf); leaves are
  numpy arrays (typed PRNG keys: JAX key arrays). Without it, the tree comes back as plain containers: dicts,
  lists, tuples and None, with registered dataclasses and namedtuples as dicts of their fields.
  """
  header, leaves = _read(path, with_leaves=True)
  if like is None:
    return _plain(header.structure, leaves), header.metadata
  want, want_leaves = _flatten(like)
  diff = _first_difference(header.structure, want)
  if diff:
    raise CheckpointError(f"{path} holds a tree of a different structure: {diff}.")
  for leaf_path, got, (_, w) in zip(_leaf_paths(header.structure), header.leaves, want_leaves):
    expected = leaf_spec(w)
    if got["dtype"] != expected["dtype"] or got["shape"] != expected["shape"]:
      raise CheckpointError(f"checkpoint leaf {leaf_path or '(root)'} is {describe_spec(got)}, expected "
                            f"{describe_spec(expected)} ({path}).")
  return jax.tree.unflatten(jax.tree.structure(like), leaves), header.metadata
