"""Task-family configurations as plain data, and mixtures of families for meta-training.

A `FamilySpec` names a family kind, its constructor kwargs and a chain of augmentations; it round-trips through
JSON and rebuilds the family with ``build()``::

  spec = FamilySpec("image_mlp", {"hidden_sizes": (32,), "image_size": 8}).augment("reparam", log_scale_range=(-1, 1))
  family = FamilySpec.from_json(spec.to_json()).build()   # ReparamFamily(ImageMLPFamily(...))

The tables of kinds and augmentations live in `metafam.taskfamilies.registry` (`FAMILY_KINDS`, `AUGMENTATIONS`);
``build(kinds=..., augmentations=...)`` accepts extended tables. `FamilyMixture` picks which family of a set to run
next, host-side, with given weights.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

import jax
import numpy as np

from metafam._registry import lookup
from metafam.taskfamilies.base import TaskFamily
from metafam.taskfamilies.registry import AUGMENTATIONS, FAMILY_KINDS, LazyConstructor


def _plain(value: Any, where: str) -> Any:
  """``value`` as canonical JSON-able data: lists become tuples, dict keys must be strings, numpy scalars unboxed."""
  if isinstance(value, np.generic):
    value = value.item()
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (list, tuple)):
    return tuple(_plain(v, where) for v in value)
  if isinstance(value, Mapping):
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
      raise TypeError(f"{where}: dict keys must be strings, got {bad!r}.")
    return {k: _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
  raise TypeError(f"{where} must be plain data (None, bool, int, float, str, lists, dicts), got "
                  f"{type(value).__name__}: {value!r}.")


def _json_ready(value: Any) -> Any:
  if isinstance(value, tuple):
    return [_json_ready(v) for v in value]
  if isinstance(value, dict):
    return {k: _json_ready(v) for k, v in value.items()}
  return value


def _accepted_params(ctor: Callable, skip: int) -> Tuple[Tuple[str, ...], bool]:
  """The keyword names ``ctor`` accepts after ``skip`` leading positional ones, and whether it takes ``**kwargs``."""
  target = ctor.load() if isinstance(ctor, LazyConstructor) else ctor
  params = list(inspect.signature(target).parameters.values())[skip:]
  names = tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
  return names, any(p.kind == p.VAR_KEYWORD for p in params)


def _call(what: str, name: str, table: Mapping[str, Callable], kwargs: Mapping[str, Any], *args) -> Any:
  ctor = lookup(table, name, what)
  accepted, var_kw = _accepted_params(ctor, skip=len(args))
  unknown = sorted(set(kwargs) - set(accepted))
  if unknown and not var_kw:
    raise ValueError(f"{what} {name!r} got unknown kwargs {unknown}; accepted kwargs: {', '.join(accepted)}.")
  try:
    return ctor(*args, **kwargs)
  except (TypeError, ValueError) as e:
    raise type(e)(f"building {what} {name!r} with kwargs {dict(kwargs)}: {e}") from e


Augmentation = Tuple[str, Dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class FamilySpec:
  """A task family as plain data: ``kind`` (a key of `FAMILY_KINDS`), constructor ``kwargs`` and ``augmentations``.

  Attributes:
    kind: the family constructor's name, e.g. "image_mlp"; "task" wraps a registered task by ``name``,
      "registered" builds a registered family by ``name``.
    kwargs: the constructor's keyword arguments, plain data only (lists are stored as tuples).
    augmentations: ``(name, kwargs)`` pairs (or bare names) applied in order, each wrapping the family built so far
      (keys of `AUGMENTATIONS`, e.g. ``("reparam", {"log_scale_range": (-1, 1)})``).

  Values are canonicalized on construction, so ``FamilySpec.from_json(spec.to_json()) == spec``. Kinds and kwarg
  names are checked by `build`, which raises ValueError listing the accepted ones.
  """
  kind: str
  kwargs: Dict[str, Any] = dataclasses.field(default_factory=dict)
  augmentations: Tuple[Augmentation, ...] = ()

  def __post_init__(self):
    if not isinstance(self.kind, str):
      raise TypeError(f"FamilySpec.kind must be a string, got {self.kind!r}.")
    object.__setattr__(self, "kwargs", _plain(dict(self.kwargs), f"FamilySpec({self.kind!r}).kwargs"))
    augs = []
    for i, a in enumerate(self.augmentations):
      name, kw = None, None
      if isinstance(a, str):
        name, kw = a, {}
      elif isinstance(a, (tuple, list)) and len(a) == 2:
        name, kw = a
      if not isinstance(name, str) or not isinstance(kw, Mapping):
        raise TypeError(f"FamilySpec augmentation {i} must be a name or a (name, kwargs) pair, got {a!r}.")
      augs.append((name, _plain(dict(kw), f"augmentation {name!r} kwargs")))
    object.__setattr__(self, "augmentations", tuple(augs))

  def __hash__(self) -> int:
    return hash(self.to_json())

  def augment(self, name: str, **kwargs) -> "FamilySpec":
    """A copy with augmentation ``name(**kwargs)`` appended (applied last, i.e. outermost)."""
    return dataclasses.replace(self, augmentations=self.augmentations + ((name, kwargs),))

  def to_dict(self) -> dict:
    return {"kind": self.kind, "kwargs": _json_ready(self.kwargs),
            "augmentations": [[name, _json_ready(kw)] for name, kw in self.augmentations]}

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> "FamilySpec":
    extra = sorted(set(data) - {"kind", "kwargs", "augmentations"})
    if "kind" not in data or extra:
      raise ValueError(f"a FamilySpec dict needs 'kind' and may have 'kwargs', 'augmentations'; got keys "
                       f"{sorted(data)}.")
    return cls(data["kind"], data.get("kwargs", {}), tuple(data.get("augmentations", ())))

  def to_json(self, indent: Optional[int] = None) -> str:
    return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "FamilySpec":
    return cls.from_dict(json.loads(text))

  def build(self, kinds: Optional[Mapping[str, Callable]] = None,
            augmentations: Optional[Mapping[str, Callable]] = None) -> TaskFamily:
    """Constructs the family and applies the augmentations in order (tables default to the module's)."""
    family = _call("family kind", self.kind, FAMILY_KINDS if kinds is None else kinds, self.kwargs)
    for name, kw in self.augmentations:
      family = _call("augmentation", name, AUGMENTATIONS if augmentations is None else augmentations, kw, family)
    return family

  def __str__(self) -> str:
    return f"FamilySpec({self.to_json()})"


class FamilyMixture:
  """A set of families and weights; `sample_family` picks, host-side, which family to run next.

  Families have different shapes, so each runs as its own (vmapped, compiled) program; the mixture only chooses
  among them. Draws are deterministic given the seed, Generator or key.

  Args:
    specs_or_families: `FamilySpec`s (built on construction), spec dicts, or `TaskFamily` objects.
    weights: nonnegative, not all zero, one per family; normalized to probabilities. Default: uniform.
  """

  def __init__(self, specs_or_families: Sequence[Union[FamilySpec, Mapping, TaskFamily]],
               weights: Optional[Sequence[float]] = None):
    items = list(specs_or_families)
    if not items:
      raise ValueError("FamilyMixture needs at least one family.")
    self.specs, self.families = [], []
    for i, item in enumerate(items):
      if isinstance(item, Mapping):
        item = FamilySpec.from_dict(item)
      if isinstance(item, FamilySpec):
        self.specs.append(item)
        self.families.append(item.build())
      elif isinstance(item, TaskFamily):
        self.specs.append(None)
        self.families.append(item)
      else:
        raise TypeError(f"FamilyMixture item {i} must be a FamilySpec, a spec dict or a TaskFamily, "
                        f"got {type(item).__name__}.")
    w = np.ones(len(items)) if weights is None else np.asarray(weights, np.float64)
    if w.shape != (len(items),) or not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
      raise ValueError(f"weights must be {len(items)} finite nonnegative numbers, not all zero; got {weights!r}.")
    self.weights = w / w.sum()
    self._support = np.flatnonzero(self.weights > 0)
    cdf = np.cumsum(self.weights[self._support])
    self._cdf = cdf / cdf[-1]

  def __len__(self) -> int:
    return len(self.families)

  def __getitem__(self, index: int) -> TaskFamily:
    return self.families[index]

  @property
  def names(self) -> Tuple[str, ...]:
    return tuple(f.name for f in self.families)

  def index_from_uniform(self, u: float) -> int:
    """The family whose CDF interval holds ``u`` in [0, 1) (zero-weight families are never chosen)."""
    i = min(int(np.searchsorted(self._cdf, u, side="right")), len(self._cdf) - 1)
    return int(self._support[i])

  def sample_family(self, rng_or_key: Union[int, np.random.Generator, jax.Array]) -> int:
    """The index of the family to run next.

    ``rng_or_key``: a `numpy.random.Generator` (advanced by one draw; use it for a stream), an int seed, or a JAX
    key (one uniform draw from it, fetched to the host).
    """
    if isinstance(rng_or_key, np.random.Generator):
      u = rng_or_key.random()
    elif isinstance(rng_or_key, (int, np.integer)):
      u = np.random.default_rng(int(rng_or_key)).random()
    else:
      u = float(jax.random.uniform(rng_or_key, ()))
    return self.index_from_uniform(u)

  def indices(self, seed: int) -> Iterator[int]:
    """An infinite, deterministic stream of family indices for ``seed``."""
    rng = np.random.default_rng(seed)
    while True:
      yield self.sample_family(rng)

  def __repr__(self) -> str:
    parts = ", ".join(f"{n}: {w:.3g}" for n, w in zip(self.names, self.weights))
    return f"<FamilyMixture {parts}>"
