"""The CIFAR-10 reader on small pickle files written here in the CIFAR-10 python layout, and the conv task on them."""

import collections
import os
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.datasets import cifar
from metafam.tasks.conv import cifar10_conv_task
from metafam.tasks._nn import num_params

PER_BATCH, TEST_SIZE = 10, 12


def _write_fake_cifar(directory, seed=0):
  """Writes data_batch_1..5 and test_batch; returns {file name: (uint8 images [N, 32, 32, 3] HWC, labels [N])}."""
  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)
  written = {}
  for name in cifar.TRAIN_FILES + (cifar.TEST_FILE,):
    n = TEST_SIZE if name == cifar.TEST_FILE else PER_BATCH
    images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, n)
    record = {b"batch_label": name.encode(), b"labels": labels.tolist(),
              b"data": images.transpose(0, 3, 1, 2).reshape(n, 3072),  # CHW rows, as in the real files
              b"filenames": [f"{name}_{i}.png".encode() for i in range(n)]}
    with open(os.path.join(directory, name), "wb") as f:
      pickle.dump(record, f, protocol=2)
    written[name] = (images, labels)
  return written


@pytest.fixture
def fake_dir(tmp_path):
  cifar.cifar10_datasets.cache_clear()
  yield str(tmp_path / "cifar-10-batches-py"), _write_fake_cifar(str(tmp_path / "cifar-10-batches-py"))
  cifar.cifar10_datasets.cache_clear()


def test_reader_recovers_images_labels_and_disjoint_splits(fake_dir):
  directory, written = fake_dir
  raw = cifar.read_cifar10_dir(directory)
  train_x = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 5)])
  train_y = np.concatenate([written[f"data_batch_{i}"][1] for i in range(1, 5)])
  test_x, test_y = written["test_batch"]
  expected = {"train": (train_x, train_y), "inner_valid": written["data_batch_5"],
              "outer_valid": (test_x[:6], test_y[:6]), "test": (test_x[6:], test_y[6:])}
  for split, (x, y) in expected.items():
    np.testing.assert_array_equal(raw[split][0], x)  # CHW rows -> HWC images, exactly
    np.testing.assert_array_equal(raw[split][1], y)
  assert [len(raw[s][0]) for s in ("train", "inner_valid", "outer_valid", "test")] == [40, 10, 6, 6]


def test_datasets_from_argument_env_and_parent_dir(fake_dir, monkeypatch):
  directory, written = fake_dir
  ds = cifar.cifar10_datasets(batch_size=8, data_dir=directory)
  assert ds.abstract_batch["image"].shape == (8, 32, 32, 3) and ds.abstract_batch["image"].dtype == jnp.float32
  assert ds.abstract_batch["label"].dtype == jnp.int32
  assert ds.extra_info["num_classes"] == 10 and ds.extra_info["channels"] == 3
  assert ds.extra_info["num_examples"] == {"train": 40, "inner_valid": 10, "outer_valid": 6, "test": 6}
  # Every train batch consists of train images (pixel / 255) with their own labels.
  train_x = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 5)]).astype(np.float32) / 255
  train_y = np.concatenate([written[f"data_batch_{i}"][1] for i in range(1, 5)])
  for _ in range(6):  # more than an epoch
    batch = next(ds.train)
    for image, label in zip(batch["image"], batch["label"]):
      match = np.flatnonzero(np.all(np.abs(train_x - image) < 1e-6, axis=(1, 2, 3)))
      assert len(match) == 1 and train_y[match[0]] == label
  test_x = written["test_batch"][0][6:].astype(np.float32) / 255
  batch = next(ds.test)
  assert all(np.any(np.all(np.abs(test_x - im) < 1e-6, axis=(1, 2, 3))) for im in batch["image"])

  assert cifar.cifar10_datasets(batch_size=8, data_dir=directory) is ds  # memoized
  parent = os.path.dirname(directory)
  from_parent = cifar.cifar10_datasets(batch_size=8, data_dir=parent)  # the folder holding cifar-10-batches-py
  np.testing.assert_array_equal(from_parent.source("inner_valid").arrays["image"],
                                ds.source("inner_valid").arrays["image"])
  monkeypatch.setenv(cifar.CIFAR10_ENV, directory)
  from_env = cifar.cifar10_datasets(batch_size=8)
  np.testing.assert_array_equal(from_env.source("test").arrays["label"], written["test_batch"][1][6:])


def test_normalizations_and_resizing(fake_dir):
  directory, written = fake_dir
  std = cifar.cifar10_datasets(batch_size=4, normalization="standardize", data_dir=directory)
  train = std.source("train").arrays["image"]
  np.testing.assert_allclose(train.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)  # per-channel training statistics
  np.testing.assert_allclose(train.std(axis=(0, 1, 2)), 1.0, atol=1e-3)
  centered = cifar.cifar10_datasets(batch_size=4, normalization="centered", data_dir=directory)
  x = centered.source("inner_valid").arrays["image"]
  np.testing.assert_allclose(x, written["data_batch_5"][0] / 127.5 - 1.0, atol=1e-6)
  small = cifar.cifar10_datasets(batch_size=4, image_size=16, data_dir=directory)
  x = small.source("train").arrays["image"]
  assert x.shape == (40, 16, 16, 3) and x.min() >= 0.0 and x.max() <= 1.0
  # Antialiased 2x downsampling of each channel roughly averages 2x2 blocks.
  blocks = written["data_batch_1"][0].astype(np.float32).reshape(PER_BATCH, 16, 2, 16, 2, 3).mean(axis=(2, 4)) / 255
  assert np.abs(x[:PER_BATCH] - blocks).mean() < 0.1


def test_missing_data_errors_name_what_was_looked_for(tmp_path, monkeypatch):
  monkeypatch.delenv(cifar.CIFAR10_ENV, raising=False)
  with pytest.raises(FileNotFoundError, match="METAFAM_CIFAR10_DIR"):
    cifar.cifar10_datasets()
  with pytest.raises(FileNotFoundError, match="does not exist"):
    cifar.cifar10_datasets(data_dir=str(tmp_path / "nope"))
  _write_fake_cifar(str(tmp_path))
  os.remove(tmp_path / "data_batch_5")
  os.remove(tmp_path / "test_batch")
  with pytest.raises(FileNotFoundError, match="missing data_batch_5, test_batch"):
    cifar.cifar10_datasets(data_dir=str(tmp_path))


def test_malformed_batches_are_clear_errors(tmp_path):
  path = str(tmp_path / "data_batch_1")
  for record, message in [({b"data": np.zeros((2, 3072), np.uint8)}, "b'labels'"),
                          ({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}, r"uint8\[2, 1024\]"),
                          ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, "labels must lie in 0..9")]:
    with open(path, "wb") as f:
      pickle.dump(record, f)
    with pytest.raises(ValueError, match=message):
      cifar.read_cifar10_batch(path)
  with open(path, "wb") as f:  # a pickle naming any other global (here a harmless one) is refused
    pickle.dump({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"extra": collections.OrderedDict()}, f)
  with pytest.raises(pickle.UnpicklingError, match="refusing to load collections.OrderedDict"):
    cifar.read_cifar10_batch(path)


def test_cifar_conv_task_runs_on_the_files(fake_dir):
  directory, _ = fake_dir
  task = cifar10_conv_task(data_dir=directory, batch_size=8)
  assert task.name == "cifar10_conv_32x32x3_16x32x64"
  assert num_params(jax.eval_shape(task.init, jax.random.key(0))) == 24234  # as the CIFAR-shaped registered task
  batch = next(task.datasets.train)
  with jax.threefry_partitionable(False):  # faster CPU compile; the values do not matter here
    loss, grad = jax.jit(lambda k, b: jax.value_and_grad(task.loss)(task.init(k), k, b))(jax.random.key(0), batch)
  # Global average pooling of small random features gives near-zero logits: CE ~ log 10 = 2.30.
  assert abs(float(loss) - np.log(10)) < 0.2
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grad))
