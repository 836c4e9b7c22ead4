"""Your own data as the four seeded splits: numpy arrays, or ``.npy`` / ``.npz`` files in a directory.

``datasets_from_arrays(train=..., inner_valid=..., outer_valid=..., test=..., batch_size=...)`` takes one dict of
arrays per split (``{"x": x, "y": y}``: each array has a leading example axis, and batches are dicts with the same
keys) and returns the `Datasets` every built-in data set is: split i is an `ArraySplit` shuffled with seed
``4 * seed + i``, so the same seed gives the same batches, ``abstract_batch`` is ``[batch_size, ...]`` of each array,
and the device path works. `split_arrays` cuts one set of arrays into four disjoint splits; `datasets_from_directory`
reads ``train.npz`` (or a ``train/`` folder of ``.npy`` files) and the other three, memoized like the built-in
builders.

Everything is checked before anything is built, and an error names the split and the array: a missing split,
arrays of different lengths, a scalar, a non-numeric dtype, a per-example shape or dtype that differs between splits,
and NaN or infinite values (``check_finite``). 64-bit arrays become the dtypes JAX computes in (float32, int32 unless
``jax_enable_x64`` is set), so the abstract batch says what jitted code sees.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Sequence

import jax
import numpy as np

from metafam._checks import check_bool, check_positive_int
from metafam.datasets.base import SPLITS, ArraySplit, Datasets, dataset_lru_cache

Arrays = Dict[str, np.ndarray]


def _array(split: str, key: str, value: Any) -> np.ndarray:
  where = f"split {split!r} array {key!r}"
  try:
    a = np.asarray(value)
  except Exception as e:  # noqa: BLE001 -- any failure to convert is the user's input; say which
    raise ValueError(f"{where} cannot be read as a numpy array: {e}") from None
  if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
    raise ValueError(f"{where} has dtype {a.dtype}; arrays must be numeric or bool (not strings or Python objects).")
  if a.ndim == 0:
    raise ValueError(f"{where} is a scalar; every array needs a leading example axis, e.g. shape [N] or [N, ...].")
  return np.ascontiguousarray(a, dtype=jax.dtypes.canonicalize_dtype(a.dtype))


def _nonfinite(split: str, key: str, a: np.ndarray) -> None:
  if not np.issubdtype(a.dtype, np.inexact):
    return
  bad = ~np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)
  if bad.any():
    rows = np.flatnonzero(bad)
    count = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
    raise ValueError(f"split {split!r} array {key!r} has {count} non-finite values (NaN or infinity) in "
                     f"{rows.size} of {a.shape[0]} examples, the first at example {int(rows[0])}; drop or fix those "
                     "examples (check_finite=False keeps them).")


def _checked_split(split: str, arrays: Any, check_finite: bool = True) -> Arrays:
  """The arrays of one split as ``{name: numpy array}`` in JAX's dtypes, or ValueError naming split and array.

  Accepted: a non-empty dict of string names to numeric or bool array-likes that share their leading (example)
  length, at least 1; with ``check_finite``, float arrays must hold no NaN or infinity.
  """
  if not isinstance(arrays, Mapping) or not arrays:
    raise ValueError(f"split {split!r} must be a non-empty dict of arrays such as {{'x': x, 'y': y}} (a leading "
                     f"example axis each), got {type(arrays).__name__}.")
  bad = [k for k in arrays if not isinstance(k, str)]
  if bad:
    raise ValueError(f"split {split!r}: array names must be strings, got {bad!r}.")
  out = {k: _array(split, k, v) for k, v in arrays.items()}
  lengths = {k: a.shape[0] for k, a in out.items()}
  if len(set(lengths.values())) != 1:
    listing = ", ".join(f"{k!r} has {n}" for k, n in lengths.items())
    raise ValueError(f"split {split!r}: its arrays disagree on the number of examples ({listing}); every array of a "
                     "split needs the same leading length.")
  if not next(iter(lengths.values())):
    raise ValueError(f"split {split!r} has no examples (its arrays have length 0).")
  if check_finite:
    for k, a in out.items():
      _nonfinite(split, k, a)
  return out


def _check_seed(seed: Any) -> int:
  if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed must be an int >= 0, got {seed!r}.")
  return int(seed)


def _spec(a: np.ndarray) -> str:
  return f"{a.dtype.name}{list(a.shape[1:])}"


def datasets_from_arrays(train: Optional[Mapping[str, Any]] = None, inner_valid: Optional[Mapping[str, Any]] = None,
                         outer_valid: Optional[Mapping[str, Any]] = None, test: Optional[Mapping[str, Any]] = None,
                         *, batch_size: int, seed: int = 0, extra_info: Optional[Mapping[str, Any]] = None,
                         check_finite: bool = True) -> Datasets:
  """The `Datasets` of four splits of your arrays, shuffled and batched as the built-in data sets are.

  Args:
    train, inner_valid, outer_valid, test: one dict of arrays per split, e.g. ``{"x": x, "y": y}``, each array with
      a leading example axis; every split has the same names, per-example shapes and dtypes. All four are required
      (`split_arrays` cuts one set into four).
    batch_size: examples per batch.
    seed: seed of the shuffling streams (split i uses ``4 * seed + i``).
    extra_info: facts to keep in ``Datasets.extra_info`` (``num_examples`` per split is added).
    check_finite: refuse float arrays holding NaN or infinity, naming the split, the array and the first example.

  Raises:
    ValueError: naming the split and the array, for any input the description above does not accept.
  """
  given = dict(train=train, inner_valid=inner_valid, outer_valid=outer_valid, test=test)
  missing = [name for name, arrays in given.items() if arrays is None]
  if missing:
    raise ValueError(f"datasets_from_arrays is missing split(s) {missing}: all of {', '.join(SPLITS)} are "
                     "required (split_arrays(arrays) cuts one set of arrays into the four).")
  batch_size = check_positive_int("batch_size", batch_size)
  check_bool("check_finite", check_finite)
  seed = _check_seed(seed)
  checked = {name: _checked_split(name, arrays, check_finite) for name, arrays in given.items()}
  first = checked["train"]
  for name, arrays in checked.items():
    if set(arrays) != set(first):
      raise ValueError(f"split {name!r} has arrays {sorted(arrays)}, but split 'train' has {sorted(first)}; every "
                       "split needs the same names.")
    for key, a in arrays.items():
      if _spec(a) != _spec(first[key]):
        raise ValueError(f"split {name!r} array {key!r} is {_spec(a)} per example, but in split 'train' it is "
                         f"{_spec(first[key])}; every split needs the same per-example shapes and dtypes.")
  splits = {name: ArraySplit(checked[name], batch_size, seed=seed * len(SPLITS) + i)
            for i, name in enumerate(SPLITS)}
  info = dict(extra_info or {})
  info["num_examples"] = {name: s.num_examples for name, s in splits.items()}
  return Datasets(**splits, extra_info=info)


def split_arrays(arrays: Mapping[str, Any], fractions: Sequence[float] = (0.8, 0.1, 0.05, 0.05),
                 seed: int = 0) -> Dict[str, Arrays]:
  """Cuts one set of arrays into four disjoint splits: ``{split: {name: array}}``, for `datasets_from_arrays`.

  Examples are shuffled by ``np.random.default_rng(seed)`` and then cut in the proportions ``fractions`` (train,
  inner_valid, outer_valid, test; normalized to sum to 1). Each split must receive at least one example.
  """
  checked = _checked_split("arrays", arrays, check_finite=False)
  f = np.asarray(fractions, np.float64)
  if f.shape != (len(SPLITS),) or not np.all(np.isfinite(f)) or np.any(f <= 0):
    raise ValueError(f"fractions must be {len(SPLITS)} positive numbers (for {', '.join(SPLITS)}), got {fractions!r}.")
  n = next(iter(checked.values())).shape[0]
  bounds = np.round(np.cumsum(np.concatenate([[0.0], f / f.sum()])) * n).astype(int)
  sizes = dict(zip(SPLITS, np.diff(bounds)))
  empty = [name for name, size in sizes.items() if size < 1]
  if empty:
    raise ValueError(f"split_arrays: {n} examples at fractions {tuple(f)} leave split(s) {empty} empty; give more "
                     "examples or larger fractions.")
  order = np.random.default_rng(seed).permutation(n)
  return {name: {k: a[order[bounds[i]:bounds[i + 1]]] for k, a in checked.items()}
          for i, name in enumerate(SPLITS)}


def _split_files(directory: str, split: str) -> Dict[str, str]:
  """``{array name: file}`` for ``split``: the one ``<split>.npz``, or the ``.npy`` files of a ``<split>/`` folder."""
  npz, folder = os.path.join(directory, f"{split}.npz"), os.path.join(directory, split)
  if os.path.isfile(npz) and os.path.isdir(folder):
    raise ValueError(f"{directory!r} has both {split}.npz and a {split}/ folder; keep one of them.")
  if os.path.isfile(npz):
    return {"": npz}
  if os.path.isdir(folder):
    files = {name[:-len(".npy")]: os.path.join(folder, name) for name in sorted(os.listdir(folder))
             if name.endswith(".npy")}
    if not files:
      raise FileNotFoundError(f"{folder!r} holds no .npy files; split {split!r} needs one file per array "
                              "(x.npy, y.npy, ...).")
    return files
  raise FileNotFoundError(f"{directory!r} has no {split}.npz and no {split}/ folder of .npy files; a data "
                          f"directory needs one of them for each of {', '.join(SPLITS)}.")


def _load(path: str, split: str) -> Arrays:
  try:
    if path.endswith(".npz"):
      with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
    return {os.path.basename(path)[:-len(".npy")]: np.load(path, allow_pickle=False)}
  except ValueError as e:  # numpy's refusal of pickled (object) arrays, or a damaged file
    raise ValueError(f"split {split!r}: cannot read {path!r} ({e}); files must hold numeric arrays, saved with "
                     "np.save / np.savez (they are loaded without pickle).") from None


def _fingerprint(directory: str) -> tuple:
  """Names, sizes and modification times of the split files: a changed file misses the cache."""
  out = []
  for split in SPLITS:
    for path in _split_files(directory, split).values():
      info = os.stat(path)
      out.append((os.path.relpath(path, directory), info.st_size, info.st_mtime_ns))
  return tuple(out)


@dataset_lru_cache
def _cached_directory_datasets(directory: str, fingerprint: tuple, batch_size: int, seed: int,
                               check_finite: bool) -> Datasets:
  splits = {}
  for split in SPLITS:
    arrays: Arrays = {}
    for path in _split_files(directory, split).values():
      arrays.update(_load(path, split))
    splits[split] = arrays
  return datasets_from_arrays(**splits, batch_size=batch_size, seed=seed, check_finite=check_finite,
                              extra_info={"data_dir": directory})


def datasets_from_directory(path: str, batch_size: int, seed: int = 0, check_finite: bool = True) -> Datasets:
  """The `Datasets` of arrays saved in directory ``path``, as `datasets_from_arrays` builds it.

  Each split is either ``<split>.npz`` (``np.savez(path / "train.npz", x=x, y=y)``: its arrays by name) or a
  ``<split>/`` folder of ``.npy`` files (``train/x.npy``, ``train/y.npy``: the file names are the array names), for
  each of train, inner_valid, outer_valid and test. Files are loaded without pickle. Memoized like the built-in
  builders (`dataset_lru_cache`): the same directory, unchanged files and arguments give the same object.
  """
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"path must be a directory path (str or os.PathLike), got {type(path).__name__}.")
  directory = os.path.abspath(os.fspath(path))
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"data directory {directory!r} does not exist.")
  batch_size = check_positive_int("batch_size", batch_size)
  return _cached_directory_datasets(directory, _fingerprint(directory), batch_size, _check_seed(seed),
                                    check_bool("check_finite", check_finite))
