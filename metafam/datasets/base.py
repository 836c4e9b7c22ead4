"""`Datasets`: four seeded, infinite batch iterators plus an abstract batch.

Split semantics (build them from disjoint data):
  * ``train``: batches the inner optimizer trains on.
  * ``inner_valid``: in-training validation and hyper-parameter choice.
  * ``outer_valid``: the meta-training objective's data; never seen by inner training.
  * ``test``: held out for final evaluation.

Splits backed by in-memory arrays (`ArraySplit`) also offer a device path: `Datasets.device_data(split)` moves the
whole split to the device once and returns a `DeviceData` pytree whose `sample(key)` gathers a batch by random
indices inside jitted code, so vectorized training never copies data from the host per step.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import inspect
import threading
from typing import Any, Callable, Iterator, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metafam._checks import check_positive_int
from metafam._pytree import static_field

SPLITS = ("train", "inner_valid", "outer_valid", "test")


def dtype_of(x: Any) -> np.dtype:
  """The dtype of an array-like (numpy, JAX or Python scalar)."""
  return np.dtype(x.dtype) if hasattr(x, "dtype") else np.result_type(x)


def abstract_of(tree: Any) -> Any:
  """The `jax.ShapeDtypeStruct` pytree describing ``tree``."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), dtype_of(x)), tree)


def check_batch(batch: Any, abstract_batch: Any, where: str = "batch") -> None:
  """Raises ValueError naming the first leaf of ``batch`` whose structure, shape or dtype differs."""
  want_leaves, want_def = jax.tree_util.tree_flatten_with_path(abstract_batch)
  got_leaves, got_def = jax.tree_util.tree_flatten_with_path(batch)
  if want_def != got_def:
    raise ValueError(f"{where} has structure {got_def}, but abstract_batch expects {want_def}.")
  for (path, want), (_, got) in zip(want_leaves, got_leaves):
    shape, dtype = np.shape(got), dtype_of(got)
    if tuple(shape) != tuple(want.shape) or np.dtype(dtype) != np.dtype(want.dtype):
      raise ValueError(f"{where} leaf {jax.tree_util.keystr(path)} is {np.dtype(dtype).name}{list(shape)}, "
                       f"but abstract_batch expects {np.dtype(want.dtype).name}{list(want.shape)}.")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DeviceData:
  """A whole split on the device; `sample` draws a batch inside jitted code.

  Attributes:
    arrays: pytree of device arrays, each with a leading example axis of the same length N.
    batch_size: examples per batch (static).
  """
  arrays: Any
  batch_size: int = static_field()

  @property
  def num_examples(self) -> int:
    return jax.tree.leaves(self.arrays)[0].shape[0]

  def sample(self, key: jax.Array) -> Any:
    """A batch of ``batch_size`` examples drawn uniformly with replacement (i.i.d. per key):
    ``take(indices(key))``."""
    return self.take(self.indices(key))

  def indices(self, key: jax.Array) -> jax.Array:
    """int32 ``[batch_size]``: the examples `sample` draws for ``key`` (the random part, to draw many at once)."""
    return jax.random.randint(key, (self.batch_size,), 0, self.num_examples)

  def take(self, idx: jax.Array) -> Any:
    """The batch of examples ``idx`` (the gather part of `sample`)."""
    return jax.tree.map(lambda x: jnp.take(x, idx, axis=0), self.arrays)


class ArraySplit:
  """An infinite, seeded iterator over an in-memory split.

  Each epoch visits every example once in an order drawn from the whole split by ``np.random.default_rng(seed)``;
  the final partial batch of an epoch is completed from the next epoch, so every batch has ``batch_size`` examples.
  The same seed gives the same batches.

  Args:
    arrays: pytree (usually a dict) of numpy arrays sharing a leading example axis.
    batch_size: examples per batch.
    seed: seed of the shuffling stream.
    shuffle: if False, examples come in stored order.
  """

  def __init__(self, arrays: Any, batch_size: int, seed: int = 0, shuffle: bool = True):
    leaves = jax.tree.leaves(arrays)
    if not leaves:
      raise ValueError("ArraySplit needs at least one array.")
    n = {np.shape(x)[0] for x in leaves}
    if len(n) != 1:
      raise ValueError(f"ArraySplit arrays disagree on the number of examples: {sorted(n)}.")
    check_positive_int("batch_size", batch_size)
    self.arrays = jax.tree.map(np.asarray, arrays)
    self.num_examples = n.pop()
    self.batch_size = int(batch_size)
    self.seed = seed
    self.shuffle = shuffle
    self._rng = np.random.default_rng(seed)
    self._order = np.zeros((0,), np.int64)
    self._device: Optional[DeviceData] = None
    self._lock = threading.Lock()

  @property
  def abstract_batch(self) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((self.batch_size,) + x.shape[1:], x.dtype), self.arrays)

  def __iter__(self) -> "ArraySplit":
    return self

  def __next__(self) -> Any:
    with self._lock:
      while self._order.shape[0] < self.batch_size:
        epoch = self._rng.permutation(self.num_examples) if self.shuffle else np.arange(self.num_examples)
        self._order = np.concatenate([self._order, epoch])
      idx, self._order = self._order[:self.batch_size], self._order[self.batch_size:]
    return jax.tree.map(lambda x: x[idx], self.arrays)

  def device_data(self) -> DeviceData:
    """The split on the default device, transferred on first call and reused after."""
    if self._device is None:
      self._device = DeviceData(jax.device_put(self.arrays), self.batch_size)
    return self._device


class _CheckedSplit:
  """Forwards a split iterator and checks every batch against the abstract batch."""

  def __init__(self, name: str, source: Iterator, abstract_batch: Any):
    self.name, self.source, self.abstract_batch = name, source, abstract_batch

  def __iter__(self) -> "_CheckedSplit":
    return self

  def __next__(self) -> Any:
    batch = next(self.source)
    check_batch(batch, self.abstract_batch, where=f"a batch of split {self.name!r}")
    return batch


class Datasets:
  """Four infinite batch iterators — ``train``, ``inner_valid``, ``outer_valid``, ``test`` — and their shapes.

  Args:
    train, inner_valid, outer_valid, test: iterators yielding batches (pytrees of numpy arrays).
    extra_info: free-form facts about the data, e.g. ``{"num_classes": 10}`` or ``{"vocab_size": 76}``.
    abstract_batch: pytree of `jax.ShapeDtypeStruct` describing one batch. If omitted it is taken from the splits
      when they are `ArraySplit`s, else from the first ``train`` batch (which is then still served first).
    validate: check every batch against ``abstract_batch`` (cheap; on by default).
  """

  def __init__(self, train: Iterator, inner_valid: Iterator, outer_valid: Iterator, test: Iterator,
               extra_info: Optional[Mapping[str, Any]] = None, abstract_batch: Any = None,
               validate: bool = True):
    given = dict(train=train, inner_valid=inner_valid, outer_valid=outer_valid, test=test)
    for name, it in given.items():
      if it is None:
        raise ValueError(f"Datasets is missing split {name!r}: all of {SPLITS} are required.")
      if not hasattr(it, "__next__"):
        raise TypeError(f"Datasets split {name!r} must be an iterator (with __next__), got {type(it).__name__}.")
    if abstract_batch is None:
      if isinstance(train, ArraySplit):
        abstract_batch = train.abstract_batch
      else:
        first = next(train)
        abstract_batch = abstract_of(first)
        given["train"] = _prepend(first, train)
    self._sources = given
    self.abstract_batch = abstract_batch
    self.extra_info = dict(extra_info or {})
    for name, it in given.items():
      if isinstance(it, ArraySplit):
        check_batch(_zeros_like_abstract(it.abstract_batch), abstract_batch,
                    where=f"split {name!r} (ArraySplit)")
      setattr(self, name, _CheckedSplit(name, it, abstract_batch) if validate else it)

  def split(self, name: str) -> Iterator:
    """The iterator of split ``name``."""
    if name not in SPLITS:
      raise ValueError(f"Unknown split {name!r}; expected one of {SPLITS}.")
    return getattr(self, name)

  def source(self, name: str) -> Iterator:
    """The unwrapped iterator given for split ``name``."""
    self.split(name)
    return self._sources[name]

  def device_data(self, name: str) -> DeviceData:
    """Split ``name`` on the device, for `DeviceData.sample` inside jitted code (needs an `ArraySplit`)."""
    src = self.source(name)
    if not isinstance(src, ArraySplit):
      raise TypeError(f"Split {name!r} is a {type(src).__name__}, not an ArraySplit, so it has no device path; "
                      "build it with metafam.datasets.ArraySplit to sample batches on the device.")
    return src.device_data()

  @property
  def has_device_data(self) -> bool:
    return all(isinstance(s, ArraySplit) for s in self._sources.values())

  def __repr__(self) -> str:
    return f"Datasets(abstract_batch={self.abstract_batch}, extra_info={self.extra_info})"


def _prepend(first: Any, it: Iterator) -> Iterator:
  yield first
  yield from it


def _zeros_like_abstract(abstract: Any) -> Any:
  return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), abstract)


def dataset_lru_cache(fn: Optional[Callable] = None, *, maxsize: int = 16) -> Callable:
  """Memoizes a dataset builder: the same arguments return the same `Datasets` object.

  Arguments are matched after binding to the signature (so ``f(8)`` and ``f(image_size=8)`` share an entry) and
  must be hashable. At most ``maxsize`` results are kept, least recently used first out. Nothing is built at
  import time. The wrapped function has ``cache_clear()`` and ``cache_info()``.

  Use as ``@dataset_lru_cache`` or ``@dataset_lru_cache(maxsize=4)``.
  """
  if fn is None:
    return functools.partial(dataset_lru_cache, maxsize=maxsize)
  if maxsize < 1:
    raise ValueError(f"maxsize must be >= 1, got {maxsize}.")
  signature = inspect.signature(fn)
  cache: "collections.OrderedDict[Any, Any]" = collections.OrderedDict()
  lock = threading.RLock()
  stats = {"hits": 0, "misses": 0}

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    key = tuple(bound.arguments.items())
    try:
      hash(key)
    except TypeError as e:
      raise TypeError(f"{fn.__name__}: dataset_lru_cache needs hashable arguments ({e}).") from None
    with lock:
      if key in cache:
        cache.move_to_end(key)
        stats["hits"] += 1
        return cache[key]
    value = fn(*args, **kwargs)
    with lock:
      stats["misses"] += 1
      cache[key] = value
      cache.move_to_end(key)
      while len(cache) > maxsize:
        cache.popitem(last=False)
    return value

  def cache_clear():
    with lock:
      cache.clear()

  wrapper.cache_clear = cache_clear
  wrapper.cache_info = lambda: dict(stats, size=len(cache), maxsize=maxsize)
  return wrapper
