"""Datasets: four disjoint splits, abstract batches, seeding, caching, device sampling, IDX files, text."""

import os

import jax
import numpy as np
import pytest

from metafam.datasets.base import SPLITS, ArraySplit, Datasets, check_batch, dataset_lru_cache
from metafam.datasets.idx import read_idx, write_idx
from metafam.datasets.images import (embedded_fashion_mnist, fashion_mnist_datasets, mnist_datasets,
                                     read_mnist_style_dir)
from metafam.datasets.text import shakespeare_char_datasets, shakespeare_text


def _hashes(images):
  return {hash(x.tobytes()) for x in images}


def test_embedded_fashion_mnist_splits_are_disjoint_and_sized():
  raw = embedded_fashion_mnist()
  sizes = {k: len(v[0]) for k, v in raw.items()}
  assert sizes == {"train": 5000, "inner_valid": 1000, "outer_valid": 1000, "test": 1000}
  hashes = {k: _hashes(v[0]) for k, v in raw.items()}
  for i, a in enumerate(SPLITS):
    for b in SPLITS[i + 1:]:
      # Fashion-MNIST has a handful of exact duplicate images across its files; the splits come from disjoint
      # index ranges, so overlaps are at most those few duplicates.
      assert len(hashes[a] & hashes[b]) <= 5, (a, b)
  for _, labels in raw.values():
    assert set(np.unique(labels)) == set(range(10))  # every class in every split


@pytest.mark.parametrize("size", [8, 16, 28])
def test_image_batches_match_abstract_batch(size):
  ds = fashion_mnist_datasets(batch_size=32, image_size=size)
  assert ds.abstract_batch["image"].shape == (32, size, size, 1)
  assert ds.abstract_batch["image"].dtype == np.float32
  assert ds.abstract_batch["label"].dtype == np.int32
  for split in SPLITS:
    batch = next(ds.split(split))
    check_batch(batch, ds.abstract_batch)
    assert 0.0 <= batch["image"].min() and batch["image"].max() <= 1.0
  assert ds.extra_info["num_classes"] == 10


def test_preprocessing_options():
  centered = next(fashion_mnist_datasets(64, 8, normalization="centered", seed=3).train)["image"]
  assert centered.min() >= -1.0 and centered.max() <= 1.0 and centered.min() < -0.9
  std = fashion_mnist_datasets(512, 8, normalization="standardize").source("train").arrays["image"]
  assert abs(std.mean()) < 1e-3 and abs(std.std() - 1.0) < 1e-3
  rgb = next(fashion_mnist_datasets(4, 32, channels=3).test)["image"]
  assert rgb.shape == (4, 32, 32, 3)
  np.testing.assert_array_equal(rgb[..., 0], rgb[..., 2])
  # Resizing preserves the mean intensity (antialiased linear resize averages pixels).
  full = fashion_mnist_datasets(8, 28).source("test").arrays["image"]
  small = fashion_mnist_datasets(8, 8).source("test").arrays["image"]
  assert abs(full.mean() - small.mean()) < 0.01
  with pytest.raises(ValueError, match="normalization must be one of"):
    fashion_mnist_datasets(8, 8, normalization="zscore")
  with pytest.raises(ValueError, match="channels must be 1 or 3"):
    fashion_mnist_datasets(8, 8, channels=2)


def test_same_seed_same_batches_and_epochs_cover_the_split():
  arrays = {"x": np.arange(10, dtype=np.float32), "y": np.arange(10, dtype=np.int32) * 2}
  a, b, c = ArraySplit(arrays, 4, seed=1), ArraySplit(arrays, 4, seed=1), ArraySplit(arrays, 4, seed=2)
  batches_a = [next(a) for _ in range(5)]
  batches_b = [next(b) for _ in range(5)]
  batches_c = [next(c) for _ in range(5)]
  for x, y in zip(batches_a, batches_b):
    np.testing.assert_array_equal(x["x"], y["x"])
  assert any(not np.array_equal(x["x"], y["x"]) for x, y in zip(batches_a, batches_c))
  first_epoch = np.concatenate([bt["x"] for bt in batches_a])[:10]
  assert sorted(first_epoch.tolist()) == list(range(10))  # each example once per epoch
  for bt in batches_a:
    np.testing.assert_array_equal(bt["y"], bt["x"].astype(np.int32) * 2)  # leaves stay aligned


def test_builder_seeds_differ_per_split_and_are_reproducible():
  ds1 = fashion_mnist_datasets(16, 8, seed=11)
  fashion_mnist_datasets.cache_clear()
  ds2 = fashion_mnist_datasets(16, 8, seed=11)
  assert ds1 is not ds2
  np.testing.assert_array_equal(next(ds1.train)["label"], next(ds2.train)["label"])


def test_cache_returns_same_object_and_is_bounded():
  calls = []

  @dataset_lru_cache(maxsize=2)
  def build(n, scale=1.0):
    calls.append(n)
    return object()

  a = build(1)
  assert build(1) is a and build(n=1, scale=1.0) is a
  build(2), build(3)  # evicts 1
  assert build(1) is not a
  assert calls == [1, 2, 3, 1]
  assert build.cache_info()["size"] == 2
  assert fashion_mnist_datasets(32, 8) is fashion_mnist_datasets(batch_size=32, image_size=8)
  with pytest.raises(TypeError, match="hashable"):
    build([1])


def test_missing_split_and_bad_batch_are_clear_errors():
  split = ArraySplit({"x": np.zeros((8, 2), np.float32)}, 2)
  with pytest.raises(ValueError, match="missing split 'outer_valid'"):
    Datasets(train=split, inner_valid=split, outer_valid=None, test=split)
  with pytest.raises(TypeError, match="split 'test' must be an iterator"):
    Datasets(train=split, inner_valid=split, outer_valid=split, test=[1, 2])

  def gen(shape, dtype=np.float32):
    while True:
      yield {"x": np.zeros(shape, dtype)}

  ds = Datasets(train=gen((2, 2)), inner_valid=gen((2, 3)), outer_valid=gen((2, 2), np.int32), test=gen((2, 2)))
  assert ds.abstract_batch["x"].shape == (2, 2)  # inferred from the first train batch, which is still served
  assert next(ds.train)["x"].shape == (2, 2)
  with pytest.raises(ValueError, match=r"split 'inner_valid' leaf \['x'\] is float32\[2, 3\].*float32\[2, 2\]"):
    next(ds.inner_valid)
  with pytest.raises(ValueError, match=r"leaf \['x'\] is int32\[2, 2\]"):
    next(ds.outer_valid)
  with pytest.raises(TypeError, match="no device path"):
    ds.device_data("train")
  with pytest.raises(ValueError, match="Unknown split"):
    ds.split("validation")


def test_device_sampling_inside_jit_draws_real_examples():
  ds = fashion_mnist_datasets(64, 8)
  data = ds.device_data("train")
  assert data is ds.device_data("train")  # transferred once
  assert isinstance(data.arrays["image"], jax.Array)

  @jax.jit
  def draw(d, key):
    return d.sample(key)

  b1, b2 = draw(data, jax.random.key(0)), draw(data, jax.random.key(1))
  check_batch(jax.tree.map(np.asarray, b1), ds.abstract_batch)
  assert not np.array_equal(b1["label"], b2["label"])
  stored = _hashes(ds.source("train").arrays["image"])
  assert _hashes(np.asarray(b1["image"])) <= stored
  # Uniform sampling: label frequencies over many draws match the split's (10 classes, ~10% each).
  labels = np.concatenate([np.asarray(draw(data, jax.random.key(i))["label"]) for i in range(50)])
  freq = np.bincount(labels, minlength=10) / len(labels)
  assert np.all(np.abs(freq - 0.1) < 0.03)


def test_idx_round_trip(tmp_path):
  rng = np.random.default_rng(0)
  for name, arr in [("a-idx3-ubyte.gz", rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)),
                    ("b-idx1-ubyte", rng.integers(0, 10, (7,), dtype=np.uint8)),
                    ("c.idx", rng.standard_normal((2, 3)).astype(np.float32)),
                    ("d.idx.gz", rng.integers(-1000, 1000, (4,), dtype=np.int32))]:
    path = str(tmp_path / name)
    write_idx(path, arr)
    back = read_idx(path)
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)
  with open(tmp_path / "c.idx", "rb") as f:
    raw = f.read()
  assert raw[:4] == bytes([0, 0, 0x0D, 2])  # float32, 2 dimensions
  (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
  with pytest.raises(ValueError, match="not an IDX file"):
    read_idx(str(tmp_path / "bad"))
  (tmp_path / "short").write_bytes(raw[:-4])
  with pytest.raises(ValueError, match="header says shape"):
    read_idx(str(tmp_path / "short"))


def _write_fake_mnist(directory, n_train=60, n_test=20):
  rng = np.random.default_rng(1)
  os.makedirs(directory, exist_ok=True)
  for part, n in [("train", n_train), ("t10k", n_test)]:
    write_idx(os.path.join(directory, f"{part}-images-idx3-ubyte.gz"),
              rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
    write_idx(os.path.join(directory, f"{part}-labels-idx1-ubyte.gz"), np.arange(n, dtype=np.uint8) % 10)


def test_full_dataset_directory_via_argument_and_env(tmp_path, monkeypatch):
  _write_fake_mnist(str(tmp_path / "mnist"))
  raw = read_mnist_style_dir(str(tmp_path / "mnist"))
  assert {k: len(v[0]) for k, v in raw.items()} == {"train": 50, "inner_valid": 10, "outer_valid": 10, "test": 10}
  ds = mnist_datasets(batch_size=5, image_size=28, data_dir=str(tmp_path / "mnist"))
  assert next(ds.test)["image"].shape == (5, 28, 28, 1)
  monkeypatch.setenv("METAFAM_FASHION_MNIST_DIR", str(tmp_path / "mnist"))
  ds = fashion_mnist_datasets(batch_size=5, image_size=8, data_dir="full")
  assert ds.extra_info["num_examples"]["train"] == 50
  monkeypatch.setenv("METAFAM_FASHION_MNIST_DIR", str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="nowhere.*METAFAM_FASHION_MNIST_DIR"):
    fashion_mnist_datasets(batch_size=5, image_size=8, data_dir="full")
  with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
    os.makedirs(tmp_path / "empty")
    read_mnist_style_dir(str(tmp_path / "empty"))


def test_shakespeare_splits_are_disjoint_and_shifted():
  text = shakespeare_text()
  assert len(text) > 1_000_000 and "To be, or not to be" in text
  ds = shakespeare_char_datasets(batch_size=8, sequence_length=32)
  vocab = ds.extra_info["vocab"]
  assert ds.extra_info["vocab_size"] == len(vocab) == len(set(text))
  assert ds.abstract_batch["obs"].shape == (8, 32) and ds.abstract_batch["obs"].dtype == np.int32
  sizes = ds.extra_info["num_examples"]
  assert sizes["train"] > 10 * sizes["inner_valid"]
  windows = {}
  for split in SPLITS:
    batch = next(ds.split(split))
    np.testing.assert_array_equal(batch["obs"][:, 1:], batch["target"][:, :-1])
    arrays = ds.source(split).arrays
    windows[split] = {"".join(vocab[i] for i in row) for row in arrays["obs"][:200]}
    decoded = "".join(vocab[i] for i in batch["obs"][0])
    assert decoded in text
  for i, a in enumerate(SPLITS):
    for b in SPLITS[i + 1:]:
      assert not windows[a] & windows[b]
