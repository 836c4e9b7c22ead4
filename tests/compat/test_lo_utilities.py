"""The learned_optimization compat layer's helpers: test_utils smoke checks, fixed image-MLP tasks, truncation
schedules' step-driven ``next_state``, learning-rate schedules, tree_utils and training.vec_get_batch."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.compat.learned_optimization import training, tree_utils
from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.learned_optimizers import test_utils as lopt_test_utils
from metafam.compat.learned_optimization.optimizers import learning_rate_schedules as lrs
from metafam.compat.learned_optimization.optimizers import optax_opts
from metafam.compat.learned_optimization.optimizers import test_utils as opt_test_utils
from metafam.compat.learned_optimization.outer_trainers import gradient_learner, truncation_schedule
from metafam.compat.learned_optimization.tasks import quadratics
from metafam.compat.learned_optimization.tasks import test_utils as task_test_utils
from metafam.compat.learned_optimization.tasks.datasets import base as datasets_base
from metafam.compat.learned_optimization.tasks.fixed import image_mlp

NEW_MODULES = ["tasks.test_utils", "optimizers.test_utils", "learned_optimizers.test_utils",
               "outer_trainers.test_utils", "tasks.fixed.image_mlp", "optimizers.learning_rate_schedules",
               "learning_rate_schedules", "tree_utils", "training"]


@pytest.mark.parametrize("module", NEW_MODULES)
def test_new_modules_export_their_names(module):
  mod = importlib.import_module(f"metafam.compat.learned_optimization.{module}")
  for name in getattr(mod, "__all__", []):
    assert hasattr(mod, name), (module, name)


def test_smoketest_task_computes_the_tasks_own_loss():
  task = quadratics.QuadraticTask(4)
  out = task_test_utils.smoketest_task(task)
  params = task.init(jax.random.PRNGKey(0))
  np.testing.assert_allclose(out["loss"], task.loss(params, jax.random.PRNGKey(0), ()), rtol=1e-6)
  np.testing.assert_allclose(out["grads"], jax.grad(task.loss)(params, jax.random.PRNGKey(0), ()), rtol=1e-6)
  # Two samples of a family are two different tasks.
  first, second = task_test_utils.smoketest_task_family(quadratics.FixedDimQuadraticFamily(5))
  assert float(first["loss"]) != float(second["loss"])


def test_smoketest_optimizer_rejects_a_dtype_change():
  opt_test_utils.smoketest_optimizer(optax_opts.Adam(1e-3))
  lopt_test_utils.smoketest_learned_optimizer(lopt_base.LearnableSGDM())

  class Upcasting(optax_opts.SGD):
    def update(self, opt_state, grad, loss=None, model_state=None, key=None, **kwargs):
      state = super().update(opt_state, grad, loss=loss, model_state=model_state, key=key)
      return state.replace(params=jax.tree.map(lambda p: p.astype(jnp.float32), state.params))

  with pytest.raises(AssertionError, match="dtypes"):
    opt_test_utils.smoketest_optimizer(Upcasting(0.1))
  opt_test_utils.smoketest_optimizer(Upcasting(0.1), strict_types=False)


def test_fashion_mnist8_relu32_is_metafams_task():
  from metafam.tasks import get_task
  ours, theirs = image_mlp.ImageMLP_FashionMnist8_Relu32(), get_task("fmnist_mlp_8x8_32")
  assert ours.name == "ImageMLP_FashionMnist8_Relu32"
  key = jax.random.PRNGKey(3)
  params = ours.init(key)
  jax.tree.map(np.testing.assert_array_equal, params, theirs.init(key))
  batch = next(ours.datasets.train)
  assert batch["image"].shape == (128, 8, 8, 1) and batch["label"].shape == (128,)
  np.testing.assert_allclose(ours.loss(params, key, batch), theirs.loss(params, key, batch), rtol=1e-6)
  assert image_mlp.ImageMLP_FashionMnist_Relu128x128().datasets.abstract_batch["image"].shape == (128, 28, 28, 1)


def test_truncation_next_state_is_driven_by_the_step():
  key = jax.random.PRNGKey(0)
  const = truncation_schedule.ConstantTruncationSchedule(3)
  state = const.init(key, None)
  dones = []
  for step in range(5):
    state, done = const.next_state(state, step, key, None)
    dones.append(bool(done))
  assert dones == [False, False, False, True, True] and int(state.length) == 3
  logu = truncation_schedule.LogUniformLengthSchedule(2, 1000)
  state = logu.init(key, None)
  kept, done = logu.next_state(state, 1, jax.random.PRNGKey(5), None)
  assert not bool(done) and int(kept.length) == int(state.length)
  fresh, done = logu.next_state(state, 10 ** 4, jax.random.PRNGKey(5), None)
  assert bool(done) and int(fresh.length) == int(logu.init(jax.random.PRNGKey(5), None).length)
  sched = truncation_schedule.ScheduledTruncationSchedule(lrs.PiecewiseLinear([0, 10], [10, 100]))
  assert int(sched.init(key, gradient_learner.OuterState(5)).length) == 55
  assert int(sched.init(key, gradient_learner.OuterState(50)).length) == 100


def test_learning_rate_schedules_known_values():
  pw = lrs.PiecewiseLinear([0, 10], [1.0, 3.0])
  np.testing.assert_allclose([pw(-5), pw(5), pw(20)], [1.0, 2.0, 3.0])
  np.testing.assert_allclose(lrs.ExponentialDecay(2.0, 0.5)(3), 0.25)
  ramp = lrs.LinearRampupSqrtDecay(1.0, warmup_steps=100)
  np.testing.assert_allclose([ramp(50), ramp(100), ramp(400)], [0.5, 1.0, 0.5], rtol=1e-6)
  cos = lrs.CosineLearningRateSchedule(1.0, min_learning_rate_mult=0.1, constant_fraction=0.5, warmup_fraction=0.1)
  np.testing.assert_allclose([cos(25, 100), cos(50, 100), cos(75, 100), cos(100, 100)], [0.5, 1.0, 0.55, 0.1],
                             rtol=1e-5)
  with pytest.raises(ValueError):
    lrs.PiecewiseLinear([0, 1], [1.0])
  with pytest.raises(ValueError):
    cos(3)


def test_tree_utils_known_values():
  a, b = {"x": jnp.array([1.0, 2.0]), "y": jnp.array(3.0)}, {"x": jnp.array([1.0, 1.0]), "y": jnp.array(2.0)}
  np.testing.assert_allclose(tree_utils.tree_add(a, b)["x"], [2.0, 3.0])
  np.testing.assert_allclose(tree_utils.tree_sub(a, 1.0)["y"], 2.0)
  np.testing.assert_allclose(tree_utils.tree_div(a, b)["y"], 1.5)
  np.testing.assert_allclose(tree_utils.tree_dot(a, b), 9.0)
  np.testing.assert_allclose(tree_utils.tree_norm(a), np.sqrt(14.0), rtol=1e-6)
  np.testing.assert_allclose(tree_utils.tree_mean(a), 2.0)
  stacked = tree_utils.tree_zip_jnp([a, b])
  assert stacked["x"].shape == (2, 2) and tree_utils.first_dim(stacked) == 2
  names = tree_utils.map_named(lambda name, x: name, {"w": {"b": 1, "k": 2}})
  assert names == {"w": {"b": "w/b", "k": "w/k"}}
  tree = {"count": jnp.asarray(2, jnp.int32), "w": jnp.asarray(1.5)}
  parts, unflatten = tree_utils.partition([lambda k, v: jnp.asarray(v).dtype == jnp.int32], tree)
  assert [len(p) for p in parts] == [1, 1]
  back = unflatten([parts[0], [p * 2 for p in parts[1]]])
  assert int(back["count"]) == 2 and float(back["w"]) == 3.0
  with pytest.raises(ValueError):
    tree_utils.partition([lambda k, v: False], tree, strict=True)


def test_vec_get_batch_stacks_consecutive_batches():
  def counter():
    i = 0
    while True:
      yield {"x": np.full((2,), i, np.float32)}
      i += 1

  datasets = datasets_base.Datasets(counter(), counter(), counter(), counter())
  family = type("Fam", (), {"datasets": datasets})()
  batch = training.vec_get_batch(family, 3, split="train")
  np.testing.assert_array_equal(batch["x"], [[0, 0], [1, 1], [2, 2]])
  batch = training.get_batches(family, [2, 2], split="inner_valid", numpy=True)
  assert isinstance(batch["x"], np.ndarray) and batch["x"].shape == (2, 2, 2)
  np.testing.assert_array_equal(batch["x"][:, :, 0], [[0, 1], [2, 3]])
  assert training.vec_get_batch(quadratics.FixedDimQuadraticFamily(3), 4, split="train") == ()


def test_sm3_on_scalar_params_equals_sm3_on_one_vectors():
  opt = optax_opts.SM3(0.1)
  scalar = opt.init({"a": jnp.asarray(1.0)})
  vector = opt.init({"a": jnp.asarray([1.0])})
  for g in (2.0, -1.0, 0.5):
    scalar = opt.update(scalar, {"a": jnp.asarray(g)}, loss=0.0)
    vector = opt.update(vector, {"a": jnp.asarray([g])}, loss=0.0)
  assert opt.get_params(scalar)["a"].shape == ()
  np.testing.assert_allclose(opt.get_params(scalar)["a"], opt.get_params(vector)["a"][0], rtol=1e-6)
  assert float(opt.get_params(scalar)["a"]) != 1.0


def test_same_data_meta_loss_split_is_metafams_same_batch():
  from metafam.compat.learned_optimization.outer_trainers import lopt_truncated_step
  step = lopt_truncated_step.VectorizedLOptTruncatedStep(
      quadratics.FixedDimQuadraticFamilyData(3), lopt_base.LearnableSGD(),
      truncation_schedule.ConstantTruncationSchedule(4), num_tasks=2, meta_loss_split="same_data")
  assert step.meta_loss_split == "same_batch"
  assert jax.tree.leaves(step.get_outer_batch())[0].shape[0] == 2


def test_adafac_split_weights_layout_is_the_concatenated_one():
  from metafam.compat.learned_optimization.learned_optimizers import adafac_mlp_lopt
  full = adafac_mlp_lopt.AdafacMLPLOpt(step_mult=10, exp_mult=1)
  split = adafac_mlp_lopt.AdafacMLPLOpt(concat_weights=False, split_weights=True, step_mult=10, exp_mult=1)
  theta = full.init(jax.random.PRNGKey(0))
  params, grads = {"w": jnp.ones((2, 3))}, {"w": jnp.full((2, 3), 0.5)}
  state = full.opt_fn(theta).init(params, num_steps=10)
  a = full.opt_fn(theta).update(state, grads, loss=1.0)
  b = split.opt_fn(theta).update(state, grads, loss=1.0)
  np.testing.assert_array_equal(a.params["w"], b.params["w"])
  assert float(jnp.abs(a.params["w"] - 1.0).max()) > 0
  with pytest.raises(NotImplementedError):
    adafac_mlp_lopt.AdafacMLPLOpt(concat_weights=False, split_weights=False)
