"""Image classification datasets: embedded Fashion-MNIST and MNIST slices, full (Fashion-)MNIST from IDX files.

Batches are ``{"image": f32[B, H, W, C], "label": i32[B]}``. Preprocessing (resize, scaling, channels) is applied once
to the whole split when the `Datasets` is built, so iterating and device sampling only gather.

Split sources (all disjoint):
  * embedded slice: training file images 0-4999 -> ``train``, 5000-5999 -> ``inner_valid``; test file images
    0-999 -> ``outer_valid``, 1000-1999 -> ``test``.
  * embedded MNIST digits (`mnist_digits_datasets`, 5,000 images, 500 per class): per class, the first 350 ->
    ``train``, next 50 -> ``inner_valid``, next 50 -> ``outer_valid``, last 50 -> ``test``.
  * full files: training file 0-49999 -> ``train``, 50000-59999 -> ``inner_valid``; test file 0-4999 ->
    ``outer_valid``, 5000-9999 -> ``test``.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
from typing import Dict, Optional, Tuple

import jax
import numpy as np

from metafam._checks import check_positive_int
from metafam.datasets.arrays import datasets_from_arrays
from metafam.datasets.base import Datasets, SPLITS, dataset_lru_cache
from metafam.datasets.idx import read_idx

FASHION_MNIST_ENV = "METAFAM_FASHION_MNIST_DIR"
MNIST_ENV = "METAFAM_MNIST_DIR"
DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
EMBEDDED_MNIST = "<embedded mnist_5k>"  # a cache key that no absolute path can equal
NORMALIZATIONS = ("unit", "centered", "standardize")

_IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
              "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}

RawSplits = Dict[str, Tuple[np.ndarray, np.ndarray]]  # split -> (uint8 images [N, 28, 28], labels [N])


def embedded_fashion_mnist() -> RawSplits:
  """The Fashion-MNIST slice shipped in the package (8,000 images; MIT, see LICENSE_FASHION_MNIST.txt)."""
  with importlib.resources.files("metafam.datasets").joinpath("data/fashion_mnist_slice.npz").open("rb") as f:
    z = np.load(f)
    tr_x, tr_y, te_x, te_y = (z[k] for k in ("train_images", "train_labels", "test_images", "test_labels"))
  return {"train": (tr_x[:5000], tr_y[:5000]), "inner_valid": (tr_x[5000:], tr_y[5000:]),
          "outer_valid": (te_x[:1000], te_y[:1000]), "test": (te_x[1000:], te_y[1000:])}


def embedded_mnist_digits() -> RawSplits:
  """The 5,000 MNIST digits shipped in the package (CC BY-SA 3.0, see LICENSE_MNIST.txt), 500 per class, split
  per class in stored order: the first 350 of each digit -> ``train``, next 50 -> ``inner_valid``, next 50 ->
  ``outer_valid``, last 50 -> ``test`` (the file is sorted by class, so a plain cut would split by digit)."""
  with importlib.resources.files("metafam.datasets").joinpath("data/mnist_5k.npz").open("rb") as f:
    z = np.load(f)
    x, y = z["images"], z["labels"]
  rank = np.empty(len(y), np.int64)  # position of each example among the examples of its class
  for c in np.unique(y):
    members = np.nonzero(y == c)[0]
    rank[members] = np.arange(members.size)
  bounds = (0, 350, 400, 450, 500)
  out = {}
  for name, a, b in zip(SPLITS, bounds[:-1], bounds[1:]):
    keep = np.nonzero((rank >= a) & (rank < b))[0]
    out[name] = (x[keep], y[keep])
  return out


def _find(directory: str, stem: str) -> str:
  for name in (stem + ".gz", stem):
    path = os.path.join(directory, name)
    if os.path.exists(path):
      return path
  raise FileNotFoundError(f"{directory!r} has neither {stem}.gz nor {stem} (standard (Fashion-)MNIST IDX names).")


def read_mnist_style_dir(directory: str) -> RawSplits:
  """Reads the four standard IDX files of MNIST or Fashion-MNIST in ``directory`` into four disjoint splits."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"data directory {directory!r} does not exist.")
  raw = {}
  for part, (images, labels) in _IDX_FILES.items():
    x, y = read_idx(_find(directory, images)), read_idx(_find(directory, labels))
    if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
      raise ValueError(f"{directory}: {part} images {x.shape} and labels {y.shape} do not form an image dataset.")
    raw[part] = (x, y)
  (tr_x, tr_y), (te_x, te_y) = raw["train"], raw["test"]
  a, b = (5 * len(tr_x)) // 6, len(te_x) // 2
  return {"train": (tr_x[:a], tr_y[:a]), "inner_valid": (tr_x[a:], tr_y[a:]),
          "outer_valid": (te_x[:b], te_y[:b]), "test": (te_x[b:], te_y[b:])}


def resolve_data_dir(data_dir: Optional[str], env: str, fallback: Optional[str] = None, hint: str = "") -> str:
  """``data_dir`` if given, else ``$env``, else ``fallback`` if it exists; otherwise a FileNotFoundError (ending
  with ``hint``: where to get the data)."""
  explicit = data_dir or os.environ.get(env)
  if explicit:
    if not os.path.isdir(explicit):
      source = "data_dir" if data_dir else f"${env}"
      raise FileNotFoundError(f"data directory {explicit!r} (from {source}) does not exist.")
    return explicit
  if fallback and os.path.isdir(fallback):
    return fallback
  raise FileNotFoundError(f"No data directory: pass data_dir or set ${env}"
                          + (f", or install the files at {fallback}" if fallback else "") + "." + hint)


@functools.partial(jax.jit, static_argnums=1)
def _resize(images: jax.Array, size: int) -> jax.Array:
  """Antialiased bilinear resize of ``[N, H, W]`` images to ``[N, size, size]`` (compiled once per shape)."""
  return jax.image.resize(images, (images.shape[0], size, size), "linear", antialias=True)


def preprocess_images(images: np.ndarray, image_size: int, normalization: str, channels: int,
                      stats: Optional[Tuple[float, float]] = None) -> np.ndarray:
  """uint8 [N, H, W] -> float32 [N, image_size, image_size, channels].

  Resizing is antialiased bilinear (`jax.image.resize`). ``normalization``: "unit" -> [0, 1], "centered" ->
  [-1, 1], "standardize" -> zero mean, unit variance with ``stats=(mean, std)`` (of the training split).
  """
  x = images.astype(np.float32) / 255.0
  if x.shape[1:] != (image_size, image_size):
    x = np.asarray(_resize(x, image_size))
  if normalization == "centered":
    x = 2.0 * x - 1.0
  elif normalization == "standardize":
    mean, std = stats
    x = (x - mean) / std
  x = np.repeat(x[..., None], channels, axis=-1)
  return np.ascontiguousarray(x, dtype=np.float32)


def image_datasets(raw: RawSplits, batch_size: int, image_size: int = 8, normalization: str = "unit",
                   channels: int = 1, seed: int = 0, num_classes: int = 10) -> Datasets:
  """Builds a `Datasets` of ``{"image", "label"}`` batches from raw uint8 splits; each split gets its own seed."""
  image_size = check_positive_int("image_size", image_size)
  if normalization not in NORMALIZATIONS:
    raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}.")
  if channels not in (1, 3):
    raise ValueError(f"channels must be 1 or 3, got {channels!r}.")
  stats = None
  if normalization == "standardize":
    train = preprocess_images(raw["train"][0], image_size, "unit", 1)
    stats = (float(train.mean()), float(train.std()) + 1e-8)
  arrays = {name: {"image": preprocess_images(raw[name][0], image_size, normalization, channels, stats),
                   "label": raw[name][1].astype(np.int32)} for name in SPLITS}
  info = {"num_classes": num_classes, "image_size": image_size, "channels": channels,
          "normalization": normalization}
  return datasets_from_arrays(**arrays, batch_size=batch_size, seed=seed, extra_info=info)


@dataset_lru_cache
def _cached_image_datasets(directory: Optional[str], batch_size: int, image_size: int, normalization: str,
                           channels: int, seed: int) -> Datasets:
  if directory is None:
    raw = embedded_fashion_mnist()
  elif directory == EMBEDDED_MNIST:
    raw = embedded_mnist_digits()
  else:
    raw = read_mnist_style_dir(directory)
  return image_datasets(raw, batch_size, image_size, normalization, channels, seed)


def fashion_mnist_datasets(batch_size: int = 128, image_size: int = 8, normalization: str = "unit",
                           channels: int = 1, seed: int = 0, data_dir: Optional[str] = None) -> Datasets:
  """Fashion-MNIST batches ``{"image": f32[B, S, S, C], "label": i32[B]}`` (memoized per resolved arguments).

  Args:
    batch_size: examples per batch.
    image_size: side S of the (square) resized images, e.g. 8, 16 or 28.
    normalization: "unit" ([0, 1]), "centered" ([-1, 1]) or "standardize" (training-split mean/std).
    channels: 1, or 3 to repeat the gray channel (CIFAR-shaped inputs).
    seed: seed of the shuffling streams (split i uses ``4 * seed + i``).
    data_dir: None uses the slice embedded in the package (5000/1000/1000/1000 examples). "full" reads the full
      set from ``$METAFAM_FASHION_MNIST_DIR`` or, if unset, the Debian location
      ``/usr/share/datasets/fashion-mnist``; any other string is a directory holding the four IDX files.
  """
  directory = None
  if data_dir is not None:
    directory = os.path.abspath(resolve_data_dir(
        None if data_dir == "full" else data_dir, FASHION_MNIST_ENV, DEBIAN_FASHION_MNIST_DIR,
        " The full Fashion-MNIST (MIT licence) is Debian's package dataset-fashion-mnist (`apt-get install "
        "dataset-fashion-mnist`), or the four IDX files from the Zalando Research fashion-mnist repository."))
  return _cached_image_datasets(directory, batch_size, image_size, normalization, channels, seed)


def mnist_datasets(batch_size: int = 128, image_size: int = 28, normalization: str = "unit", channels: int = 1,
                   seed: int = 0, data_dir: Optional[str] = None) -> Datasets:
  """MNIST digits from the four standard IDX files in ``data_dir`` (or ``$METAFAM_MNIST_DIR``).

  Nothing is downloaded; arguments as in `fashion_mnist_datasets`.
  """
  directory = os.path.abspath(resolve_data_dir(data_dir, MNIST_ENV))
  return _cached_image_datasets(directory, batch_size, image_size, normalization, channels, seed)


def mnist_digits_datasets(batch_size: int = 128, image_size: int = 28, normalization: str = "unit",
                          channels: int = 1, seed: int = 0) -> Datasets:
  """MNIST digit batches from the 5,000 digits embedded in the package (memoized; arguments as in
  `fashion_mnist_datasets`). Nothing is downloaded; for the full set use `mnist_datasets` with IDX files."""
  return _cached_image_datasets(EMBEDDED_MNIST, batch_size, image_size, normalization, channels, seed)


fashion_mnist_datasets.cache_clear = mnist_digits_datasets.cache_clear = mnist_datasets.cache_clear = _cached_image_datasets.cache_clear
