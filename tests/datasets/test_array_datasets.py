"""`datasets_from_arrays`, `split_arrays` and `datasets_from_directory`: the built-in data sets' order, seeds,
abstract batches and device path for the user's arrays and files, and errors that name the split and the array."""

import os

import jax
import numpy as np
import pytest

from metafam.datasets import (SPLITS, ArraySplit, Datasets, datasets_from_arrays, datasets_from_directory,
                              fashion_mnist_datasets, image_datasets, split_arrays)
from metafam.datasets.images import embedded_fashion_mnist


def _arrays(n, seed=0, d=3):
  rng = np.random.default_rng(seed)
  return {"x": rng.normal(size=(n, d)).astype(np.float32), "y": rng.integers(0, 5, size=n).astype(np.int32)}


def _four(sizes=(40, 10, 12, 14)):
  return {name: _arrays(n, seed=i) for i, (name, n) in enumerate(zip(SPLITS, sizes))}


def _batches(datasets, split, count):
  it = datasets.split(split)
  return [next(it) for _ in range(count)]


def _same(a, b):
  return all(np.array_equal(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_batches_follow_the_seeded_permutation_of_each_split():
  arrays, seed, batch_size = _four(), 3, 8
  datasets = datasets_from_arrays(**arrays, batch_size=batch_size, seed=seed)
  assert isinstance(datasets, Datasets) and datasets.has_device_data
  for i, name in enumerate(SPLITS):
    n = arrays[name]["x"].shape[0]
    rng = np.random.default_rng(4 * seed + i)  # the built-in data sets' stream of split i
    order = np.concatenate([rng.permutation(n) for _ in range(6)])
    for b, batch in enumerate(_batches(datasets, name, 6)):
      idx = order[b * batch_size:(b + 1) * batch_size]
      np.testing.assert_array_equal(batch["x"], arrays[name]["x"][idx])
      np.testing.assert_array_equal(batch["y"], arrays[name]["y"][idx])
  assert datasets.extra_info["num_examples"] == {"train": 40, "inner_valid": 10, "outer_valid": 12, "test": 14}


def test_same_seed_same_batches_other_seed_other_batches():
  a = datasets_from_arrays(**_four(), batch_size=8, seed=1)
  b = datasets_from_arrays(**_four(), batch_size=8, seed=1)
  c = datasets_from_arrays(**_four(), batch_size=8, seed=2)
  for name in SPLITS:
    first = _batches(a, name, 3)
    assert _same(first, _batches(b, name, 3))
    assert not _same(first, _batches(c, name, 3))


def test_the_built_in_fashion_mnist_arrays_give_the_built_in_batches():
  built_in = fashion_mnist_datasets(batch_size=16, image_size=8, seed=5)
  arrays = {name: built_in.source(name).arrays for name in SPLITS}
  fresh = image_datasets(embedded_fashion_mnist(), 16, image_size=8, seed=5)  # unconsumed streams, not memoized
  by_hand = Datasets(**{name: ArraySplit(arrays[name], 16, seed=4 * 5 + i) for i, name in enumerate(SPLITS)})
  ours = datasets_from_arrays(**arrays, batch_size=16, seed=5)
  assert ours.abstract_batch == fresh.abstract_batch == built_in.abstract_batch
  for name in SPLITS:
    first = _batches(ours, name, 3)
    assert _same(first, _batches(fresh, name, 3)) and _same(first, _batches(by_hand, name, 3))


def test_abstract_batch_is_the_batch_shape_in_jax_dtypes_and_the_device_path_works():
  rng = np.random.default_rng(0)
  split = lambda n: {"x": rng.normal(size=(n, 2, 3)), "y": np.arange(n, dtype=np.int64), "m": np.ones(n, bool)}
  datasets = datasets_from_arrays(split(20), split(5), split(6), split(7), batch_size=4)
  want = {"m": jax.ShapeDtypeStruct((4,), np.bool_), "x": jax.ShapeDtypeStruct((4, 2, 3), np.float32),
          "y": jax.ShapeDtypeStruct((4,), np.int32)}
  assert datasets.abstract_batch == want
  for name in SPLITS:
    assert datasets.source(name).abstract_batch == want
    batch = next(datasets.split(name))
    assert batch["x"].dtype == np.float32 and batch["y"].dtype == np.int32
  sampled = jax.jit(datasets.device_data("train").sample)(jax.random.key(0))
  assert jax.tree.map(lambda a: (a.shape, a.dtype), sampled) == jax.tree.map(lambda s: (s.shape, s.dtype), want)


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("test"), r"missing split\(s\) \['test'\]: all of train, inner_valid, outer_valid, test"),
    (lambda s: s["train"].update(y=np.zeros(39, np.int32)),
     r"split 'train': its arrays disagree on the number of examples \('x' has 40, 'y' has 39\)"),
    (lambda s: s["outer_valid"].update(x=np.zeros((12, 4), np.float32)),
     r"split 'outer_valid' array 'x' is float32\[4\] per example, but in split 'train' it is float32\[3\]"),
    (lambda s: s["test"].update(y=np.zeros(14, np.float32)),
     r"split 'test' array 'y' is float32\[\] per example, but in split 'train' it is int32\[\]"),
    (lambda s: s["inner_valid"].pop("y"), r"split 'inner_valid' has arrays \['x'\], but split 'train' has \['x', 'y'\]"),
    (lambda s: s["train"].update(y=np.array(["a"] * 40)), r"split 'train' array 'y' has dtype <U1; arrays must be numeric"),
    (lambda s: s["train"].update(y=np.float32(1)), r"split 'train' array 'y' is a scalar; every array needs a leading"),
    (lambda s: s.update(test=[np.zeros(3)]), r"split 'test' must be a non-empty dict of arrays such as \{'x': x, 'y': y\}"),
    (lambda s: s.update(test={}), r"split 'test' must be a non-empty dict of arrays"),
    (lambda s: s.update(test={"x": np.zeros((0, 3)), "y": np.zeros(0, np.int32)}), r"split 'test' has no examples"),
])
def test_bad_arrays_get_an_error_naming_the_split_and_the_array(change, message):
  splits = _four()
  change(splits)
  with pytest.raises(ValueError, match=message):
    datasets_from_arrays(**splits, batch_size=8)


def test_non_finite_values_are_refused_with_their_count_and_first_example_unless_allowed():
  splits = _four()
  splits["inner_valid"]["x"][[3, 7], 1] = np.nan
  splits["inner_valid"]["x"][7, 2] = np.inf
  with pytest.raises(ValueError, match=r"split 'inner_valid' array 'x' has 3 non-finite values \(NaN or infinity\) "
                                       r"in 2 of 10 examples, the first at example 3"):
    datasets_from_arrays(**splits, batch_size=8)
  datasets = datasets_from_arrays(**splits, batch_size=10, check_finite=False)
  assert np.isnan(next(datasets.inner_valid)["x"]).sum() == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size must be a positive int, got 0"),
    ({"batch_size": 8, "seed": -1}, "seed must be an int >= 0, got -1"),
    ({"batch_size": 8, "check_finite": 1}, "check_finite must be a bool, got 1"),
])
def test_bad_arguments_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    datasets_from_arrays(**_four(), **kwargs)


def test_split_arrays_cuts_one_set_into_four_disjoint_seeded_splits():
  whole = {"x": np.arange(100, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32), "id": np.arange(100)}
  splits = split_arrays(whole, seed=7)
  assert [splits[name]["id"].shape[0] for name in SPLITS] == [80, 10, 5, 5]
  ids = np.concatenate([splits[name]["id"] for name in SPLITS])
  np.testing.assert_array_equal(np.sort(ids), np.arange(100))
  for name in SPLITS:
    np.testing.assert_array_equal(splits[name]["x"][:, 0], splits[name]["id"])  # rows stay together
  assert np.array_equal(split_arrays(whole, seed=7)["test"]["id"], splits["test"]["id"])
  assert not np.array_equal(split_arrays(whole, seed=8)["train"]["id"], splits["train"]["id"])
  datasets = datasets_from_arrays(**split_arrays(whole, (0.5, 0.2, 0.2, 0.1)), batch_size=4)
  assert datasets.extra_info["num_examples"] == {"train": 50, "inner_valid": 20, "outer_valid": 20, "test": 10}
  with pytest.raises(ValueError, match=r"fractions must be 4 positive numbers"):
    split_arrays(whole, (0.5, 0.5))
  with pytest.raises(ValueError, match=r"leave split\(s\) \['outer_valid', 'test'\] empty"):
    split_arrays({"x": np.zeros(10)}, (0.9, 0.1, 0.01, 0.01))


def test_a_directory_of_npz_or_npy_files_gives_the_arrays_batches_and_is_memoized(tmp_path):
  arrays = _four()
  for i, name in enumerate(SPLITS):
    if i % 2:
      np.savez(tmp_path / f"{name}.npz", **arrays[name])
    else:
      os.mkdir(tmp_path / name)
      for key, a in arrays[name].items():
        np.save(tmp_path / name / f"{key}.npy", a)
  datasets = datasets_from_directory(str(tmp_path), batch_size=8, seed=2)
  reference = datasets_from_arrays(**arrays, batch_size=8, seed=2)
  assert datasets.abstract_batch == reference.abstract_batch
  for name in SPLITS:
    assert _same(_batches(datasets, name, 3), _batches(reference, name, 3))
  assert datasets_from_directory(tmp_path, batch_size=8, seed=2) is datasets
  assert datasets_from_directory(tmp_path, batch_size=8, seed=3) is not datasets
  np.savez(tmp_path / "inner_valid.npz", **_arrays(11))
  changed = datasets_from_directory(tmp_path, batch_size=8, seed=2)
  assert changed is not datasets and changed.extra_info["num_examples"]["inner_valid"] == 11


def test_bad_directories_name_the_split_and_what_is_accepted(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    datasets_from_directory(tmp_path / "nowhere", batch_size=8)
  for name in SPLITS[:3]:
    np.savez(tmp_path / f"{name}.npz", **_arrays(10))
  with pytest.raises(FileNotFoundError, match=r"has no test.npz and no test/ folder of .npy files"):
    datasets_from_directory(tmp_path, batch_size=8)
  os.mkdir(tmp_path / "test")
  with pytest.raises(FileNotFoundError, match=r"holds no .npy files; split 'test' needs one file per array"):
    datasets_from_directory(tmp_path, batch_size=8)
  np.save(tmp_path / "test" / "x.npy", np.array([object()] * 10, dtype=object), allow_pickle=True)
  with pytest.raises(ValueError, match=r"split 'test': cannot read .*x.npy.*loaded without pickle"):
    datasets_from_directory(tmp_path, batch_size=8)
  np.savez(tmp_path / "test.npz", **_arrays(10))
  with pytest.raises(ValueError, match="has both test.npz and a test/ folder; keep one of them"):
    datasets_from_directory(tmp_path, batch_size=8)
  with pytest.raises(TypeError, match="path must be a directory path"):
    datasets_from_directory(3, batch_size=8)


def test_array_split_is_what_each_split_is():
  datasets = datasets_from_arrays(**_four(), batch_size=8, seed=4)
  assert all(isinstance(datasets.source(name), ArraySplit) for name in SPLITS)
  assert [datasets.source(name).seed for name in SPLITS] == [16, 17, 18, 19]
