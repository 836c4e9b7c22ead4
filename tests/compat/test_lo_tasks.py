"""The reference's ``tasks`` package under the compat prefix: datasets offline, fixed tasks, ES, cfgobject, parametric.

Known answers: LO's abstract batches (shapes/dtypes written out from its dataset functions), parameter counts in
closed form (via `jax.eval_shape`, so even the 16384-wide MLP costs nothing), ES estimates against exact gradients
(statistically), hashes by their definition (MD5), initializer spreads against their formulas.
"""

import hashlib
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metafam._registry import UnknownNameError
from metafam.compat.learned_optimization.tasks import base, es_wrapper
from metafam.compat.learned_optimization.tasks.datasets import base as dbase
from metafam.compat.learned_optimization.tasks.datasets import image, language
from metafam.compat.learned_optimization.tasks.fixed import all as fixed_all
from metafam.compat.learned_optimization.tasks.fixed import (conv, es_wrapped, image_mlp, image_mlp_ae, mlp_mixer,
                                                             resnet, rnn_lm, transformer_lm, vit)
from metafam.compat.learned_optimization.tasks.parametric import cfgobject
from metafam.compat.learned_optimization.tasks.parametric import image_mlp as p_image_mlp
from metafam.compat.learned_optimization.tasks.parametric import parametric_utils as pu
from metafam.tasks import vision
from metafam.tasks._nn import num_params
from metafam.tasks.resnet import resnet_num_params

KEY = jax.random.PRNGKey(0)

# LO's (num_classes, channels) per dataset function, and the image side its default `image_size` gives.
LO_IMAGE = {"fashion_mnist": (10, 1, 28), "mnist": (10, 1, 28), "cifar10": (10, 3, 32), "cifar100": (100, 3, 32),
            "imagenet16": (1000, 3, 16), "imagenet32": (1000, 3, 32), "ImageNet64": (1000, 3, 64),
            "Food101_64": (101, 3, 64), "Cifar100": (100, 3, 32)}


def _zeros(abstract):
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract)


def _shapes(tree):
  return jax.tree.map(lambda x: (tuple(x.shape), np.dtype(x.dtype)), tree)


def _dense(widths):
  return sum((a + 1) * b for a, b in zip(widths[:-1], widths[1:]))


def _param_count(task):
  params, _ = jax.eval_shape(task.init_with_state, KEY)
  return num_params(params)


# -- datasets ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("side,stack", [(8, 1), (28, 1), (16, 3)])
def test_fashion_mnist_batches_match_los_abstract_batch(side, stack):
  d = image.fashion_mnist_datasets(16, image_size=(side, side), stack_channels=stack)
  want = {"image": ((16, side, side, stack), np.dtype("float32")), "label": ((16,), np.dtype("int32"))}
  assert _shapes(d.abstract_batch) == want
  for split in ("train", "inner_valid", "outer_valid", "test"):
    batch = next(d.split(split))
    assert _shapes(batch) == want
    assert 0.0 <= batch["image"].min() and batch["image"].max() <= 1.0  # LO scales by 1/255
    assert set(np.unique(batch["label"])) <= set(range(10))
  assert d.extra_info["num_classes"] == 10
  assert d is image.fashion_mnist_datasets(16, image_size=[side, side], stack_channels=stack)  # memoized


@pytest.mark.parametrize("fn,name,classes,channels,side", [
    (image.cifar100_datasets, "cifar100", 100, 3, 32), (image.svhn_cropped_datasets, "svhn_cropped", 10, 3, 32),
    (image.food101_datasets, "food101", 101, 3, 32), (image.imagenet8_datasets, "imagenet2012_8", 1000, 3, 8),
    (image.imagenet64_datasets, "imagenet2012_64", 1000, 3, 64), (image.cifar10_datasets, "cifar10", 10, 3, 32),
    (image.mnist_datasets, "mnist", 10, 1, 28)])
def test_unavailable_image_datasets_raise_only_when_a_batch_is_requested(fn, name, classes, channels, side,
                                                                         monkeypatch):
  monkeypatch.delenv("METAFAM_CIFAR10_DIR", raising=False)
  monkeypatch.delenv("METAFAM_MNIST_DIR", raising=False)
  d = fn(4)  # construction reads nothing and does not fail
  assert _shapes(d.abstract_batch) == {"image": ((4, side, side, channels), np.dtype("float32")),
                                       "label": ((4,), np.dtype("int32"))}
  assert d.extra_info["num_classes"] == classes
  splits = [d.train, d.inner_valid, d.outer_valid, d.test]  # reading a split is no request (LO's tests do it)
  with pytest.raises(dbase.DatasetUnavailableError, match=name) as e:
    next(splits[0])
  assert "METAFAM_" in str(e.value) or "Datasets" in str(e.value)  # says how to supply it
  with pytest.raises(dbase.DatasetUnavailableError, match=name):
    next(splits[3])


def _write_fake_cifar10(directory, per_file, monkeypatch):
  """CIFAR-10's python-pickle files (5 train batches and a test batch of ``per_file`` random images, every class
  present) in ``directory``, which ``METAFAM_CIFAR10_DIR`` then names."""
  import pickle
  rng = np.random.default_rng(0)
  for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    with open(directory / name, "wb") as f:
      pickle.dump({b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
                   b"labels": list(range(10)) * (per_file // 10)}, f)
  monkeypatch.setenv("METAFAM_CIFAR10_DIR", str(directory))


def test_cifar10_black_and_white_is_read_from_the_directory_in_the_environment(tmp_path, monkeypatch):
  _write_fake_cifar10(tmp_path, 20, monkeypatch)
  d = image.cifar10_datasets(4, image_size=(32, 32), convert_to_black_and_white=True)
  batch = next(d.train)
  assert _shapes(batch) == _shapes(d.abstract_batch) == {"image": ((4, 32, 32, 1), np.dtype("float32")),
                                                         "label": ((4,), np.dtype("int32"))}
  dbase.dataset_lru_cache_clear()


def test_image_dataset_arguments_are_checked_before_any_work():
  with pytest.raises(ValueError, match="image_size"):
    image.fashion_mnist_datasets(8, image_size=(8,))
  with pytest.raises(ValueError, match="square"):
    image.fashion_mnist_datasets(8, image_size=(8, 12))
  with pytest.raises(ValueError, match="stack_channels"):
    image.fashion_mnist_datasets(8, stack_channels=2)
  with pytest.raises(ValueError, match="batch_size"):
    image.fashion_mnist_datasets(0)
  with pytest.raises(ValueError, match="normalize_mean"):
    image.cifar10_datasets(8, normalize_mean=(1.0, np.nan, 2.0), normalize_std=(1.0, 1.0, 1.0))
  with pytest.raises(ValueError, match="data_fraction"):
    image.cifar100_datasets(8, data_fraction=0.0)
  with pytest.raises(ValueError, match="datasetname"):
    dbase.tfds_image_classification_datasets("kmnist", ("a", "b", "c", "d"), 8, (8, 8))


@pytest.mark.parametrize("fn,vocab", [(language.lm1b_32k_datasets, 32100), (language.lm1b_bytes_datasets, 259),
                                      (language.wikipedia_en_32k_datasets, 32100),
                                      (language.wikipedia_en_bytes_datasets, 259)])
def test_language_datasets_have_los_abstract_batch_and_fail_only_on_batches(fn, vocab):
  d = fn(4, 16)
  assert _shapes(d.abstract_batch) == {"obs": ((4, 16), np.dtype("int32")), "target": ((4, 16), np.dtype("int32"))}
  assert d.extra_info["vocab_size"] == vocab
  corpus = fn.__name__.rsplit("_", 2)[0]
  with pytest.raises(dbase.DatasetUnavailableError, match=rf"{corpus} \({vocab}-token vocabulary\)"):
    next(d.outer_valid)


def test_byte_vocabulary_is_utf8_offset_by_three_special_ids():
  v = language.get_bytes_vocab()
  assert v.vocab_size == 259 and v.encode("A") == [ord("A") + 3]
  assert v.decode(v.encode("héllo")) == "héllo"
  with pytest.raises(dbase.DatasetUnavailableError, match="SentencePiece"):
    language.get_32k_sentence_piece_vocab()


def test_lazy_iterator_lazy_dataset_and_datasets_map():
  calls = []
  it = dbase.LazyIterator(lambda: (calls.append(1), iter(range(3)))[1])
  assert calls == []
  assert list(it) == [0, 1, 2] and calls == [1]
  lazy = dbase.LazyDataset(lambda: (calls.append(2), image.fashion_mnist_datasets(4, (8, 8)))[1])
  assert calls == [1]
  assert lazy.abstract_batch["image"].shape == (4, 8, 8, 1) and calls == [1, 2]
  next(lazy.train)
  assert calls == [1, 2]  # built once
  doubled = dbase.datasets_map(lambda b: {"image": 2 * b["image"], "label": b["label"]}, lazy)
  assert next(doubled.test)["image"].max() <= 2.0
  assert dbase.get_tfrecord_data_dir().endswith("tensorflow_datasets") or "TFDS_DATA_DIR" in __import__("os").environ


# -- base --------------------------------------------------------------------------------------------------------
def test_softmax_cross_entropy_matches_optax_and_lookups_fail_clearly():
  logits = jax.random.normal(KEY, (5, 7))
  labels = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(1), (5, 7)))
  np.testing.assert_allclose(base.softmax_cross_entropy(logits=logits, labels=labels),
                             optax.softmax_cross_entropy(logits, labels), rtol=1e-6)
  with pytest.raises(UnknownNameError, match="ImageMLP_FashionMnist8_Relu32"):
    base.get_task_from_name("NoSuchTask")
  assert base.get_task_from_name("ImageMLP_FashionMnist8_Relu32").name == "ImageMLP_FashionMnist8_Relu32"
  family = base.sample_task_family_from_task_fns(KEY, ["ImageMLP_FashionMnist8_Relu32"])
  assert family.task_fn(family.sample(KEY)).name == "ImageMLP_FashionMnist8_Relu32"
  with pytest.raises(ValueError, match="exactly one"):
    base.get_task()
  assert base.get_task(task_family=family, task_family_seed=3).name == "ImageMLP_FashionMnist8_Relu32"
  with pytest.raises(ValueError, match="TaskFamily"):
    base.sample_single_task_family(KEY, "not a family")


# -- fixed tasks -------------------------------------------------------------------------------------------------
def _expected_image_params(dataset, side, channels_in, hidden, num_classes, norm):
  return _dense((side * side * channels_in,) + tuple(hidden) + (num_classes,)) + (2 * sum(hidden) if norm else 0)


HEAVY_MODULES = ("resnet", "vit", "mlp_mixer", "transformer_lm")


@pytest.mark.parametrize("module", [
    m if m not in HEAVY_MODULES else pytest.param(m, marks=pytest.mark.slow)
    for m in ("image_mlp", "conv", "image_mlp_ae", "rnn_lm", "es_wrapped") + HEAVY_MODULES])
def test_every_fixed_task_builds_without_data_and_has_its_closed_form_parameter_count(module, monkeypatch):
  from metafam.datasets import cifar, images
  def refuse(*args, **kwargs):
    raise AssertionError("data was read while building or initializing a task")
  dbase.dataset_lru_cache_clear()
  for name in ("embedded_fashion_mnist", "read_mnist_style_dir"):
    monkeypatch.setattr(images, name, refuse)
  monkeypatch.setattr(cifar, "read_cifar10_dir", refuse)
  counted = 0
  names = getattr(fixed_all, module).TASKS
  for name in names:
    fn = fixed_all.FIXED_TASKS[name]
    if "FashionMnist" in name:
      continue  # served by metafam: these read the embedded data on construction, as LO's preload does
    task = fn()
    assert task.name == name
    count = _param_count(task)
    if name in image_mlp.TASKS:
      dataset, _, side, hidden, _, options = image_mlp.TASKS[name]
      classes, channels, _ = LO_IMAGE[dataset]
      channels = 1 if options.get("bw") else channels
      assert count == _expected_image_params(dataset, side, channels, hidden, classes, options.get("norm")), name
    elif name in conv.TASKS:
      dataset, _, side, widths, _, norm = conv.TASKS[name]
      classes, channels, _ = LO_IMAGE[dataset]
      w = (channels,) + widths
      want = sum((9 * a + 1) * b for a, b in zip(w[:-1], w[1:])) + (w[-1] + 1) * classes
      assert count == want + (2 * sum(widths) if norm else 0), name
    elif name in image_mlp_ae.TASKS:
      dataset, _, hidden = image_mlp_ae.TASKS[name]
      _, channels, side = LO_IMAGE[dataset]
      d = side * side * channels
      assert count == _dense((d,) + hidden + (d,)), name
    elif name in es_wrapped.TASKS:
      assert count == _param_count(image_mlp.build(es_wrapped.TASKS[name][0])), name
    elif name in rnn_lm.TASKS:
      dataset, _, _, core, h, e = rnn_lm.TASKS[name]
      v = 259 if dataset.endswith("bytes") else 32100
      cores = {"LSTM": 4 * h * (e + h) + 4 * h + 2 * h, "GRU": 3 * h * (e + h) + 3 * h + h,
               "VanillaRNN": (e + 1) * h + (h + 1) * h + h, "IRNN": (e + 1) * h + (h + 1) * h + h}
      assert count == v * e + cores[core] + (h + 1) * v, name
    elif name in transformer_lm.TASKS:
      c, v = transformer_lm.TASKS[name], 32100
      d, L, H = c["d_model"], c["num_layers"], c["num_heads"]
      block = 4 * d + (d + 1) * 3 * 32 * H + (32 * H + 1) * d + (d + 1) * 4 * d + (4 * d + 1) * d
      assert count == v * d + L * block + 2 * d + (d + 1) * v, name
    elif name in vit.TASKS:
      cfg_fn, dataset, _ = vit.TASKS[name]
      c, (k, ch, side) = cfg_fn(), LO_IMAGE[dataset]
      t = c["transformer"]
      assert count == vision.vit_num_params((side, side, ch), k, 16, c["hidden_size"], t["num_layers"],
                                            t["mlp_dim"]), name
    elif name in mlp_mixer.TASKS:
      cfg_fn, dataset, _ = mlp_mixer.TASKS[name]
      c, (k, ch, side) = cfg_fn(), LO_IMAGE[dataset]
      assert count == vision.mlp_mixer_num_params((side, side, ch), k, 16, c["hidden_dim"], c["num_blocks"],
                                                  c["tokens_mlp_dim"], c["channels_mlp_dim"]), name
    elif name in resnet.TASKS:
      c = resnet.TASKS[name]
      assert count == resnet_num_params(3, 1000, c["blocks_per_group"], c["channels_per_group"],
                                        c["use_projection"], 64, c["initial_conv_kernel_size"]), name
    else:
      pytest.fail(f"{name}: no closed form in this test")
    counted += 1
    with pytest.raises(dbase.DatasetUnavailableError):
      next(task.datasets.train)
  assert counted == sum("FashionMnist" not in n for n in names) > 0


def test_the_fixed_task_table_has_every_reference_name():
  sizes = {m: len(getattr(fixed_all, m).TASKS) for m in ("image_mlp", "conv", "image_mlp_ae", "rnn_lm", "es_wrapped",
                                                          "transformer_lm", "resnet", "vit", "mlp_mixer", "lopt")}
  assert sizes == {"image_mlp": 27, "conv": 11, "image_mlp_ae": 6, "rnn_lm": 14, "es_wrapped": 6,
                   "transformer_lm": 16, "resnet": 11, "vit": 6, "mlp_mixer": 9, "lopt": 23}
  assert len(fixed_all.FIXED_TASKS) == sum(sizes.values()) == 129
  assert all(callable(getattr(fixed_all, name)) for name in fixed_all.FIXED_TASKS)


@pytest.mark.parametrize("name,shape", [
    ("ImageMLP_FashionMnist_Relu128x128", (128, 28, 28, 1)), ("ImageMLP_FashionMnist8_Relu32", (128, 8, 8, 1)),
    ("ImageMLP_FashionMnist16_Relu32", (128, 16, 16, 1)), ("ImageMLP_FashionMnist32_Relu32", (128, 32, 32, 1)),
    ("ImageMLPAE_FashionMnist_128x32x128_bs128", (128, 28, 28, 1)),
    ("ESWrapped_1pair_ImageMLP_FashionMnist8_Relu32", (128, 8, 8, 1))])
def test_offline_fixed_tasks_give_a_finite_loss_on_a_real_batch_of_los_shape(name, shape):
  task = fixed_all.FIXED_TASKS[name]()
  batch = next(task.datasets.train)
  assert _shapes(batch) == _shapes(task.datasets.abstract_batch) == {
      "image": (shape, np.dtype("float32")), "label": ((shape[0],), np.dtype("int32"))}
  params, state = task.init_with_state(KEY)
  loss, _ = jax.jit(task.loss_with_state)(params, state, KEY, batch)
  assert np.isfinite(loss)
  if "AE" in name:
    assert 0.0 < loss < 0.5 and task.normalizer(loss) == loss  # squared error of sigmoid outputs in [0, 1]
  else:
    assert abs(loss - math.log(10)) < 1.0  # near chance at initialization
    assert 0.0 <= task.normalizer(loss) <= 1.5 * math.log(10)


@pytest.mark.parametrize("name", [
    "Conv_Cifar10_8_16x32", "ImageMLP_Cifar10_128x128x128_BatchNorm_Relu",
    pytest.param("Conv_Cifar10_32x64x64_batchnorm", marks=pytest.mark.slow),
    pytest.param("ImageMLP_Cifar10BW8_Relu32", marks=pytest.mark.slow),
    pytest.param("ImageMLP_Cifar10_128x128x128_LayerNorm_Tanh", marks=pytest.mark.slow),
    pytest.param("RNNLM_lm1bbytes_Patch32_GRU128_Embed64", marks=pytest.mark.slow),
    pytest.param("RNNLM_lm1bbytes_Patch32_IRNN128_Embed64", marks=pytest.mark.slow),
    pytest.param("VIT_Cifar100_skinnydeep", marks=pytest.mark.slow),
    pytest.param("MLPMixer_Cifar100_tiny16", marks=pytest.mark.slow),
    pytest.param("Resnet_MultiRuntime_0", marks=pytest.mark.slow),
    pytest.param("TransformerLM_LM1B_MultiRuntime_2", marks=pytest.mark.slow)])
def test_unavailable_tasks_run_on_batches_shaped_like_their_abstract_batch(name):
  if True:
    task = fixed_all.FIXED_TASKS[name]()
    params, state = task.init_with_state(KEY)
    batch = jax.tree.map(jnp.ones_like, _zeros(task.datasets.abstract_batch))  # token 1: no padding
    loss, new_state = task.loss_with_state(params, state, KEY, batch)
    assert np.isfinite(loss), name
    if "batchnorm" in name.lower():  # one update of the running mean and variance of each of the 3 norm layers
      assert [int(v["counter"]) for v in new_state.values()] == [1] * 6


def test_mse_and_dropout_variants_follow_their_definitions():
  task = image_mlp.build("ImageMLP_Cifar10_128x128_Dropout05_Relu_MSE")
  params = task.init(KEY)
  batch = {"image": jax.random.uniform(KEY, (128, 32, 32, 3)), "label": jnp.arange(128, dtype=jnp.int32) % 10}
  losses = [task.loss(params, jax.random.PRNGKey(i), batch) for i in range(2)]
  assert losses[0] != losses[1]  # dropout masks follow the loss key
  logits = task.net.apply(params, batch["image"], 0, jax.random.PRNGKey(0))
  want = jnp.mean(jnp.square(logits - jax.nn.one_hot(batch["label"], 10)))
  np.testing.assert_allclose(losses[0], want, rtol=1e-6)
  assert task.normalizer(jnp.asarray(0.05)) == pytest.approx(0.5) and task.normalizer(jnp.nan) == 10.0


@pytest.mark.slow
def test_rnn_lm_loss_is_the_cross_entropy_over_non_padding_tokens():
  import haiku as hk
  task = rnn_lm.TeacherForcedRNNLM(lambda: hk.VanillaRNN(16), 8, None, language.lm1b_bytes_datasets(8, 12))
  params = task.init(KEY)
  obs = jax.random.randint(KEY, (8, 12), 1, 259).at[:, 9:].set(0)
  target = jax.random.randint(jax.random.PRNGKey(1), (8, 12), 0, 259)
  logits = task.net.apply(params, obs)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), target[..., None], -1)[..., 0]
  np.testing.assert_allclose(task.loss(params, KEY, {"obs": obs, "target": target}), jnp.mean(nll[:, :9]),
                             rtol=1e-5)


# -- ES ----------------------------------------------------------------------------------------------------------
def test_es_gradient_of_a_quadratic_is_unbiased_and_its_value_is_the_smoothed_loss():
  # f(x) = sum(x^2): f(x + e) - f(x - e) = 4 x.e, so each pair estimates e e^T 2x / std^2 (mean 2x, per-entry
  # variance (|2x|^2 + (2x_i)^2)); E[f(x +- e)] = f(x) + d std^2 exactly.
  x = jnp.asarray([1.0, -2.0, 0.5])
  n, std = 4000, 0.1
  (value, aux), grad = es_wrapper.multi_antithetic_es_value_and_grad(
      lambda p: (jnp.sum(p ** 2), {"s": jnp.sum(p)}), has_aux=True, std=std, n_pairs=n)(x, es_key=KEY)
  g = 2 * x
  sigma = np.sqrt((np.sum(g ** 2) + g ** 2) / n)
  assert np.all(np.abs(grad - g) < 5 * sigma)
  assert abs(value - (jnp.sum(x ** 2) + 3 * std ** 2)) < 5 * np.sqrt(2 * 4 * np.sum(x ** 2) * std ** 2 / (2 * n))
  assert jnp.shape(aux["s"]) == ()
  with pytest.raises(ValueError, match="es_key"):
    es_wrapper.antithetic_es_value_and_grad(jnp.sum)(x)


def test_es_task_replaces_the_gradient_but_not_the_loss():
  task = es_wrapped.build("ESWrapped_1pair_ImageMLP_FashionMnist8_Relu32")
  inner = image_mlp.build("ImageMLP_FashionMnist8_Relu32")
  params = inner.init(KEY)
  batch = next(inner.datasets.train)
  assert task.loss(params, KEY, batch) == inner.loss(params, KEY, batch)
  es_grad = jax.jit(jax.grad(task.loss))(params, KEY, batch)
  true_grad = jax.jit(jax.grad(inner.loss))(params, KEY, batch)
  flat = lambda t: jnp.concatenate([jnp.ravel(v) for v in jax.tree.leaves(t)])
  g, true = flat(es_grad), flat(true_grad)
  # One pair: g = e (f(x+e) - f(x-e)) / (2 std^2) ~ e (e . grad f) / std^2, so g . grad f = (e . grad f)^2 / std^2
  # >= 0, and with u = g / |g| (= +-e / |e|, |e|^2 ~ d std^2 within 3% for d = 2,410): |g| ~ d |u . grad f|.
  u = g / jnp.linalg.norm(g)
  assert jnp.dot(g, true) > 0
  assert abs(float(jnp.linalg.norm(g) / (g.size * jnp.abs(jnp.dot(u, true)))) - 1) < 0.15
  assert abs(float(jnp.dot(u, true) / jnp.linalg.norm(true))) < 0.5  # a random direction, not backpropagation


def test_es_task_family_wraps_each_sample():
  family = es_wrapper.ESTaskFamily(base.single_task_to_family(image_mlp.build("ImageMLP_FashionMnist8_Relu32")),
                                   std=0.01, n_pairs=2)
  cfg = family.sample(KEY)
  assert isinstance(cfg, cfgobject.CFGNamed) and cfg.name == "ESTaskFamily"
  assert isinstance(family.task_fn(cfg), es_wrapper.ESTask) and family.name.startswith("ES_")


# -- cfgobject ---------------------------------------------------------------------------------------------------
def _md5_id(s):
  return int(hashlib.md5(s.encode()).hexdigest(), 16) % (2 ** 30)


def test_cfgobject_flattens_featurizes_and_serializes_without_pickle():
  cfg = cfgobject.CFGObject("ParametricImageMLP", {
      "hidden_layers": cfgobject.LogFeature([16, 16]), "num_classes": 10, "act": "relu",
      "secret": cfgobject.DoNotFeaturize(0.3, ("time",)),
      "datasets": cfgobject.CFGObject("fashion_mnist_datasets", {"batch_size": 8, "image_size": (8, 8)})})
  flat = cfgobject.flatten_cfg(cfg, "time")
  assert set(flat) == {"//ParametricImageMLP/hidden_layers", "//ParametricImageMLP/num_classes",
                       "//ParametricImageMLP/act", "//ParametricImageMLP/datasets/fashion_mnist_datasets/batch_size",
                       "//ParametricImageMLP/datasets/fashion_mnist_datasets/image_size"}
  np.testing.assert_allclose(flat["//ParametricImageMLP/hidden_layers"], np.log([16, 16]))
  assert "//ParametricImageMLP/secret" in cfgobject.flatten_cfg(cfg, "valid")
  ids, floats, ints = cfgobject.featurize(cfg, feature_type="time")
  assert ids.shape == (5, 8) and floats.shape == (5, 8) and ints.shape == (5,)
  rows = sorted(flat)
  act = rows.index("//ParametricImageMLP/act")
  assert list(np.asarray(ids[act][:2])) == [_md5_id("ParametricImageMLP"), _md5_id("act")]
  assert int(ints[act]) == _md5_id("relu") and int(ints[rows.index("//ParametricImageMLP/num_classes")]) == 10
  ids2, floats2, ints2, mask = cfgobject.featurize_many([cfg, cfgobject.CFGNamed("x", {"a": 1.5})],
                                                        feature_type="time")
  assert ids2.shape == (2, 5, 8) and mask.tolist() == [[1] * 5, [1, 0, 0, 0, 0]]
  assert float(floats2[1, 0, 0]) == 1.5
  with pytest.raises(ValueError, match="max_length"):
    cfgobject.featurize_many([cfg], max_length=3)
  assert cfgobject.deserialize_cfg(cfgobject.serialize_cfg(cfg)) == cfg
  assert cfgobject.serialize_cfg(cfg).startswith(b"{")
  with pytest.raises(ValueError, match="deserialize_cfg"):
    cfgobject.deserialize_cfg(b"\x80\x04K\x01.")  # a pickle is refused, not run
  built = cfgobject.object_from_config(cfg.kwargs["datasets"])
  assert built.abstract_batch["image"].shape == (8, 8, 8, 1)
  with pytest.raises(ValueError, match="registry"):
    cfgobject.object_from_config(cfgobject.CFGObject("os.system", {}))


def test_object_from_config_builds_a_projects_gin_configurable_as_the_reference_does(monkeypatch):
  gin = pytest.importorskip("gin")

  @gin.configurable("MetafamCompatGinProbe", module="metafam_compat_test")
  class Probe:
    def __init__(self, param):
      self.param = param

  nested = cfgobject.CFGObject("MetafamCompatGinProbe", {"param": cfgobject.CFGObject("MetafamCompatGinProbe",
                                                                                       {"param": 222})})
  obj = cfgobject.object_from_config(nested)
  assert isinstance(obj, Probe) and isinstance(obj.param, Probe) and obj.param.param == 222
  assert obj.cfg == nested
  with pytest.raises(ValueError, match="nor a gin configurable"):
    cfgobject.object_from_config(cfgobject.CFGObject("NoSuchGinName", {}))
  # Without gin imported by the caller, gin is neither consulted nor imported.
  monkeypatch.delitem(sys.modules, "gin")
  with pytest.raises(ValueError, match="registry") as info:
    cfgobject.object_from_config(cfgobject.CFGObject("MetafamCompatGinProbe", {"param": 1}))
  assert "gin" not in str(info.value) and "gin" not in sys.modules


def test_cfg_objects_are_pytrees_with_static_names():
  cfg = cfgobject.CFGNamed("fam", {"a": jnp.ones(2), "b": cfgobject.LogFeature(jnp.asarray(3.0))})
  leaves, treedef = jax.tree.flatten(cfg)
  assert len(leaves) == 2 and jax.tree.unflatten(treedef, leaves).name == "fam"
  out = jax.vmap(lambda k: cfgobject.CFGNamed("fam", {"x": jax.random.normal(k)}))(jax.random.split(KEY, 3))
  assert out.values["x"].shape == (3,)


# -- parametric --------------------------------------------------------------------------------------------------
def test_parametric_image_mlp_samples_and_trains_under_vmap():
  datasets = image.fashion_mnist_datasets(16, (8, 8))
  family = p_image_mlp.ParametricImageMLP(datasets, 10, (16,))
  keys = jax.random.split(KEY, 24)
  cfgs = jax.vmap(family.sample)(keys)
  batch = next(datasets.train)

  def loss(cfg, key):
    task = family.task_fn(cfg)
    return task.loss(task.init(key), key, batch)

  losses = jax.jit(jax.vmap(loss))(cfgs, keys)
  assert losses.shape == (24,) and np.all(np.isfinite(losses))
  assert len(np.unique(cfgs.values["activation"]["index"])) >= 5  # 12 choices (P(< 5 seen in 24 draws) < 1e-6)
  scales = cfgs.values["initializer"]["init_scale"]
  assert 0.5 <= scales.min() and scales.max() < 2.0


@pytest.mark.parametrize("index,std_fn", [
    (2, lambda s, fan_in: math.sqrt(s / fan_in)), (3, lambda s, fan_in: math.sqrt(s / fan_in)),
    (4, lambda s, fan_in: math.sqrt(s / fan_in)), (1, lambda s, fan_in: s / math.sqrt(fan_in)),
    (0, None)])
def test_sampled_initializers_have_their_closed_form_spread(index, std_fn):
  family = p_image_mlp.ParametricImageMLP(image.fashion_mnist_datasets(16, (16, 16)), 10, (200,))
  scale = 1.5
  cfg = cfgobject.CFGNamed("ParametricImageMLP", {
      "initializer": {"index": jnp.asarray(index), "init_scale": jnp.asarray(scale)},
      "activation": {"index": jnp.asarray(0)}})
  w = jax.jit(family.task_fn(cfg).init)(KEY)["linear_0"]["w"]  # [256, 200]
  if std_fn is None:  # orthogonal: rows of w are scale * orthonormal (256 >= 200 rows -> w^T w = scale^2 I)
    np.testing.assert_allclose(w.T @ w, scale ** 2 * np.eye(200), atol=1e-4)
  else:  # 51,200 entries: the sample std is within about 1% of its expectation
    assert abs(float(jnp.std(w)) / std_fn(scale, 256) - 1) < 0.03


def test_sample_image_mlp_builds_through_object_from_config():
  seen = set()
  for i in range(8):
    cfg = p_image_mlp.sample_image_mlp(jax.random.PRNGKey(i))
    hidden = cfg.kwargs["hidden_layers"].value
    assert len(hidden) <= 4 and all(8 <= h < 128 for h in hidden)
    family = cfgobject.object_from_config(cfg)
    side = cfg.kwargs["datasets"].kwargs["image_size"].value[0]
    assert family.datasets.abstract_batch["image"].shape[1:3] == (side, side)
    seen.add(cfg.kwargs["datasets"].obj)
  assert len(seen) >= 2
  assert pu.log_int(KEY, 4, 4) == 4 and 1.0 <= pu.log_float(KEY, 1.0, 2.0) < 2.0
  with pytest.raises(ValueError, match="lower"):
    pu.log_int(KEY, 0, 4)
  with pytest.raises(NotImplementedError, match="sample_image_mlp"):
    p_image_mlp.timed_sample_image_mlp(KEY)


def test_parametric_normalizer_matches_its_definition():
  got = p_image_mlp.image_classification_normalizer(jnp.asarray([0.0, math.log(10), 100.0, jnp.nan]), 10)
  top = math.log(20)
  want = (np.asarray([0.0, math.log(10), top, top]) - math.log(2)) * 10 / math.log(10)
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_transformer_lm_masks_padding_and_attends_causally():
  from metafam.compat.learned_optimization.tasks import transformer
  import haiku as hk
  net = hk.transform(lambda obs, mask: transformer.Transformer(2, 2, 16, 50, 0.0)(obs, mask, is_training=False))
  obs = jax.random.randint(KEY, (2, 10), 1, 50)
  params = net.init(KEY, obs, None)
  apply = jax.jit(net.apply)
  out = apply(params, None, obs, None)
  changed = obs.at[:, 6].set((obs[:, 6] + 1) % 50)  # a later token cannot change earlier outputs
  out2 = apply(params, None, changed, None)
  np.testing.assert_allclose(out[:, :6], out2[:, :6], atol=1e-5)
  assert not np.allclose(out[:, 6:], out2[:, 6:])
  mask = jnp.ones((2, 10), bool).at[:, 3].set(False)  # a masked key is invisible to every query
  np.testing.assert_allclose(apply(params, None, obs.at[:, 3].set(7), mask)[:, 5:],
                             apply(params, None, obs, mask)[:, 5:], atol=1e-5)


def _count(net, *args):
  params = jax.eval_shape(net.init, KEY, *args)
  return num_params(params[0] if isinstance(params, tuple) else params)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_vision_models_have_their_closed_form_parameter_counts(classifier):
  # Hand count for a 32x32x3 image, patch 8 (N = 16), D = 48, 2 layers, MLP 96, K = 10:
  # embedding 193*48 + class token 48 + positions 17*48 + 2 * (192 + 49*144 + 49*48 + 49*96 + 97*48) + 96 + 49*10.
  images = jnp.zeros((2, 32, 32, 3))
  want = 193 * 48 + 2 * (192 + 49 * 144 + 49 * 48 + 49 * 96 + 97 * 48) + 96 + 490 + (48 + 17 * 48 if classifier ==
                                                                                       "token" else 16 * 48)
  assert vision.vit_num_params((32, 32, 3), 10, 8, 48, 2, 96, classifier) == want
  assert _count(vision.vit_forward(10, 8, 48, 2, 4, 96, classifier), images) == want
  # Mixer, same stem, 2 blocks, token MLP 24, channel MLP 96: 2 * (192 + 17*24 + 25*16 + 49*96 + 97*48) + 96 + 490.
  mixer = 193 * 48 + 2 * (192 + 17 * 24 + 25 * 16 + 49 * 96 + 97 * 48) + 96 + 490
  assert _count(vision.mlp_mixer_forward(10, 8, 48, 2, 24, 96), images) == mixer
  # Sides that are not multiples of the patch keep floor(side / P) patches per side (VALID patches).
  assert _count(vision.vit_forward(10, 5, 48, 1, 4, 96), images) == vision.vit_num_params((32, 32, 3), 10, 5, 48, 1,
                                                                                          96) > 0
  with pytest.raises(ValueError, match="patch_size"):
    vision.vit_forward(10, 40, 48, 1, 4, 96).init(KEY, images)


@pytest.mark.slow
def test_vit_reads_positions_and_keeps_examples_independent():
  # The class-token ViT reads position embeddings: permuting patches changes the logits (it is not a bag of
  # patches), while each image's logits depend on that image only (no mixing across the batch).
  net = vision.vit_forward(5, 4, 16, 1, 2, 32)
  x = jax.random.normal(KEY, (3, 8, 8, 2))
  params = jax.jit(net.init)(KEY, x)
  params = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(KEY, a.shape), params)
  apply = jax.jit(net.apply)
  np.testing.assert_allclose(apply(params, x)[:1], apply(params, x[:1]), atol=1e-5)
  swapped = x.at[:, :4].set(x[:, 4:]).at[:, 4:].set(x[:, :4])
  assert not np.allclose(apply(params, x), apply(params, swapped), atol=1e-4)


def test_resnet_parameter_count_and_batch_norm_state():
  import haiku as hk
  from metafam.tasks.resnet import ResNet
  cfg = dict(blocks_per_group=(2, 1, 1, 1), use_projection=(False, True, True, True),
             channels_per_group=(12, 8, 16, 32), initial_conv_kernel_size=3, max_pool=False, resnet_v2=True)
  net = hk.transform_with_state(lambda x: ResNet(num_classes=7, initial_conv_channels=12, **cfg)(x, True))
  x = jax.random.normal(KEY, (4, 16, 16, 3))
  assert _count(net, x) == resnet_num_params(3, 7, cfg["blocks_per_group"], cfg["channels_per_group"],
                                             cfg["use_projection"], 12, 3)
  with pytest.raises(ValueError, match="use_projection"):
    hk.transform(lambda: ResNet((1, 1, 1, 1), 10, use_projection=(True,))).init(KEY)
  for name in ("ResNet", "BlockV1", "BlockV2", "BlockGroup", "check_length", "FloatStrOrBool"):
    assert hasattr(__import__("metafam.compat.learned_optimization.tasks.resnet", fromlist=[name]), name)


@pytest.mark.slow
def test_resnet_runs_and_updates_its_batch_norm_statistics():
  import haiku as hk
  from metafam.tasks.resnet import ResNet
  net = hk.transform_with_state(lambda x: ResNet((1, 1, 1, 1), 7, resnet_v2=True, channels_per_group=(8, 8, 8, 8),
                                                 initial_conv_channels=8)(x, True))
  x = jax.random.normal(KEY, (4, 16, 16, 3))
  params, state = jax.jit(net.init)(KEY, x)
  logits, new_state = jax.jit(net.apply)(params, state, None, x)
  np.testing.assert_allclose(logits, 0.0)  # haiku's ResNet zero-initializes the logits layer
  assert all(int(v) == 1 for v in jax.tree.leaves(new_state) if jnp.ndim(v) == 0)


# -- quadratics and task augmentation additions --------------------------------------------------------------------
def test_noisy_mean_quadratic_has_the_noise_averaged_closed_form():
  from metafam.compat.learned_optimization.tasks import quadratics
  task = quadratics.NoisyMeanQuadraticTask(dim=3, noise_stdev=0.5)
  x = task.init(KEY)
  assert x.shape == (3, 1)
  exact = float((x.T @ task.hess @ x)[0, 0])
  np.testing.assert_allclose(quadratics.NoisyMeanQuadraticTask(3, 0.0).loss(x, KEY, None), exact, rtol=1e-5)
  np.testing.assert_allclose(task.hess, task.hess.T)
  assert np.all(np.linalg.eigvalsh(np.asarray(task.hess)) > -1e-5)
  losses = jax.jit(jax.vmap(lambda k: task.loss(x, k, None)))(jax.random.split(KEY, 4000))
  want = exact + 0.25 * float(jnp.trace(task.hess))  # E (x - n)^T H (x - n) = x^T H x + s^2 tr H
  assert abs(float(losses.mean()) - want) < 5 * float(losses.std()) / np.sqrt(4000)
  with pytest.raises(ValueError, match="noise_stdev"):
    quadratics.NoisyMeanQuadraticTask(2, -1.0)


def test_reduced_batchsize_task_and_wrapped_family():
  from metafam.compat.learned_optimization.tasks import task_augmentation as ta
  inner = image_mlp.build("ImageMLP_FashionMnist8_Relu32")
  task = ta.ReducedBatchsizeTask(inner, 0.25)
  assert task.datasets.abstract_batch["image"].shape == (32, 8, 8, 1)
  batch = next(task.datasets.train)
  assert batch["image"].shape == (32, 8, 8, 1) and batch["label"].shape == (32,)
  params = inner.init(KEY)
  np.testing.assert_allclose(task.loss(params, KEY, batch), inner.loss(params, KEY, batch), rtol=1e-6)
  with pytest.raises(ValueError, match="fraction_of_batchsize"):
    ta.ReducedBatchsizeTask(inner, 1.5)
  family = ta.WrappedTaskFamilyWithTaskWrapper(base.single_task_to_family(inner),
                                               lambda t: ta.ReducedBatchsizeTask(t, 0.5), name="half")
  cfg = family.sample(KEY)
  assert cfg.name == "WrappedTaskFamilyWithTaskWrapper" and family.name == "half"
  assert family.task_fn(cfg).datasets.abstract_batch["label"].shape == (64,)
  assert ta.LogFeat is cfgobject.LogFeature


@pytest.mark.parametrize("which", ["conv", pytest.param("rnn", marks=pytest.mark.slow)])
def test_parametric_conv_and_rnn_families_vmap_with_closed_form_sizes(which):
  from metafam.compat.learned_optimization.tasks.parametric import image_conv, lm_rnn
  conv_family = image_conv.ParametricImageConv(image.fashion_mnist_datasets(8, (8, 8)), 10, (6, 5), [(3, 3)] * 2,
                                               (2, 1))
  rnn_family = lm_rnn.ParametricLMRNN(language.lm1b_bytes_datasets(4, 6), 12, 5, lm_rnn.gru_fn(), vocab_size=40)
  keys = jax.random.split(KEY, 3)
  for family, batch, want in [
      (conv_family, next(conv_family.datasets.train), (9 + 1) * 6 + (54 + 1) * 5 + 6 * 10),
      (rnn_family, {"obs": jnp.full((4, 6), 300, jnp.int32).at[:, 0].set(3), "target": jnp.ones((4, 6), jnp.int32)},
       40 * 5 + 3 * 12 * (5 + 12) + 3 * 12 + 12 + 13 * 40)]:  # GRU + learned initial state; ids >= 40 folded
    if (family is rnn_family) != (which == "rnn"):
      continue
    cfgs = jax.vmap(family.sample)(keys)
    assert num_params(jax.eval_shape(family.task_fn(family.sample(KEY)).init, KEY)) == want
    losses = jax.jit(jax.vmap(lambda c, k: family.task_fn(c).loss(family.task_fn(c).init(k), k, batch)))(cfgs, keys)
    assert losses.shape == (3,) and np.all(np.isfinite(losses))
  cfg = image_conv.sample_image_conv(KEY)
  assert len(cfg.kwargs["strides"]) == len(cfg.kwargs["kernel_sizes"]) == len(cfg.kwargs["hidden_sizes"].value)
  assert isinstance(cfgobject.object_from_config(lm_rnn.sample_lm_rnn(KEY)), lm_rnn.ParametricLMRNN)
  with pytest.raises(ValueError, match="one entry per layer"):
    image_conv.ParametricImageConv(conv_family.datasets, 10, (4,), [], (1,))


def test_fold_ids_keeps_padding_and_small_ids():
  ids = jnp.asarray([0, 1, 39, 40, 41, 258])
  np.testing.assert_array_equal(rnn_lm.fold_ids(ids, 40, 259), [0, 1, 39, 1 + 40 % 39, 1 + 41 % 39, 1 + 258 % 39])
  np.testing.assert_array_equal(rnn_lm.fold_ids(ids, 300, 259), ids)


@pytest.mark.slow
def test_parametric_lm_transformer_builds_and_runs():
  from metafam.compat.learned_optimization.tasks.parametric import lm_transformer
  family = lm_transformer.ParametricLMTransformer(language.lm1b_bytes_datasets(2, 5), 40, 2, 1, 16, 0.1)
  task = family.task_fn(family.sample(KEY))
  params = task.init(KEY)
  batch = {"obs": jnp.full((2, 5), 200, jnp.int32), "target": jnp.full((2, 5), 201, jnp.int32)}
  assert np.isfinite(task.loss(params, KEY, batch))
  np.testing.assert_allclose(task.normalizer(jnp.log(40.0)), 10 * np.log(5) / np.log(40), rtol=1e-6)
  assert isinstance(cfgobject.object_from_config(lm_transformer.sample_lm_transformer(KEY)),
                    lm_transformer.ParametricLMTransformer)


@pytest.mark.slow
def test_parametric_vit_dropout_follows_the_loss_key():
  from metafam.compat.learned_optimization.tasks.parametric import vit as p_vit
  sizes = dict(patch_size=4, hidden_size=16, mlp_dim=32, num_heads=2, layers=1)
  datasets = image.fashion_mnist_datasets(4, (8, 8))
  batch = next(datasets.train)
  for rate, differs in ((0.5, True), (0.0, False)):
    family = p_vit.ParametricVIT(datasets, dropout=rate, attension_dropout=rate, **sizes)
    task = family.task_fn(family.sample(KEY))
    params = task.init(KEY)
    assert num_params(params) == vision.vit_num_params((8, 8, 1), 10, 4, 16, 1, 32)
    loss = jax.jit(task.loss)
    assert (loss(params, jax.random.PRNGKey(1), batch) != loss(params, jax.random.PRNGKey(2), batch)) == differs
  with pytest.raises(ValueError, match="layers"):
    p_vit.ParametricVIT(datasets, patch_size=4)
  assert isinstance(cfgobject.object_from_config(p_vit.sample_vit(KEY)), p_vit.ParametricVIT)


def test_generative_model_utils_match_closed_forms():
  from jax.scipy.stats import norm
  from metafam.compat.learned_optimization.tasks import generative_model_utils as g
  params = jnp.asarray([[0.5, -1.0, 0.2, -0.3]])  # means (0.5, -1), log stds (0.2, -0.3)
  q = g.LogStddevNormal(params)
  x = jnp.asarray([[0.1, 0.4]])
  np.testing.assert_allclose(q.log_prob(x), norm.logpdf(x, q.loc, jnp.exp(jnp.asarray([0.2, -0.3]))), rtol=1e-6)
  prior = g.Normal(jnp.zeros((1, 2)), jnp.ones((1, 2)))
  s2 = jnp.exp(2 * jnp.asarray([0.2, -0.3]))
  np.testing.assert_allclose(q.kl_divergence(prior), 0.5 * (s2 + q.loc ** 2 - 1 - jnp.log(s2)), rtol=1e-6)
  samples = jax.vmap(q.sample)(jax.random.split(KEY, 20000))[:, 0]
  np.testing.assert_allclose(samples.mean(0), q.loc[0], atol=5 * float(q.scale.max()) / np.sqrt(20000))
  decoder = lambda z: g.Normal(jnp.concatenate([z, z], axis=1), jnp.ones((1, 4)))
  log_p, kl = g.log_prob_elbo_components(g.LogStddevNormal, decoder, prior, params, KEY)  # x = params, [1, 4]
  z = q.sample(KEY)
  np.testing.assert_allclose(log_p, jnp.sum(norm.logpdf(params, jnp.concatenate([z, z], 1), 1.0)), rtol=1e-5)
  np.testing.assert_allclose(kl, jnp.sum(q.kl_divergence(prior)), rtol=1e-6)
  quantized = __import__("haiku").transform(lambda v: g.HKQuantizedNormal(params).log_prob(v))
  lp = quantized.apply({}, KEY, x)  # log density at x + U(+-bin/2) plus log(bin)
  # |d log q / dx| = |x - mu| / s^2 < 3 here, and the noise is within half a bin (1/510): within 0.01.
  assert lp.shape == (1, 2)
  np.testing.assert_allclose(lp, q.log_prob(x) + np.log(1 / 255), atol=0.01)
  with pytest.raises(ValueError, match="mu_and_log_sigma"):
    g.LogStddevNormal(jnp.ones((2, 3)))


def test_parametric_autoencoder_switches_follow_their_definitions():
  from metafam.compat.learned_optimization.tasks.parametric import image_mlp_ae as p_ae
  datasets = image.fashion_mnist_datasets(8, (4, 4))
  family = p_ae.ParametricImageMLPAE(datasets, (8,))
  batch = next(datasets.train)
  cfgs = jax.vmap(family.sample)(jax.random.split(KEY, 16))  # the boolean switches are traced choices
  assert 0 < cfgs.values["log_loss"].sum() < 16  # P(all 16 equal) = 2^-15
  base_cfg = family.sample(KEY)
  def with_flags(log_loss, center, constrain):
    return cfgobject.CFGNamed(base_cfg.name, dict(base_cfg.values, log_loss=jnp.asarray(log_loss),
                                                  center_data=jnp.asarray(center),
                                                  constrain_output=jnp.asarray(constrain)))
  plain = family.task_fn(with_flags(False, False, False))
  params = plain.init(KEY)
  pred = plain.net.apply(params, batch["image"], base_cfg.values["activation"]["index"]).reshape(batch["image"].shape)
  mse = jnp.mean(jnp.square(pred - batch["image"]))
  np.testing.assert_allclose(plain.loss(params, KEY, batch), mse, rtol=1e-6)
  np.testing.assert_allclose(family.task_fn(with_flags(True, False, False)).loss(params, KEY, batch),
                             jnp.log(mse + 1e-8), rtol=1e-6)
  centered = 2 * (batch["image"] - 0.5)
  pred_c = jnp.tanh(plain.net.apply(params, centered, base_cfg.values["activation"]["index"]).reshape(
      centered.shape))
  np.testing.assert_allclose(family.task_fn(with_flags(False, True, True)).loss(params, KEY, batch),
                             jnp.mean(jnp.square(pred_c - centered)), rtol=1e-5)
  np.testing.assert_allclose(plain.normalizer(jnp.asarray(np.e ** -4)), -4 * 0.5 + 10, rtol=1e-5)


def test_parametric_vae_has_its_size_and_scales_per_dimension():
  from metafam.compat.learned_optimization.tasks.parametric import image_mlp_vae as p_vae
  datasets = image.fashion_mnist_datasets(8, (4, 4))
  family = p_vae.ParametricImageMLPVAE(datasets, (8,), (8,), 3)
  batch = next(datasets.train)
  cfg = family.sample(KEY)
  flags = lambda per_dim: cfgobject.CFGNamed(cfg.name, dict(cfg.values, per_dim_loss=jnp.asarray(per_dim),
                                                            center_data=jnp.asarray(False)))
  whole, per_dim = family.task_fn(flags(False)), family.task_fn(flags(True))
  params = whole.init(KEY)
  assert num_params(params) == (16 + 1) * 8 + (8 + 1) * 6 + (3 + 1) * 8 + (8 + 1) * 32  # D = 16, n_z = 3
  np.testing.assert_allclose(per_dim.loss(params, KEY, batch), whole.loss(params, KEY, batch) / 16, rtol=1e-5)
  np.testing.assert_allclose(whole.normalizer(jnp.asarray(32.0)), 2.0)  # 32 nats over 16 pixels
  assert isinstance(cfgobject.object_from_config(p_vae.sample_image_mlp_vae(KEY)), p_vae.ParametricImageMLPVAE)


def _tiny_resnet_family():
  from metafam.compat.learned_optimization.tasks.parametric import image_resnet as p_resnet
  return p_resnet.ParametricImageResNet(image.fashion_mnist_datasets(4, (8, 8)), 4, 1, 3, (1, 1, 1, 1),
                                        (4, 4, 8, 8), False)


def test_parametric_resnet_has_its_closed_form_size():
  from metafam.compat.learned_optimization.tasks.parametric import image_resnet as p_resnet
  family = _tiny_resnet_family()
  task = family.task_fn(family.sample(KEY))
  params, _ = jax.eval_shape(task.init_with_state, KEY)
  # v1 bottleneck blocks: per block 1x1 (c_in -> b), 3x3 (b -> b), 1x1 (b -> c), three batch norms (2b, 2b, 2c),
  # a projection 1x1 (c_in -> c) with its batch norm (2c); stem 3*3*1*4 with a batch norm (8); logits (8 + 1) * 10.
  want, c_in = 9 * 4 + 8, 4
  for c in (4, 4, 8, 8):
    b = c // 4
    want += c_in * b + 9 * b * b + b * c + 2 * b + 2 * b + 2 * c + c_in * c + 2 * c
    c_in = c
  assert num_params(params) == want + 9 * 10
  assert isinstance(cfgobject.object_from_config(p_resnet.sample_image_resnet(KEY)), p_resnet.ParametricImageResNet)


@pytest.mark.slow
def test_parametric_resnet_vmaps():
  family = _tiny_resnet_family()
  keys = jax.random.split(KEY, 3)
  batch = next(family.datasets.train)

  def loss(cfg, key):
    task = family.task_fn(cfg)
    params, state = task.init_with_state(key)
    return task.loss_with_state(params, state, key, batch)[0]

  losses = jax.jit(jax.vmap(loss))(jax.vmap(family.sample)(keys), keys)
  np.testing.assert_allclose(losses, np.log(10), rtol=1e-5)  # haiku's zero-initialized logits: uniform prediction


@pytest.mark.slow
@pytest.mark.parametrize("which", ["image_mlp_ae", "image_mlp_vae"])
def test_parametric_autoencoder_families_vmap(which):
  from metafam.compat.learned_optimization.tasks.parametric import image_mlp_ae as p_ae, image_mlp_vae as p_vae
  datasets = image.fashion_mnist_datasets(8, (4, 4))
  family = (p_ae.ParametricImageMLPAE(datasets, (8,)) if which == "image_mlp_ae"
            else p_vae.ParametricImageMLPVAE(datasets, (8,), (8,), 3))
  keys = jax.random.split(KEY, 8)
  batch = next(datasets.train)
  losses = jax.jit(jax.vmap(lambda c, k: family.task_fn(c).loss(family.task_fn(c).init(k), k, batch)))(
      jax.vmap(family.sample)(keys), keys)
  assert losses.shape == (8,) and np.all(np.isfinite(losses))


def test_transformed_local_image_datasets_are_device_arrays_and_train_in_the_truncated_step(tmp_path, monkeypatch):
  """The LOptPES_Adafac_Cifar tasks' black-and-white CIFAR-10: read on first use into ArraySplits (device path), so
  a vectorized truncated step trains on it (it raised TypeError on a host iterator before issue 41)."""
  from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
  from metafam.compat.learned_optimization.outer_trainers import lopt_truncated_step, truncation_schedule
  _write_fake_cifar10(tmp_path, 20, monkeypatch)
  dbase.dataset_lru_cache_clear()
  color = image.cifar10_datasets(4, image_size=(8, 8))
  bw = image.cifar10_datasets(4, image_size=(8, 8), convert_to_black_and_white=True)
  assert bw.has_device_data and color.has_device_data
  np.testing.assert_allclose(bw.source("train").arrays["image"][..., 0],
                             color.source("train").arrays["image"].mean(-1), rtol=1e-6)
  task = image_mlp.ImageMLP_Cifar10BW8_Relu32()
  task.datasets = bw
  step = lopt_truncated_step.VectorizedLOptTruncatedStep(
      base.single_task_to_family(task), lopt_base.LearnableSGD(0.1), truncation_schedule.ConstantTruncationSchedule(4),
      num_tasks=2)
  theta = step.learned_opt.init(KEY)
  state = step.init_step_state(theta, None, KEY)
  state, out = step.unroll_step(theta, state, KEY, None, None)
  assert out.loss.shape == (2,) and np.all(np.isfinite(out.loss))
  dbase.dataset_lru_cache_clear()


@pytest.mark.slow
def test_lopt_pes_adafac_cifar_task_runs_on_local_cifar_files(tmp_path, monkeypatch):
  """Issue 41: with CIFAR-10 files given, the LOptPES_Adafac_Cifar tasks' inner training runs (TypeError before)."""
  from metafam.compat.learned_optimization.tasks.fixed import lopt
  _write_fake_cifar10(tmp_path, 40, monkeypatch)
  dbase.dataset_lru_cache_clear()
  task = lopt.LOptPES_Adafac_Cifar_OuterBS4_Length50_Trunc5()
  params, state = task.init_with_state(KEY)
  loss, _ = task.loss_with_state(params, state, jax.random.PRNGKey(1), ())
  assert 0.5 < float(loss) < 5.0  # a meta-loss near chance level (log 10 = 2.3) on random images
  dbase.dataset_lru_cache_clear()
