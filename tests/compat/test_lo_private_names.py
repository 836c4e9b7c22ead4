"""LO's private building blocks and state classes that research code subclasses, constructs or pattern-matches.

Each is checked against its definition in the reference (closed forms, hand-computed layers, the accumulators'
recurrences) and, for the state classes, for the round trip through the compat optimizers and LO-format (flax
msgpack) and metafam-format checkpoints.
"""
# pylint: disable=protected-access,g-import-not-at-top  (the reference's private names are the subject)

import math

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax_runs import assert_trees_close

from metafam.compat.learned_optimization import checkpoints
from metafam.compat.learned_optimization.learned_optimizers import adafac_mlp_lopt, common, mlp_lopt
from metafam.compat.learned_optimization.optimizers import optax_opts
from metafam.optimizers.base import OptimizerState
from metafam.compat.learned_optimization.tasks.datasets import base as dbase
from metafam.compat.learned_optimization.tasks.datasets import image, language
from metafam.compat.learned_optimization.tasks.fixed import conv, image_mlp
from metafam.datasets.base import ArraySplit, Datasets
from metafam.optimizers import mlp_lopt as mf_mlp_lopt


def _blob_datasets(batch_size=32, side=8, num_classes=4, seed=0):
  """A dataset of the test's own: ``side x side`` gray images, each class a fixed random pattern plus noise."""
  rng = np.random.default_rng(seed)
  patterns = rng.normal(size=(num_classes, side, side, 1)).astype(np.float32)

  def split(n, s):
    labels = np.random.default_rng(s).integers(0, num_classes, n).astype(np.int32)
    noise = np.random.default_rng(s + 1).normal(size=(n, side, side, 1)).astype(np.float32)
    return ArraySplit({"image": patterns[labels] + 1.5 * noise, "label": labels}, batch_size, seed=s)

  abstract = {"image": jax.ShapeDtypeStruct((batch_size, side, side, 1), jnp.float32),
              "label": jax.ShapeDtypeStruct((batch_size,), jnp.int32)}
  return Datasets(split(2000, 1), split(256, 3), split(256, 5), split(256, 7),
                  extra_info={"num_classes": num_classes}, abstract_batch=abstract)


class BlobMLP(image_mlp._MLPImageTask):
  """A research task: the reference's MLP image task on a dataset of its own."""

  def __init__(self):
    super().__init__(_blob_datasets(), [32])


def _train(task, opt, steps, seed=0):
  params = task.init(jax.random.PRNGKey(seed))
  state = opt.init(params)

  @jax.jit
  def step(state, key, batch):
    loss, grad = jax.value_and_grad(task.loss)(opt.get_params(state), key, batch)
    return opt.update(state, grad, loss=loss), loss

  losses = []
  for t in range(steps):
    state, loss = step(state, jax.random.PRNGKey(t), next(task.datasets.train))
    losses.append(float(loss))
  return state, np.asarray(losses)


# ------------------------------------------------------------------------------------------------------- tasks

def test_mlp_image_task_subclass_on_its_own_dataset_has_los_layers_and_trains():
  task = BlobMLP()
  params = task.init(jax.random.PRNGKey(0))
  sizes = sorted(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  assert sorted(sizes) == sorted([64 * 32, 32, 32 * 4, 4])  # flatten -> Linear(32) -> relu -> Linear(4)
  batch = next(task.datasets.train)
  # The loss is the mean softmax cross-entropy of the two-layer MLP, computed here by hand from the params.
  (w0, b0), (w1, b1) = [(p["w"], p["b"]) for p in params.values()]
  logits = jax.nn.relu(batch["image"].reshape(32, -1) @ w0 + b0) @ w1 + b1
  expected = -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(32), batch["label"]])
  np.testing.assert_allclose(task.loss(params, jax.random.PRNGKey(1), batch), expected, rtol=1e-5)
  _, losses = _train(task, optax_opts.Adam(3e-3), 150)
  # From about chance (log 4 = 1.39, plus the untrained net's spread) to under a quarter of it (measured: 2.4 ->
  # 0.03 over the last 50 steps).
  assert losses[:5].mean() > 1.0 and losses[-50:].mean() < 0.25 * losses[:5].mean(), losses[::25]
  # The normalizer is the reference's: clipped to [0, 1.5 log K], non-finite -> the top.
  top = 1.5 * math.log(4)
  np.testing.assert_allclose(task.normalizer(jnp.asarray([-1.0, 0.5, 99.0, jnp.nan])), [0.0, 0.5, top, top],
                             rtol=1e-6)


def test_mlp_image_task_subclass_overriding_loss_changes_every_loss_variant():
  class L2(BlobMLP):
    def loss(self, params, key, data):
      return super().loss(params, key, data) + 10.0 * sum(jnp.sum(jnp.square(p)) for p in jax.tree.leaves(params))

  task, plain = L2(), BlobMLP()
  params, batch, key = task.init(jax.random.PRNGKey(0)), next(task.datasets.train), jax.random.PRNGKey(1)
  l2 = 10.0 * sum(float(jnp.sum(jnp.square(p))) for p in jax.tree.leaves(params))
  for variant in (lambda t: t.loss_with_state_and_aux(params, None, key, batch)[0],
                  lambda t: t.loss_with_state(params, None, key, batch)[0], lambda t: t.loss(params, key, batch)):
    np.testing.assert_allclose(variant(task), variant(plain) + l2, rtol=1e-5)


def test_mlp_image_task_dropout_is_keyed_by_the_loss_key():
  task = image_mlp._MLPImageTask(_blob_datasets(), [64], dropout_rate=0.5)
  params, batch = task.init(jax.random.PRNGKey(0)), next(task.datasets.train)
  a, b = (task.loss(params, jax.random.PRNGKey(k), batch) for k in (1, 2))
  assert a != b and task.loss(params, jax.random.PRNGKey(1), batch) == a
  with pytest.raises(TypeError, match="act_fn"):
    image_mlp._MLPImageTask(_blob_datasets(), [8], act_fn="relu")


@pytest.mark.parametrize("pool", ["avg", "max"])
def test_cross_entropy_pool_loss_is_the_references_conv_net(pool):
  fn = conv._cross_entropy_pool_loss([4, 6], jax.nn.tanh, pool=pool, num_classes=4)
  task = conv._ConvTask(fn, _blob_datasets())
  params, state = task.init_with_state(jax.random.PRNGKey(0))
  batch = next(task.datasets.train)
  # By hand: SAME 3x3 convs (stride 2, then 1), tanh, global pool, linear, mean softmax cross-entropy.
  x = batch["image"]
  for name, stride in (("conv2_d", 2), ("conv2_d_1", 1)):
    x = jax.lax.conv_general_dilated(x, params[name]["w"], (stride, stride), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    x = jnp.tanh(x + params[name]["b"])
  assert x.shape == (32, 4, 4, 6)
  x = jnp.mean(x, axis=(1, 2)) if pool == "avg" else jnp.max(x, axis=(1, 2))
  logits = x @ params["linear"]["w"] + params["linear"]["b"]
  expected = -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(32), batch["label"]])
  loss, new_state, aux = task.loss_with_state_and_aux(params, state, jax.random.PRNGKey(1), batch)
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  assert new_state == {} and aux == {}
  np.testing.assert_allclose(task.normalizer(jnp.asarray(99.0)), 1.5 * math.log(4), rtol=1e-6)
  with pytest.raises(ValueError, match="pool"):
    conv._cross_entropy_pool_loss([4], jax.nn.relu, pool="sum")


def test_conv_task_threads_haiku_state_of_a_batch_norm_fn():
  def norm_fn(x):
    return hk.BatchNorm(True, True, 0.9)(x, is_training=True)

  fn = conv._cross_entropy_pool_loss([4], jax.nn.relu, norm_fn=norm_fn, num_classes=4)
  task = conv._ConvTask(fn, _blob_datasets(), with_state=True)
  params, state = task.init_with_state(jax.random.PRNGKey(0))
  assert state  # the batch-norm moving averages
  _, new_state = task.loss_with_state(params, state, jax.random.PRNGKey(1), next(task.datasets.train))
  changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state, new_state)
  assert any(jax.tree.leaves(changed))


# ------------------------------------------------------------------------------------------ feature helpers

def test_tanh_embedding_is_tanh_of_iteration_over_each_timescale_minus_one():
  scales = [1, 3, 10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000]
  for t in (0, 1, 7, 250, 123456):
    got = mlp_lopt._tanh_embedding(jnp.asarray(t, jnp.int32))
    assert got.shape == (11,) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, [math.tanh(t / s - 1.0) for s in scales], rtol=1e-6, atol=1e-7)


def test_second_moment_normalizer_divides_by_the_root_mean_square_plus_eps():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)), jnp.float32)
  for axis, eps in ((0, 1e-5), (1, 1e-5), ([0, 1], 0.3)):
    got = mlp_lopt._second_moment_normalizer(x, axis=axis, eps=eps)
    ms = np.mean(np.square(np.asarray(x, np.float64)), axis=tuple(np.atleast_1d(axis)), keepdims=True)
    np.testing.assert_allclose(got, np.asarray(x) / np.sqrt(eps + ms), rtol=1e-5)


# ------------------------------------------------------------------------------------------- state classes

_PARAMS = {"w": jnp.asarray(np.random.default_rng(1).normal(size=(3, 5)), jnp.float32),
           "b": jnp.asarray([0.5, -1.0], jnp.float32)}


def _grads(t):
  rng = np.random.default_rng(10 + t)
  return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), _PARAMS)



def test_mlp_lopt_state_is_the_references_and_its_update_is_metafams():
  lopt = mlp_lopt.MLPLOpt()
  theta = lopt.init(jax.random.PRNGKey(0))
  opt = lopt.opt_fn(theta)
  decays = jnp.asarray([0.1, 0.5, 0.9, 0.99, 0.999, 0.9999])
  state = opt.init(_PARAMS)
  assert isinstance(state, mlp_lopt.MLPLOptState)
  # A state built by hand the way forks build it (LO's accumulator init) is the same state.
  by_hand = mlp_lopt.MLPLOptState(params=_PARAMS, rolling_features=common.vec_rolling_mom(decays).init(_PARAMS),
                                  iteration=jnp.asarray(0, jnp.int32), state=None)
  assert_trees_close(state, by_hand, rtol=1e-7, atol=0)
  reference = mf_mlp_lopt.MLPLOpt.opt_fn(lopt, theta)  # metafam's own optimizer and state
  mf_state = reference.init(_PARAMS)
  update = jax.jit(opt.update)
  mom = common.vec_rolling_mom(decays)
  expected_mom = mom.init(_PARAMS)
  for t in range(3):
    state = update(state, _grads(t))
    mf_state = reference.update(mf_state, _grads(t))
    expected_mom = mom.update(expected_mom, _grads(t))
  assert isinstance(state, mlp_lopt.MLPLOptState) and int(state.iteration) == 3
  assert_trees_close(state.params, mf_state.params, rtol=1e-6)
  assert_trees_close(state.rolling_features, expected_mom, rtol=1e-5, atol=1e-7)  # LO's recurrence and layout
  # metafam's own state is still accepted (and returned as such).
  assert isinstance(opt.update(mf_state, _grads(0)), OptimizerState)


def test_adafac_mlp_lopt_state_is_the_references_and_its_update_is_metafams():
  lopt = adafac_mlp_lopt.AdafacMLPLOpt()
  theta = lopt.init(jax.random.PRNGKey(0))
  opt = lopt.opt_fn(theta)
  state = opt.init(_PARAMS, num_steps=50)
  assert isinstance(state, adafac_mlp_lopt.AdafacMLPLOptState) and int(state.num_steps) == 50
  reference = adafac_mlp_lopt._adafac.AdafacMLPLOpt.opt_fn(lopt, theta)
  mf_state = reference.init(_PARAMS)
  mom = common.vec_rolling_mom(jnp.asarray([0.9, 0.99, 0.999]))
  expected_mom = mom.init(_PARAMS)
  for t in range(3):
    state = opt.update(state, _grads(t))
    mf_state = reference.update(mf_state, _grads(t))
    expected_mom = mom.update(expected_mom, _grads(t))
  assert_trees_close(state.params, mf_state.params, rtol=1e-6)
  assert_trees_close(state.mom_rolling, expected_mom, rtol=1e-5, atol=1e-7)
  fac = state.fac_rolling_features
  g2 = [jnp.square(_grads(t)["w"]) for t in range(3)]
  # Row factor of the matrix: the decayed mean of g^2 over its last axis (metafam's factors, decay axis last).
  row = sum((1 - 0.9) * 0.9 ** (2 - t) * jnp.mean(g2[t], axis=-1) for t in range(3))
  np.testing.assert_allclose(fac.v_row["w"][:, 0], row, rtol=1e-4)
  assert fac.v_diag["w"].shape == (0,) and fac.v_row["b"].shape == (0,) and fac.v_diag["b"].shape == (2, 3)
  assert int(state.num_steps) == 50 and int(state.iteration) == 3


def test_optax_state_is_the_references_and_updates_as_optax():
  opt = optax_opts.Adam(0.1)
  state = opt.init(_PARAMS)
  assert isinstance(state, optax_opts.OptaxState)
  tx = optax.adam(0.1, eps_root=1e-8)
  tx_state, params = tx.init(_PARAMS), _PARAMS
  for t in range(3):
    state = opt.update(state, _grads(t))
    updates, tx_state = tx.update(_grads(t), tx_state, params)
    params = optax.apply_updates(params, updates)
  assert_trees_close(opt.get_params(state), params, rtol=1e-6)
  assert_trees_close(state.optax_opt_state, tx_state, rtol=1e-6)
  assert int(state.iteration) == 3 and isinstance(state.replace(iteration=0), optax_opts.OptaxState)
  hand = optax_opts.OptaxState(params=_PARAMS, state=None, optax_opt_state=tx.init(_PARAMS), iteration=0)
  assert_trees_close(opt.update(hand, _grads(0)).params, opt.update(opt.init(_PARAMS), _grads(0)).params)


@pytest.mark.parametrize("fmt", ["flax", "npz"])
@pytest.mark.parametrize("make", ["mlp", "adafac", "optax"])
def test_state_classes_round_trip_through_checkpoints_and_training_continues(tmp_path, fmt, make):
  pytest.importorskip("msgpack") if fmt == "flax" else None
  if make == "optax":
    opt = optax_opts.Adam(0.1)
  else:
    lopt = mlp_lopt.MLPLOpt() if make == "mlp" else adafac_mlp_lopt.AdafacMLPLOpt()
    opt = lopt.opt_fn(lopt.init(jax.random.PRNGKey(0)))
  state = opt.update(opt.update(opt.init(_PARAMS), _grads(0)), _grads(1))
  path = str(tmp_path / "state")
  checkpoints.save_state(path, state, format=fmt)
  blank = jax.tree.map(jnp.zeros_like, state)
  loaded = checkpoints.load_state(path, blank)
  assert type(loaded) is type(state)
  assert_trees_close(loaded, state)
  assert_trees_close(opt.update(loaded, _grads(2)), opt.update(state, _grads(2)), rtol=1e-6)


# ------------------------------------------------------------------------------------------------- datasets

def _map_cfg(**changes):
  cfg = dict(image_size=(8, 8), stack_channels=1, aug_flip_left_right=False, aug_flip_up_down=False,
             normalize_mean=None, normalize_std=None, convert_to_black_and_white=False)
  cfg.update(changes)
  return cfg


def test_image_map_fn_scales_resizes_stacks_normalizes_and_casts_as_the_reference():
  pixels = np.arange(2 * 8 * 8 * 3).reshape(2, 8, 8, 3) % 256
  batch = {"image": pixels.astype(np.uint8), "label": np.array([3, 1], np.int64)}
  out = dbase._image_map_fn(_map_cfg(), batch)
  np.testing.assert_allclose(out["image"], pixels / 255.0, rtol=1e-6)
  assert out["label"].dtype == jnp.int32 and list(out["label"]) == [3, 1]
  # Halving each side with bilinear weights at half-pixel centers averages each 2x2 block.
  small = dbase._image_map_fn(_map_cfg(image_size=(4, 4)), batch)["image"]
  blocks = pixels.reshape(2, 4, 2, 4, 2, 3).mean(axis=(2, 4)) / 255.0
  np.testing.assert_allclose(small, blocks, rtol=1e-5)
  mean, std = (120.0, 110.0, 100.0), (60.0, 50.0, 40.0)
  normed = dbase._image_map_fn(_map_cfg(normalize_mean=mean, normalize_std=std), batch)
  np.testing.assert_allclose(normed["image"], (pixels - np.asarray(mean)) / np.asarray(std), rtol=1e-5)
  bw = dbase._image_map_fn(_map_cfg(convert_to_black_and_white=True), batch)
  np.testing.assert_allclose(bw["image"][..., 0], pixels.mean(-1) / 255.0, rtol=1e-5)
  gray = {"image": pixels[..., :1], "label": batch["label"]}
  stacked = dbase._image_map_fn(_map_cfg(stack_channels=3), gray)["image"]
  np.testing.assert_allclose(stacked, np.repeat(pixels[..., :1], 3, -1) / 255.0, rtol=1e-6)
  flipped = dbase._image_map_fn(_map_cfg(aug_flip_left_right=True), batch)["image"]
  for i in range(2):  # each image either unchanged or mirrored left-right
    assert (np.allclose(flipped[i], pixels[i] / 255.0) or np.allclose(flipped[i], pixels[i, :, ::-1] / 255.0))
  with pytest.raises(ValueError, match="image_size"):
    dbase._image_map_fn({}, batch)


def test_make_datasets_has_los_batches_and_vocab_and_fails_only_on_a_batch():
  vocab = language.get_bytes_vocab()
  d = language._make_datasets("tiny_shakespeare", vocab, 4, 16, has_test=False)
  assert d.abstract_batch["obs"].shape == (4, 16) and d.abstract_batch["target"].dtype == jnp.int32
  assert d.extra_info["vocab_size"] == 259 and d.extra_info["vocab"] is vocab
  with pytest.raises(dbase.DatasetUnavailableError, match="tiny_shakespeare"):
    next(d.train)
  with pytest.raises(TypeError, match="vocab"):
    language._make_datasets("lm1b", object(), 4, 16)
  with pytest.raises(ValueError, match="batch_size"):
    language._make_datasets("lm1b", vocab, 0, 16)


@pytest.mark.slow  # a larger task's smoke run; the fixed tasks' reference tests: tests/compat/test_lo_tasks.py
def test_vit_test_is_the_references_parameterized_smoke_test():
  import unittest
  from metafam.compat.learned_optimization.tasks.fixed import vit_test
  names = sorted(n for n in dir(vit_test.VITTest) if n.startswith("test_tasks"))
  assert len(names) == 6 and issubclass(vit_test.VITTest, unittest.TestCase)
  result = unittest.TestResult()
  vit_test.VITTest("test_tasks3").run(result)  # VIT_Cifar100_skinnydeep on zeros shaped like its batches
  assert result.wasSuccessful() and result.testsRun == 1, result.errors + result.failures


def test_image_datasets_of_other_sizes_serve_the_subclass():
  task = image_mlp._MLPImageTask(image.fashion_mnist_datasets(16, image_size=(12, 12)), [8])
  params = task.init(jax.random.PRNGKey(0))
  assert params["linear_0"]["w"].shape == (144, 8)
  assert np.isfinite(float(task.loss(params, jax.random.PRNGKey(0), next(task.datasets.train))))


# ------------------------------------------------------------------------- the other private helpers of LO

def test_private_embeddings_and_feature_helpers_follow_their_definitions():
  from metafam.compat.learned_optimization.learned_optimizers import nn_adam, rnn_mlp_lopt
  from metafam.compat.learned_optimization.research.general_lopt import hyper_v2
  scales = [1, 3, 10, 30, 100, 300, 1000, 3000, 10000, 30000, 100000]
  np.testing.assert_allclose(rnn_mlp_lopt._sin_embedding(jnp.asarray(40)),
                             [math.sin(40 / (s * math.pi)) for s in scales], rtol=1e-5, atol=1e-7)
  marks = [0.03, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1]
  np.testing.assert_allclose(hyper_v2._fractional_tanh_embed(0.5),
                             [math.tanh(10 * (0.5 - m)) for m in marks], rtol=1e-5, atol=1e-7)
  v = jnp.asarray([0.0, 1e-3, 2.0, 1e4])
  raw = np.clip(np.log(1e-8 + np.abs(np.asarray(v, np.float64))), -5, 5)
  np.testing.assert_allclose(rnn_mlp_lopt._clip_log_abs(v), raw, rtol=1e-5)
  np.testing.assert_allclose(nn_adam._clip_log_abs(v), 0.5 * raw, rtol=1e-5)
  np.testing.assert_allclose(hyper_v2._clip_log_abs(v, scale=10.0),
                             0.5 * np.clip(np.log(1e-8 + np.abs(10 * np.asarray(v, np.float64))), -5, 5), rtol=1e-5)
  for module in (nn_adam, rnn_mlp_lopt, hyper_v2):
    assert tuple(module._sorted_values({"b": 1, "a": 2, "c": 0})) == (2, 1, 0)
  tree = {"a": jnp.asarray([1.0, 3.0]), "b": jnp.asarray([[2.0]])}
  np.testing.assert_allclose(rnn_mlp_lopt._avg_square_mean(tree), (5.0 + 4.0) / 2)
  parts = rnn_mlp_lopt._unstack(jnp.arange(6.0).reshape(2, 3), axis=1)
  assert len(parts) == 3 and all(np.array_equal(p, [i, i + 3]) for i, p in enumerate(parts))
  np.testing.assert_allclose(hyper_v2._safe_rsqrt(jnp.asarray([0.0, 4.0])), [1 / math.sqrt(1e-9), 0.5], rtol=1e-5)
  # NNAdam's hyper-parameter maps: forward then inverse is the identity inside the clip ranges.
  for inv, value in ((nn_adam._scaled_lr, 3e-3), (nn_adam._scaled_epsilon, 1e-6),
                     (nn_adam._scaled_one_minus_log, 0.9)):
    np.testing.assert_allclose(inv.inverse(inv.forward(value)), value, rtol=1e-5)
    np.testing.assert_allclose(inv.tree_inverse_forward({"x": inv.forward(value)})["x"], inv.forward(value), rtol=1e-5)
  acc = nn_adam._first_second_rolling()
  state = acc.update(acc.init({"p": jnp.zeros(2)}), {"p": jnp.asarray([1.0, -2.0])}, {"p": 0.9}, {"p": 0.99})
  np.testing.assert_allclose(state.m["p"], [0.1, -0.2], rtol=1e-6)
  np.testing.assert_allclose(state.rms["p"], [0.01, 0.04], rtol=1e-5)
  assert int(state.t) == 1


def test_private_tree_and_sampling_helpers_follow_their_definitions():
  from metafam.compat.learned_optimization import jax_utils
  from metafam.compat.learned_optimization.outer_trainers import common as ocommon
  from metafam.compat.learned_optimization.outer_trainers import gradient_learner
  from metafam.compat.learned_optimization.tasks import es_wrapper, task_augmentation
  tree = {"x": jnp.arange(8.0).reshape(4, 2)}
  for axis in (0, 1):
    a, b = ocommon._split_tree(tree, axis=axis)
    np.testing.assert_array_equal(ocommon._stack(a, b, axis=axis)["x"], tree["x"])
  np.testing.assert_array_equal(ocommon._split_tree(tree)[1]["x"], [[4.0, 5.0], [6.0, 7.0]])
  ys = [{"v": jnp.asarray([1.0, 2.0])}, {"v": jnp.asarray([3.0, 4.0])}]
  np.testing.assert_array_equal(jax_utils._stack(ys, reverse=True)["v"], [[3.0, 4.0], [1.0, 2.0]])
  assert jax_utils._print_aval(jnp.zeros((2, 3))).shape == (2, 3)
  assert jax_utils._print_aval(object()).startswith("<object")
  np.testing.assert_allclose(gradient_learner._tree_mean(tree)["x"], [3.0, 4.0])
  np.testing.assert_allclose(gradient_learner._tree_mean_onp(tree)["x"], [3.0, 4.0])
  bad = {"x": jnp.asarray([jnp.nan, jnp.inf, 1.0])}
  np.testing.assert_allclose(gradient_learner._nan_to_num(bad, 7.0, use_jnp=True)["x"], [7.0, 7.0, 1.0])
  assert float(gradient_learner._nan_to_num(bad, 7.0)["x"][0]) == 0.0
  # Perturbations: standard deviation std (checked on 40,000 draws: the sample std is within 2%).
  big = {"w": jnp.zeros((200, 200))}
  noise = es_wrapper._sample_perturbations(big, jax.random.PRNGKey(0), 0.3)["w"]
  assert abs(float(jnp.std(noise)) / 0.3 - 1) < 0.02 and abs(float(jnp.mean(noise))) < 0.01
  eps, pos, neg = es_wrapper._vector_sample_perturbations({"w": jnp.ones(3)}, jax.random.PRNGKey(1), 0.1, 4)
  assert eps["w"].shape == (4, 3)
  np.testing.assert_allclose(pos["w"] - 1.0, eps["w"], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(1.0 - neg["w"], eps["w"], rtol=1e-5, atol=1e-7)
  direction = task_augmentation._sample_perturbations({"a": jnp.zeros(5), "b": jnp.zeros((2, 2))},
                                                      jax.random.PRNGKey(2))
  np.testing.assert_allclose(math.sqrt(sum(float(jnp.sum(x ** 2)) for x in jax.tree.leaves(direction))), 1.0,
                             rtol=1e-5)


def test_private_init_optimizer_and_dataset_helpers_follow_their_definitions():
  from metafam.compat.learned_optimization.tasks.parametric import parametric_utils as pu
  assert pu._compute_fans(()) == (1, 1) and pu._compute_fans((7,)) == (7, 7)
  assert pu._compute_fans((3, 5)) == (3, 5) and pu._compute_fans((3, 3, 4, 8)) == (36, 72)
  f = pu._partial_fn(lambda shape, dtype, key, scale: jnp.full(shape, scale, dtype), scale=2.5)
  np.testing.assert_array_equal(f((2,), jnp.float32, jax.random.PRNGKey(0), None), [2.5, 2.5])
  tx, ref = optax_opts._sm3(0.1, 0.9), optax.chain(optax.scale_by_sm3(0.9), optax.scale(-0.1))
  p = {"w": jnp.ones((3, 2))}
  g = {"w": jnp.asarray([[1.0, -2.0], [0.5, 0.0], [3.0, 1.0]])}
  assert_trees_close(tx.update(g, tx.init(p), p)[0], ref.update(g, ref.init(p), p)[0])
  assert optax_opts._expand_scalar(jnp.float32(3), True).shape == (1,)
  assert optax_opts._expand_scalar(jnp.ones(2), False).shape == (2,)
  np.testing.assert_array_equal(language._crop_or_pad(jnp.arange(5), 3, 0), [0, 1, 2])
  np.testing.assert_array_equal(language._crop_or_pad(jnp.arange(2), 4, 9), [0, 1, 9, 9])


def test_private_task_variants_and_constructors():
  from metafam.compat.learned_optimization.tasks.fixed import image_mlp_ae, mlp_mixer, rnn_lm, vit
  datasets = _blob_datasets()
  batch, key = next(datasets.train), jax.random.PRNGKey(1)
  mse = image_mlp._MLPImageTaskMSE(datasets, [16])
  params = mse.init(jax.random.PRNGKey(0))
  logits = mse._mod.apply(params, batch["image"])
  np.testing.assert_allclose(mse.loss(params, key, batch),
                             jnp.mean(jnp.square(logits - jax.nn.one_hot(batch["label"], 4))), rtol=1e-5)
  np.testing.assert_allclose(mse.normalizer(jnp.asarray([0.05, 3.0, jnp.nan])), [0.5, 10.0, 10.0], rtol=1e-6)
  for norm in ("layer_norm", "batch_norm"):
    task = image_mlp._MLPImageTaskNorm(datasets, [16], norm)
    params, state = task.init_with_state(jax.random.PRNGKey(0))
    loss, new_state = task.loss_with_state(params, state, key, batch)
    assert np.isfinite(float(loss)) and (norm == "layer_norm") == (new_state == {})
    assert any("norm" in k for k in params)
  with pytest.raises(ValueError, match="norm"):
    image_mlp._MLPImageTaskNorm(datasets, [16], "group_norm")
  ae = image_mlp_ae._make_task(image_mlp_ae._fc_ae_loss_fn([8], jax.nn.relu), datasets)
  params = ae.init(jax.random.PRNGKey(0))
  assert [x.shape for x in jax.tree.leaves(params)] == [(8,), (64, 8), (64,), (8, 64)]
  x = batch["image"].reshape(32, -1)
  lin = list(params.values())
  recon = jax.nn.sigmoid(jax.nn.relu(x @ lin[0]["w"] + lin[0]["b"]) @ lin[1]["w"] + lin[1]["b"])
  np.testing.assert_allclose(ae.loss(params, key, batch), jnp.mean(jnp.square(x - recon)), rtol=1e-5)
  assert float(ae.normalizer(jnp.asarray(3.0))) == 1.0
  for module, cls in ((mlp_mixer, mlp_mixer.MLPMixerTask), (vit, vit.VisionTransformerTask)):
    cfg_fn = getattr(module, "tiny_config16", None) or module.tall16_config
    made = module._make(cfg_fn, lambda: image.fashion_mnist_datasets(4, image_size=(32, 32), stack_channels=3))()
    assert isinstance(made, cls)
  fn, name, args = rnn_lm._delay_fn(hk.LSTM, 8)
  assert name == "LSTM" and args == (8,) and fn.func is hk.LSTM and fn.args == (8,)
  build = rnn_lm._partial(fn, 4, 10, lambda: language.lm1b_bytes_datasets(2, 5))
  lm = build()
  assert isinstance(lm, rnn_lm.TeacherForcedRNNLM) and lm.datasets.abstract_batch["obs"].shape == (2, 5)
