"""`learned_optimization.tasks.parametric.cfgobject`: the reference's configuration objects and their features.

A configuration is a tree of `CFGObject` (``obj``: the name of a callable, ``kwargs``: its arguments, which may be
configurations themselves), `CFGNamed` (a named dict of values, for featurization only), `LogFeature` (a value
featurized by its log) and `DoNotFeaturize` (a value hidden from the features for some feature types). All four
are frozen dataclasses registered as pytrees whose names are static, so a sampled configuration can be vmapped.

* `object_from_config(cfg)` calls the named callables bottom-up; names are looked up in the ``registry`` you pass,
  then among the public callables of this compatibility package's ``tasks`` modules, then -- when your code has
  imported gin -- among gin's configurables, so classes a project marks ``@gin.configurable`` build as in the
  reference (metafam itself neither needs nor imports gin).
* `flatten_cfg` flattens a configuration to ``{"/path/of/keys": value}``; `featurize` turns it into key features
  (``int32[n, 8]``: a hash of each path segment, `hash_trick`), float features (``f32[n, 8]``) and int features
  (``int32[n]``), as the reference does; `featurize_many` pads several to one length with a mask.
* `serialize_cfg` / `deserialize_cfg` write and read a configuration as tagged JSON (the reference pickles;
  reading JSON cannot run code). Arrays become lists, as in the reference.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import logging
import sys
from typing import Any, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metafam._pytree import static_field

__all__ = ["LogFeature", "DoNotFeaturize", "CFGObject", "CFGNamed", "object_from_config", "serialize_cfg",
           "deserialize_cfg", "flatten_cfg", "hash_trick", "pad", "featurize_value", "featurize_cfg_path",
           "featurize", "featurize_many"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LogFeature:
  """A value featurized as its logarithm (`object_from_config` passes the value itself)."""
  value: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DoNotFeaturize:
  """A value left out of the features when the feature type is one of ``feature_types``."""
  value: Any
  feature_types: Sequence[str] = static_field()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CFGObject:
  """A call: the callable named ``obj`` with keyword arguments ``kwargs`` (configurations allowed)."""
  obj: str = static_field()
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __repr__(self) -> str:
    return f"CFGObject(obj='{self.obj}', kwargs={self.kwargs})"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CFGNamed:
  """Named values: the name is a path segment of the features; nothing is called."""
  name: str = static_field()
  values: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __repr__(self) -> str:
    return f"CFGNamed(obj={self.name}, kwargs={self.values})"


_CONFIGURABLE_MODULES = ("tasks.datasets.image", "tasks.datasets.language", "tasks.parametric.image_mlp",
                         "tasks.parametric.image_conv", "tasks.parametric.lm_rnn",
                         "tasks.parametric.lm_transformer", "tasks.parametric.vit",
                         "tasks.parametric.image_mlp_ae", "tasks.parametric.image_mlp_vae",
                         "tasks.parametric.image_resnet",
                         "tasks.parametric.parametric_utils", "tasks.quadratics", "tasks.task_augmentation",
                         "tasks.es_wrapper", "tasks.fixed.all", "tasks.parametric.lopt",
                         "tasks.parametric.lopt_trunc", "learned_optimizers.base", "learned_optimizers.mlp_lopt",
                         "learned_optimizers.adafac_mlp_lopt", "outer_trainers.truncation_schedule")


def _configurable(name: str) -> Any:
  for module in _CONFIGURABLE_MODULES:
    mod = importlib.import_module(f"metafam.compat.learned_optimization.{module}")
    fn = getattr(mod, name, None)
    if callable(fn) and not name.startswith("_"):
      return fn
  gin = sys.modules.get("gin")  # only when the caller's code uses gin: metafam does not import it
  if gin is not None:
    try:
      return gin.get_configurable(name)
    except ValueError:
      pass
  raise ValueError(f"CFGObject names {name!r}, which is no public callable of "
                   f"{', '.join(_CONFIGURABLE_MODULES)}{' nor a gin configurable' if gin is not None else ''}; "
                   f"pass registry={{name: callable}} to object_from_config.")


def object_from_config(cfg: Any, registry: Optional[Mapping[str, Any]] = None) -> Any:
  """Builds what ``cfg`` describes: `CFGObject` -> ``callable(**built kwargs)`` (the result gets ``.cfg = cfg``
  when it accepts attributes), `LogFeature` -> its value, anything else -> itself."""
  if isinstance(cfg, CFGObject):
    fn = registry[cfg.obj] if registry is not None and cfg.obj in registry else _configurable(cfg.obj)
    out = fn(**{k: object_from_config(v, registry) for k, v in cfg.kwargs.items()})
    try:
      out.cfg = cfg
    except AttributeError:
      pass
    return out
  if isinstance(cfg, LogFeature):
    return cfg.value
  return cfg


# -- serialization (tagged JSON) -----------------------------------------------------------------------------------
def _encode(x: Any) -> Any:
  if isinstance(x, CFGObject):
    return {"__cfg__": "CFGObject", "obj": x.obj, "kwargs": _encode(dict(x.kwargs))}
  if isinstance(x, CFGNamed):
    return {"__cfg__": "CFGNamed", "name": x.name, "values": _encode(dict(x.values))}
  if isinstance(x, LogFeature):
    return {"__cfg__": "LogFeature", "value": _encode(x.value)}
  if isinstance(x, DoNotFeaturize):
    return {"__cfg__": "DoNotFeaturize", "value": _encode(x.value), "feature_types": _encode(x.feature_types)}
  if isinstance(x, Mapping):
    if not all(isinstance(k, str) for k in x):
      raise TypeError(f"serialize_cfg needs string keys, got {list(x)}.")
    return {"__cfg__": "dict", "items": {k: _encode(v) for k, v in x.items()}}
  if isinstance(x, tuple):
    return {"__cfg__": "tuple", "items": [_encode(v) for v in x]}
  if isinstance(x, list):
    return [_encode(v) for v in x]
  if isinstance(x, (np.ndarray, jax.Array, np.generic)):
    return np.asarray(x).tolist()
  if x is None or isinstance(x, (bool, int, float, str)):
    return x
  raise TypeError(f"serialize_cfg cannot store a {type(x).__name__} ({x!r}).")


def _decode(x: Any) -> Any:
  if isinstance(x, list):
    return [_decode(v) for v in x]
  if not isinstance(x, dict):
    return x
  tag = x.get("__cfg__")
  if tag == "CFGObject":
    return CFGObject(x["obj"], _decode(x["kwargs"]))
  if tag == "CFGNamed":
    return CFGNamed(x["name"], _decode(x["values"]))
  if tag == "LogFeature":
    return LogFeature(_decode(x["value"]))
  if tag == "DoNotFeaturize":
    return DoNotFeaturize(_decode(x["value"]), _decode(x["feature_types"]))
  if tag == "dict":
    return {k: _decode(v) for k, v in x["items"].items()}
  if tag == "tuple":
    return tuple(_decode(v) for v in x["items"])
  raise ValueError(f"deserialize_cfg: unknown entry {x!r}.")


def serialize_cfg(cfg: Any) -> bytes:
  """``cfg`` as UTF-8 tagged JSON (arrays as nested lists)."""
  return json.dumps(_encode(cfg), allow_nan=False).encode("utf-8")


def deserialize_cfg(b: bytes) -> Any:
  """The configuration `serialize_cfg` wrote (no code is run; bad input raises ValueError)."""
  try:
    return _decode(json.loads(b))
  except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
    raise ValueError(f"deserialize_cfg: not a serialized configuration ({e}).") from None


# -- features ------------------------------------------------------------------------------------------------------
def flatten_cfg(cfg: Any, features_for: Any) -> Mapping[str, Any]:
  """``{path: value}`` for every leaf of ``cfg``: a path joins the keys and the ``obj``/``name`` of every
  configuration above a leaf with "/"; `LogFeature` leaves become their log; `DoNotFeaturize` leaves are dropped when
  ``features_for`` is one of their ``feature_types``."""
  out = {}
  stack = [("/", cfg)]
  while stack:
    path, x = stack.pop()
    if isinstance(x, Mapping):
      stack.extend((f"{path}/{k}", v) for k, v in x.items())
    elif isinstance(x, CFGObject):
      stack.append((f"{path}/{x.obj}", x.kwargs))
    elif isinstance(x, CFGNamed):
      stack.append((f"{path}/{x.name}", x.values))
    elif isinstance(x, DoNotFeaturize):
      if features_for not in x.feature_types:
        stack.append((path, x.value))
    elif isinstance(x, LogFeature):
      log = lambda v: jnp.log(v) if isinstance(v, (jax.Array, jax.core.Tracer)) else np.log(v)
      stack.append((path, jax.tree.map(log, x.value)))
    else:
      out[path] = x
  return out


def hash_trick(x: str) -> int:
  """An id in ``[0, 2**30)`` for ``x``: its MD5 digest modulo ``2 << 29``."""
  return int(hashlib.md5(x.encode("utf-8")).hexdigest(), 16) % (2 << 29)


def pad(x: Any, length: int = 8) -> jax.Array:
  """``x`` flattened, zero-padded or cut (with a logged warning) to ``length``."""
  x = jnp.ravel(jnp.asarray(x))
  if x.shape[0] > length:
    logging.getLogger(__name__).warning("configuration feature of length %d cut to %d", x.shape[0], length)
    return x[:length]
  return jnp.pad(x, (0, length - x.shape[0]))


def featurize_value(val: Any) -> Tuple[jax.Array, Any]:
  """(float features ``f32[8]``, int feature) of one value: strings -> hashed int; sequences, floats and arrays ->
  padded floats; ints -> the int; bools count as ints (checked in the reference's order)."""
  empty = jnp.zeros((8,))
  if isinstance(val, str):
    return empty, jnp.asarray(hash_trick(val))
  if isinstance(val, Sequence):
    return pad(val), 0
  if isinstance(val, (int, np.int32, np.int64)):
    return empty, jnp.asarray(val)
  if isinstance(val, (bool, np.bool_)):
    return pad(np.asarray(val, np.float32)), jnp.asarray(val, np.int32)
  if isinstance(val, (float, np.float32, jax.Array, np.ndarray)):
    return pad(val), 0
  raise NotImplementedError(f"featurize_value: cannot featurize a {type(val).__name__} ({val!r}).")


def featurize_cfg_path(path: str) -> jax.Array:
  """The hashed segments of ``path`` (empty segments skipped), padded to 8."""
  return pad(np.asarray([hash_trick(s) for s in path.split("/") if s]))


def featurize(cfg: Any, other_cfg: Any = None, feature_type: Any = None) -> Tuple[jax.Array, jax.Array, jax.Array]:
  """(key ids ``int[n, 8]``, float features ``f32[n, 8]``, int features ``int[n]``) of the ``n`` leaves of ``cfg``
  (and ``other_cfg``, whose leaves replace equal paths), sorted by path."""
  flat = dict(flatten_cfg(cfg, feature_type))
  if other_cfg:
    flat.update(flatten_cfg(other_cfg, feature_type))
  rows = [(featurize_cfg_path(k),) + featurize_value(v) for k, v in sorted(flat.items(), key=lambda kv: kv[0])]
  ids, floats, ints = zip(*rows)
  return jnp.asarray(ids), jnp.asarray(floats), jnp.asarray(ints)


def featurize_many(cfgs: Sequence[Any], max_length: Optional[int] = None, feature_type: Any = None
                   ) -> Tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """`featurize` of each config, zero-padded along the leaves to ``max_length`` (default: the longest), with a
  float mask ``[len(cfgs), max_length]`` of real leaves; ValueError when one has more than ``max_length``."""
  feats = [featurize(c, feature_type=feature_type) for c in cfgs]
  max_length = max(len(f[0]) for f in feats) if max_length is None else int(max_length)
  for f in feats:
    if len(f[0]) > max_length:
      raise ValueError(f"a configuration has {len(f[0])} features, more than max_length={max_length}.")
  grow = lambda a: jnp.concatenate([a, jnp.zeros((max_length - a.shape[0],) + a.shape[1:], a.dtype)], axis=0)
  masks = [np.arange(max_length) < len(f[0]) for f in feats]
  return tuple(jnp.asarray([grow(f[i]) for f in feats]) for i in range(3)) + (jnp.asarray(masks, np.float32),)
