"""CIFAR-10 from its python-pickle batches in a directory you name (nothing is downloaded).

Expected files (the extracted "CIFAR-10 python version" archive): ``data_batch_1`` ... ``data_batch_5`` and
``test_batch``, each a pickled dict with ``b"data"``: uint8 [N, 3072] (channel-major: 1024 red, then 1024 green,
then 1024 blue values, each a row-major 32x32 plane) and ``b"labels"``: N ints in 0..9. The directory may be the
extracted ``cifar-10-batches-py`` folder itself or a folder containing it. The pickles are read with a restricted
unpickler that accepts only containers and numpy arrays.

Splits (all disjoint): ``data_batch_1``-``4`` -> ``train`` (40,000), ``data_batch_5`` -> ``inner_valid`` (10,000);
``test_batch`` first half -> ``outer_valid`` (5,000), second half -> ``test`` (5,000).

Batches are ``{"image": f32[B, S, S, 3], "label": i32[B]}`` (HWC, RGB).
"""

from __future__ import annotations

import os
import pickle
from typing import Dict, Optional, Tuple

import numpy as np

from metafam.datasets.arrays import datasets_from_arrays
from metafam.datasets.base import Datasets, SPLITS, dataset_lru_cache
from metafam.datasets.images import image_datasets, resolve_data_dir

CIFAR10_ENV = "METAFAM_CIFAR10_DIR"
CIFAR10_SUBDIR = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

ColorSplits = Dict[str, Tuple[np.ndarray, np.ndarray]]  # split -> (uint8 images [N, H, W, 3], labels [N])


class _BatchUnpickler(pickle.Unpickler):
  """Unpickles plain containers and numpy arrays only: a file that names any other global is refused, so a
  tampered "batch" cannot run code."""

  ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
             ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"), ("numpy", "ndarray"),
             ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"), ("numpy", "dtype"),
             ("_codecs", "encode")}

  def find_class(self, module, name):
    if (module, name) not in self.ALLOWED:
      raise pickle.UnpicklingError(f"CIFAR-10 batches hold only containers and numpy arrays; refusing to load "
                                   f"{module}.{name}.")
    return super().find_class(module, name)


def read_cifar10_batch(path: str) -> Tuple[np.ndarray, np.ndarray]:
  """One pickle batch -> (uint8 images [N, 32, 32, 3] in HWC order, int64 labels [N])."""
  with open(path, "rb") as f:
    d = _BatchUnpickler(f, encoding="bytes").load()
  if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
    keys = sorted(d) if isinstance(d, dict) else type(d).__name__
    raise ValueError(f"{path}: expected a pickled dict with b'data' and b'labels' (CIFAR-10 python layout), "
                     f"got {keys}.")
  data, labels = np.asarray(d[b"data"]), np.asarray(d[b"labels"], np.int64)
  if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != data.shape[:1]:
    raise ValueError(f"{path}: b'data' is {data.dtype}{list(data.shape)} and b'labels' has shape "
                     f"{list(labels.shape)}; expected uint8[N, 3072] and N labels.")
  if labels.size and (labels.min() < 0 or labels.max() >= len(CIFAR10_CLASSES)):
    raise ValueError(f"{path}: labels must lie in 0..9, got range [{labels.min()}, {labels.max()}].")
  images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return np.ascontiguousarray(images), labels


def find_cifar10_files(directory: str) -> Dict[str, str]:
  """Paths of the six batch files in ``directory`` or its ``cifar-10-batches-py`` subfolder (FileNotFoundError)."""
  names = TRAIN_FILES + (TEST_FILE,)
  for candidate in (directory, os.path.join(directory, CIFAR10_SUBDIR)):
    paths = {n: os.path.join(candidate, n) for n in names}
    if all(os.path.isfile(p) for p in paths.values()):
      return paths
  missing = [n for n in names if not os.path.isfile(os.path.join(directory, n))]
  raise FileNotFoundError(f"CIFAR-10 python batches not found in {directory!r} or {directory!r}/{CIFAR10_SUBDIR}: "
                          f"missing {', '.join(missing)} (need {', '.join(names)}).")


def read_cifar10_dir(directory: str) -> ColorSplits:
  """Reads the six pickle batches into four disjoint splits (see the module docstring)."""
  paths = find_cifar10_files(directory)
  batches = [read_cifar10_batch(paths[n]) for n in TRAIN_FILES]
  te_x, te_y = read_cifar10_batch(paths[TEST_FILE])
  half = len(te_x) // 2
  return {"train": (np.concatenate([b[0] for b in batches[:4]]), np.concatenate([b[1] for b in batches[:4]])),
          "inner_valid": batches[4], "outer_valid": (te_x[:half], te_y[:half]), "test": (te_x[half:], te_y[half:])}


def color_image_datasets(raw: ColorSplits, batch_size: int, image_size: int = 32, normalization: str = "unit",
                         seed: int = 0, num_classes: int = 10) -> Datasets:
  """A `Datasets` of ``{"image": f32[B, S, S, C], "label": i32[B]}`` from uint8 [N, H, W, C] splits.

  Each channel goes through `metafam.datasets.images.image_datasets` as a gray image set (same resizing and
  scaling), so "standardize" uses per-channel training-split statistics. Split i is shuffled with seed
  ``4 * seed + i``, as in `image_datasets`.
  """
  num_channels = {x.shape[-1] for x, _ in raw.values()}
  if len(num_channels) != 1 or any(x.ndim != 4 for x, _ in raw.values()):
    raise ValueError(f"color splits must all be uint8 [N, H, W, C] with one C; got "
                     f"{ {k: x.shape for k, (x, _) in raw.items()} }.")
  per_channel = [image_datasets({k: (x[..., c], y) for k, (x, y) in raw.items()}, batch_size, image_size,
                                normalization, 1, seed, num_classes) for c in range(num_channels.pop())]
  arrays = {}
  for name in SPLITS:
    sources = [d.source(name).arrays for d in per_channel]
    arrays[name] = {"image": np.concatenate([s["image"] for s in sources], axis=-1), "label": sources[0]["label"]}
  info = dict(per_channel[0].extra_info, channels=len(per_channel))
  return datasets_from_arrays(**arrays, batch_size=batch_size, seed=seed, extra_info=info)


@dataset_lru_cache(maxsize=4)
def _cached_cifar10_datasets(directory: str, batch_size: int, image_size: int, normalization: str,
                             seed: int) -> Datasets:
  datasets = color_image_datasets(read_cifar10_dir(directory), batch_size, image_size, normalization, seed,
                                  num_classes=len(CIFAR10_CLASSES))
  datasets.extra_info["class_names"] = CIFAR10_CLASSES
  return datasets


def cifar10_datasets(batch_size: int = 128, image_size: int = 32, normalization: str = "unit", seed: int = 0,
                     data_dir: Optional[str] = None) -> Datasets:
  """CIFAR-10 batches ``{"image": f32[B, S, S, 3], "label": i32[B]}`` (40,000/10,000/5,000/5,000 examples).

  Args:
    batch_size: examples per batch.
    image_size: side S of the (square) images; 32 keeps them as stored, other sizes are resized (antialiased).
    normalization: "unit" ([0, 1]), "centered" ([-1, 1]) or "standardize" (per-channel training-split mean/std).
    seed: seed of the shuffling streams (split i uses ``4 * seed + i``).
    data_dir: directory with the python-pickle batches (or their ``cifar-10-batches-py`` folder); defaults to
      ``$METAFAM_CIFAR10_DIR``. A missing directory or file raises FileNotFoundError naming what was looked for.

  Memoized per resolved directory and arguments (at most 4 builds; the full set at 32x32 takes about 740 MB as
  float32).
  """
  try:
    directory = os.path.abspath(resolve_data_dir(data_dir, CIFAR10_ENV))
  except FileNotFoundError as e:
    raise FileNotFoundError(f"CIFAR-10 python batches ({', '.join(TRAIN_FILES + (TEST_FILE,))}): {e}") from None
  return _cached_cifar10_datasets(directory, batch_size, image_size, normalization, seed)


cifar10_datasets.cache_clear = _cached_cifar10_datasets.cache_clear
