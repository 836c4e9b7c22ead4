"""`learned_optimization.tasks.datasets.base`: `Datasets`, the lazy iterators, and image datasets without TFDS.

metafam's `Datasets` takes the same four split iterators, ``extra_info`` and ``abstract_batch``. Differences: the
cache of `dataset_lru_cache` is bounded (least recently used out), and vectorized training needs splits that are
`ArraySplit`s (seeded, sampled on the device).

The reference's TFDS builders (`tfds_image_classification_datasets`, `preload_tfds_image_classification_datasets`,
`tfrecord_image_classification_datasets`) keep their signatures but read nothing from TFDS: the dataset is served
from what metafam has offline (see `IMAGE_DATASETS`), the split strings are ignored (metafam's own disjoint
splits are used) and the shuffle/prefetch arguments are accepted and unused. Construction is cheap and never fails
for a dataset metafam cannot read: its ``abstract_batch`` is known from the arguments, and asking any split for a
batch raises `DatasetUnavailableError` naming the dataset and the local files or variable that would supply it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import threading
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metafam._checks import check_positive_int
from metafam.datasets.base import SPLITS, ArraySplit, Datasets, dataset_lru_cache

Batch = Any

__all__ = ["Batch", "Datasets", "dataset_lru_cache", "dataset_lru_cache_clear", "ArraySplit", "ThreadSafeIterator",
           "LazyIterator", "LazyDataset", "DatasetUnavailableError", "datasets_map", "get_tfrecord_data_dir",
           "tfds_image_classification_datasets", "preload_tfds_image_classification_datasets",
           "tfrecord_image_classification_datasets", "IMAGE_DATASETS", "unavailable_datasets"]


class DatasetUnavailableError(FileNotFoundError):
  """A batch was requested from a dataset metafam cannot read offline; the message says what would supply it."""


class ThreadSafeIterator:
  """Wraps an iterator so that several threads may call ``next`` on it (one at a time)."""

  def __init__(self, iterator: Iterator[Any]):
    self._iterator = iterator
    self._lock = threading.Lock()

  def __iter__(self) -> "ThreadSafeIterator":
    return self

  def __next__(self) -> Any:
    with self._lock:
      return next(self._iterator)


class LazyIterator:
  """An iterator that calls ``fn()`` to build the iterator it forwards to on the first ``next`` (not before)."""

  def __init__(self, fn: Callable[[], Iterator[Any]]):
    self._fn = fn
    self._iterator: Optional[Iterator[Any]] = None

  def __iter__(self) -> "LazyIterator":
    return self

  def __next__(self) -> Any:
    if self._iterator is None:
      self._iterator = iter(self._fn())
    return next(self._iterator)


class LazyDataset(Datasets):
  """A `Datasets` that calls ``dataset_fn()`` (once) the first time any of its attributes is read."""

  def __init__(self, dataset_fn: Callable[[], Datasets]):  # pylint: disable=super-init-not-called
    self._fn = functools.lru_cache(maxsize=1)(dataset_fn)

  train = property(lambda self: self._fn().train)
  inner_valid = property(lambda self: self._fn().inner_valid)
  outer_valid = property(lambda self: self._fn().outer_valid)
  test = property(lambda self: self._fn().test)
  extra_info = property(lambda self: self._fn().extra_info)
  abstract_batch = property(lambda self: self._fn().abstract_batch)
  has_device_data = property(lambda self: self._fn().has_device_data)

  def source(self, name: str) -> Iterator:
    return self._fn().source(name)

  def device_data(self, name: str):
    return self._fn().device_data(name)

  def __repr__(self) -> str:
    return f"LazyDataset({self._fn!r})"


def dataset_lru_cache_clear() -> None:
  """Empties the caches of the dataset functions of this compatibility package and of metafam's readers."""
  from metafam.datasets import cifar, images, text
  # The language module's caches, if it was imported (read from sys.modules: it imports this module, not the
  # reverse; an unimported module has nothing cached).
  language = sys.modules.get("metafam.compat.learned_optimization.tasks.datasets.language")
  for fn in (_image_classification_datasets, *getattr(language, "CACHED", ()), images.fashion_mnist_datasets,
             cifar.cifar10_datasets, text.shakespeare_char_datasets):
    fn.cache_clear()


def datasets_map(fn: Callable[[Batch], Batch], datasets: Datasets, abstract_batch: Optional[Batch] = None) -> Datasets:
  """A `Datasets` whose every split yields ``fn(batch)``; ``abstract_batch`` describes the mapped batches (default:
  the input's, for an ``fn`` that keeps shapes)."""
  if not callable(fn):
    raise TypeError(f"datasets_map needs a callable fn, got {type(fn).__name__}.")
  return Datasets(*(map(fn, datasets.split(name)) for name in SPLITS), extra_info=datasets.extra_info,
                  abstract_batch=abstract_batch if abstract_batch is not None else datasets.abstract_batch)


def get_tfrecord_data_dir() -> str:
  """``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``, with ``~`` expanded (the reference's TFRecord location)."""
  return os.path.expanduser(os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets"))


def unavailable_datasets(dataset: str, how_to_supply: str, abstract_batch: Any, extra_info: Optional[dict] = None
                         ) -> Datasets:
  """A `Datasets` with the given ``abstract_batch`` whose splits raise `DatasetUnavailableError` on ``next``."""

  def fail():
    raise DatasetUnavailableError(f"dataset {dataset!r} is not available offline in metafam (nothing is "
                                  f"downloaded): {how_to_supply}")

  return Datasets(*(LazyIterator(fail) for _ in SPLITS), extra_info=extra_info, abstract_batch=abstract_batch)


# -- image classification ---------------------------------------------------------------------------------------

_BYO = ("build a metafam.datasets.Datasets with the same abstract_batch from your local copy (e.g. "
        "metafam.datasets.ArraySplit over numpy arrays) and assign it to the task's `datasets`")


@dataclasses.dataclass(frozen=True)
class ImageDatasetInfo:
  """What metafam knows of a reference image dataset: its classes and channels, and how it is read (``reader``:
  ``"fashion_mnist"``, ``"mnist"``, ``"cifar10"`` or None) or else how to supply it."""
  num_classes: int
  channels: int
  reader: Optional[str]
  how_to_supply: str


IMAGE_DATASETS = {
    "fashion_mnist": ImageDatasetInfo(10, 1, "fashion_mnist", "served by metafam (embedded slice, or the full set "
                                      "from $METAFAM_FASHION_MNIST_DIR or /usr/share/datasets/fashion-mnist)"),
    "mnist": ImageDatasetInfo(10, 1, "mnist", "put the four MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in "
                              "a directory and set $METAFAM_MNIST_DIR to it"),
    "cifar10": ImageDatasetInfo(10, 3, "cifar10", "extract the CIFAR-10 python batches (data_batch_1..5, "
                                "test_batch) into a directory and set $METAFAM_CIFAR10_DIR to it (as "
                                "metafam.tasks.cifar10_conv_task(dir) reads them)"),
    "cifar100": ImageDatasetInfo(100, 3, None, "metafam has no CIFAR-100 reader; " + _BYO),
    "svhn_cropped": ImageDatasetInfo(10, 3, None, "metafam has no SVHN reader; " + _BYO),
    "food101": ImageDatasetInfo(101, 3, None, "metafam has no Food-101 reader; " + _BYO),
    **{f"imagenet2012_{s}": ImageDatasetInfo(1000, 3, None, f"metafam has no ImageNet ({s}x{s}) reader; " + _BYO)
       for s in (8, 16, 32, 64)},
}


def _check_image_size(image_size: Any) -> Tuple[int, int]:
  if (not isinstance(image_size, (tuple, list)) or len(image_size) != 2
      or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0 for s in image_size)):
    raise ValueError(f"image_size must be a pair of positive ints (height, width), got {image_size!r}.")
  return int(image_size[0]), int(image_size[1])


def _check_rgb(name: str, value: Any) -> Optional[np.ndarray]:
  if value is None:
    return None
  v = np.asarray(value, np.float64)
  if v.shape != (3,) or not np.all(np.isfinite(v)):
    raise ValueError(f"{name} must be three finite numbers (per RGB channel, pixel scale 0-255), got {value!r}.")
  return v


def _metafam_image_datasets(reader: str, batch_size: int, side: int, channels: int) -> Datasets:
  from metafam.datasets import cifar, images
  if reader == "fashion_mnist":
    full = os.environ.get(images.FASHION_MNIST_ENV) or os.path.isdir(images.DEBIAN_FASHION_MNIST_DIR)
    return images.fashion_mnist_datasets(batch_size, side, channels=channels, data_dir="full" if full else None)
  if reader == "mnist":
    return images.mnist_datasets(batch_size, side, channels=channels)
  return cifar.cifar10_datasets(batch_size, side)


def image_classification_datasets(datasetname: str, batch_size: int, image_size: Tuple[int, int],
                                  stack_channels: int = 1, normalize_mean: Optional[Sequence[float]] = None,
                                  normalize_std: Optional[Sequence[float]] = None,
                                  convert_to_black_and_white: Optional[bool] = False) -> Datasets:
  """The reference's image batches ``{"image": f32[B, H, W, C], "label": i32[B]}`` for ``datasetname``.

  Pixels are in [0, 1], or ``(255 * x - normalize_mean) / normalize_std`` when both are given (the reference's
  0-255 statistics); ``stack_channels`` repeats a gray channel; ``convert_to_black_and_white`` averages the
  channels into one. Fashion-MNIST without these transforms comes straight from metafam (`ArraySplit`s, device
  path); everything else is read when a batch is first requested. Memoized per arguments.
  """
  def as_tuple(v):
    return tuple(v) if isinstance(v, (list, tuple, np.ndarray)) else v

  return _image_classification_datasets(datasetname, batch_size, as_tuple(image_size), stack_channels,
                                        as_tuple(normalize_mean), as_tuple(normalize_std),
                                        bool(convert_to_black_and_white))


@dataset_lru_cache
def _image_classification_datasets(datasetname, batch_size, image_size, stack_channels, normalize_mean,
                                   normalize_std, convert_to_black_and_white) -> Datasets:
  if datasetname not in IMAGE_DATASETS:
    raise ValueError(f"datasetname must be one of {sorted(IMAGE_DATASETS)}, got {datasetname!r}.")
  info = IMAGE_DATASETS[datasetname]
  batch_size = check_positive_int("batch_size", batch_size)
  height, width = _check_image_size(image_size)
  if stack_channels not in (1, 3) or (stack_channels == 3 and info.channels != 1):
    raise ValueError(f"stack_channels must be 1, or 3 for a gray dataset, got {stack_channels!r} for "
                     f"{datasetname!r}.")
  mean, std = _check_rgb("normalize_mean", normalize_mean), _check_rgb("normalize_std", normalize_std)
  if (mean is None) != (std is None) or (std is not None and np.any(std == 0)):
    raise ValueError("normalize_mean and normalize_std must be given together, with a nonzero std.")
  channels = 1 if convert_to_black_and_white else (stack_channels if stack_channels != 1 else info.channels)
  if mean is not None and (channels != 3 or convert_to_black_and_white):
    raise ValueError("normalize_mean/normalize_std apply to 3-channel images only.")
  abstract = {"image": jax.ShapeDtypeStruct((batch_size, height, width, channels), jnp.float32),
              "label": jax.ShapeDtypeStruct((batch_size,), jnp.int32)}
  extra_info = {"num_classes": info.num_classes, "dataset": datasetname}
  if info.reader is None:
    return unavailable_datasets(datasetname, info.how_to_supply, abstract, extra_info)
  if height != width:
    raise ValueError(f"metafam serves square images only; image_size {image_size!r} is not square.")
  load_channels = stack_channels if info.channels == 1 else 3

  def transform(batch):
    image = batch["image"]
    if mean is not None:
      image = (255.0 * image - mean.astype(np.float32)) / std.astype(np.float32)
    if convert_to_black_and_white:
      image = np.mean(image, axis=-1, keepdims=True)
    return {"image": np.asarray(image, np.float32), "label": batch["label"]}

  plain = mean is None and not convert_to_black_and_white
  if datasetname == "fashion_mnist" and plain:
    return _metafam_image_datasets(info.reader, batch_size, height, load_channels)

  def build():
    try:
      source = _metafam_image_datasets(info.reader, batch_size, height, load_channels)
    except FileNotFoundError as e:
      raise DatasetUnavailableError(f"dataset {datasetname!r} is read from local files: {info.how_to_supply} "
                                    f"({e})") from None
    if plain:
      return source
    splits = [source.source(name) for name in SPLITS]
    if all(isinstance(x, ArraySplit) for x in splits):  # transform the arrays once: batches stay on the device
      splits = [ArraySplit(transform(x.arrays), x.batch_size, seed=x.seed, shuffle=x.shuffle) for x in splits]
    else:
      splits = [map(transform, x) for x in splits]
    return Datasets(*splits, extra_info=extra_info, abstract_batch=abstract)

  return _ReadOnUse(build, abstract, extra_info)


class _ReadOnUse(LazyDataset):
  """A `LazyDataset` whose ``abstract_batch`` and ``extra_info`` are known without reading: the files are read
  (once) when a split, its device data or ``has_device_data`` is first asked for, so building and initializing a
  task read nothing, and the splits are metafam's `ArraySplit`s (device path) once read. ``reads_on_use`` tells
  code that builds a truncated step at construction (which reads) to defer that to first use. A split read while
  the files are missing is an iterator that raises `DatasetUnavailableError` on ``next`` (reading it is no request
  for a batch, as in the reference)."""

  reads_on_use = True

  def __init__(self, dataset_fn: Callable[[], Datasets], abstract_batch: Any, extra_info: Any):
    super().__init__(dataset_fn)
    self._abstract, self._extra = abstract_batch, extra_info

  abstract_batch = property(lambda self: self._abstract)
  extra_info = property(lambda self: self._extra)

  def _split(self, name: str) -> Iterator:
    try:
      return getattr(self._fn(), name)
    except DatasetUnavailableError:  # files missing: like a split of unavailable data, raise on next() (and retry)
      return LazyIterator(lambda: getattr(self._fn(), name))

  train = property(lambda self: self._split("train"))
  inner_valid = property(lambda self: self._split("inner_valid"))
  outer_valid = property(lambda self: self._split("outer_valid"))
  test = property(lambda self: self._split("test"))


_MAP_KEYS = ("image_size", "stack_channels", "aug_flip_left_right", "aug_flip_up_down", "normalize_mean",
             "normalize_std", "convert_to_black_and_white")


def _image_map_fn(cfg: Any, batch: Batch) -> Batch:
  """The reference's per-batch image transform, on arrays (no TensorFlow): ``batch["image"]`` (``[B, H, W, C]``,
  pixel values 0-255) is resized to ``cfg["image_size"]`` (bilinear, no antialiasing, as ``tf.image.resize``),
  gray channels tiled ``cfg["stack_channels"]`` times, flipped left-right / up-down per image at random (unseeded,
  as the reference) when ``aug_flip_*``, scaled to [0, 1] or, with ``normalize_mean`` / ``normalize_std`` (0-255
  statistics per RGB channel), standardized, and averaged over channels when ``convert_to_black_and_white``; labels
  become int32. Returns ``{"image": f32[...], "label": i32[B]}``."""
  missing = [k for k in _MAP_KEYS if k not in cfg]
  if missing:
    raise ValueError(f"cfg is missing {missing}; it needs the keys {list(_MAP_KEYS)}.")
  image = jnp.asarray(batch["image"])
  if image.ndim != 4:
    raise ValueError(f"batch['image'] must be [batch, height, width, channels], got shape {image.shape}.")
  size = tuple(int(s) for s in cfg["image_size"])
  if tuple(image.shape[1:3]) != size:
    image = jax.image.resize(image.astype(jnp.float32), image.shape[:1] + size + image.shape[3:], "linear",
                             antialias=False)
  if cfg["stack_channels"] != 1:
    if image.shape[3] != 1:
      raise ValueError(f"stack_channels={cfg['stack_channels']} needs 1-channel images, got shape {image.shape}.")
    image = jnp.tile(image, (1, 1, 1, int(cfg["stack_channels"])))
  rng = np.random.default_rng()
  for flip, axis in (("aug_flip_left_right", 2), ("aug_flip_up_down", 1)):
    if cfg[flip]:
      flipped = rng.random(image.shape[0]) < 0.5
      image = jnp.where(flipped[:, None, None, None], jnp.flip(image, axis), image)
  image = image.astype(jnp.float32)
  if cfg["normalize_mean"] is None:
    image = image / 255.0
  else:
    if cfg["normalize_std"] is None:
      raise ValueError("cfg['normalize_std'] must be given with cfg['normalize_mean'].")
    mean = jnp.asarray(cfg["normalize_mean"], jnp.float32).reshape(1, 1, 1, 3)
    image = (image - mean) / jnp.asarray(cfg["normalize_std"], jnp.float32).reshape(1, 1, 1, 3)
  if cfg["convert_to_black_and_white"]:
    image = jnp.mean(image, axis=3, keepdims=True)
  return {"image": image, "label": jnp.asarray(batch["label"]).astype(jnp.int32)}


def tfds_image_classification_datasets(datasetname: str, splits: Tuple[str, str, str, str], batch_size: int,
                                       image_size: Tuple[int, int], stack_channels: int = 1,
                                       prefetch_batches: int = 1000, shuffle_buffer_size: int = 10000,
                                       normalize_mean: Optional[Tuple[int, int, int]] = None,
                                       normalize_std: Optional[Tuple[int, int, int]] = None,
                                       convert_to_black_and_white: Optional[bool] = False) -> Datasets:
  """`image_classification_datasets` under the reference's streaming-TFDS signature (``splits``, prefetch and
  shuffle arguments unused)."""
  del splits, prefetch_batches, shuffle_buffer_size
  return image_classification_datasets(datasetname, batch_size, image_size, stack_channels, normalize_mean,
                                       normalize_std, convert_to_black_and_white)


def preload_tfds_image_classification_datasets(datasetname: str, splits: Tuple[str, str, str, str],
                                               batch_size: int, image_size: Tuple[int, int],
                                               stack_channels: int = 1, prefetch_batches: int = 1000,
                                               normalize_mean: Optional[Tuple[int, int, int]] = None,
                                               normalize_std: Optional[Tuple[int, int, int]] = None,
                                               convert_to_black_and_white: Optional[bool] = False) -> Datasets:
  """`image_classification_datasets` under the reference's in-memory-TFDS signature (``splits`` and
  ``prefetch_batches`` unused)."""
  del splits, prefetch_batches
  return image_classification_datasets(datasetname, batch_size, image_size, stack_channels, normalize_mean,
                                       normalize_std, convert_to_black_and_white)


def tfrecord_image_classification_datasets(datasetname: str, splits: Tuple[str, str, str, str], batch_size: int,
                                           image_size: Tuple[int, int], decode_image_shape: Sequence[int],
                                           stack_channels: int = 1, prefetch_batches: int = 1000,
                                           shuffle_buffer_size: int = 10000, aug_flip_left_right: bool = False,
                                           aug_flip_up_down: bool = False,
                                           normalize_mean: Optional[Tuple[int, int, int]] = None,
                                           normalize_std: Optional[Tuple[int, int, int]] = None,
                                           convert_to_black_and_white: Optional[bool] = False,
                                           cache: Optional[bool] = False) -> Datasets:
  """`image_classification_datasets` under the reference's TFRecord signature. The flips are not implemented
  (ValueError); ``decode_image_shape`` and the I/O arguments are unused."""
  del splits, decode_image_shape, prefetch_batches, shuffle_buffer_size, cache
  if aug_flip_left_right or aug_flip_up_down:
    raise ValueError("aug_flip_left_right / aug_flip_up_down are not supported by metafam's readers.")
  return image_classification_datasets(datasetname, batch_size, image_size, stack_channels, normalize_mean,
                                       normalize_std, convert_to_black_and_white)
