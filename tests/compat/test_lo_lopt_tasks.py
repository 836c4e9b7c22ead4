"""LO's learned-optimizer-as-a-task modules under the compat prefix: `tasks.fixed.lopt`, `tasks.parametric.lopt`,
`tasks.parametric.lopt_trunc`.

Known answers: on a quadratic ``a * |w - c|^2`` trained by SGD with ``lr = exp(log_lr)`` the deviation shrinks by
``r = 1 - 2 a lr`` per step, so the unrolled meta-loss is the closed form ``mean_t a r^(2t) |w0 - c|^2`` and its
derivative in ``log_lr`` is that sum differentiated by hand; on a least-squares task with data the meta-loss and its
gradient equal a hand-written unroll (plain jnp, no metafam) differentiated by `jax.grad`. `TruncGradEstTask`'s
gradient is the estimator's own estimate from the same worker state and key.
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.outer_trainers import gradient_learner, lopt_truncated_step
from metafam.compat.learned_optimization.outer_trainers import truncated_pes, truncation_schedule
from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.datasets import base as dbase
from metafam.compat.learned_optimization.tasks.fixed import all as fixed_all
from metafam.compat.learned_optimization.tasks.fixed import lopt
from metafam.compat.learned_optimization.tasks.parametric import cfgobject
from metafam.compat.learned_optimization.tasks.parametric import lopt as p_lopt
from metafam.compat.learned_optimization.tasks.parametric import lopt_trunc as p_lopt_trunc
from metafam.datasets.base import Datasets

KEY = jax.random.PRNGKey(0)
W0, C = np.array([1.0, -2.0, 0.5], np.float32), np.array([0.3, 0.1, -0.4], np.float32)


class Quadratic(base.Task):
  """``a * |w - c|^2`` from ``w0`` (data-free); the normalizer doubles the loss (so its use is visible)."""

  def __init__(self, a=1.0):
    self.a = a

  def init(self, key):
    return {"w": jnp.asarray(W0)}

  def loss(self, params, key, batch):
    return self.a * jnp.sum((params["w"] - C) ** 2)

  def normalizer(self, loss):
    return 2.0 * loss


class QuadraticFamily(base.TaskFamily):
  """Quadratics with ``a`` uniform in [0.5, 1.5) (a traced config leaf)."""

  def sample(self, key):
    return jax.random.uniform(key, (), minval=0.5, maxval=1.5)

  def task_fn(self, cfg):
    return Quadratic(cfg)


def closed_form(a, log_lr, num_steps):
  """The normalized meta-loss of SGD on `Quadratic(a)` and its derivative in ``log_lr``."""
  lr, d0 = np.exp(log_lr), float(np.sum((W0 - C) ** 2))
  r = 1.0 - 2.0 * a * lr
  t = np.arange(num_steps)
  losses = 2.0 * a * r ** (2 * t) * d0
  # d/dlog_lr of r^(2t) = 2t r^(2t-1) * dr/dlog_lr, dr/dlog_lr = -2 a lr
  grads = 2.0 * a * d0 * 2 * t * r ** np.maximum(2 * t - 1, 0) * (-2.0 * a * lr)
  return losses.mean(), grads.mean()


def _endless(make):
  while True:
    yield make()


class LeastSquares(base.Task):
  """``mean((x @ w + b - y)^2)`` on batches ``{"x": [4, 3], "y": [4]}`` drawn from a seeded generator."""

  def __init__(self):
    rng = np.random.default_rng(0)
    make = lambda: {"x": rng.normal(size=(4, 3)).astype(np.float32),  # noqa: E731
                    "y": rng.normal(size=(4,)).astype(np.float32)}
    self.datasets = Datasets(*(_endless(make) for _ in range(4)))

  def init(self, key):
    return {"w": jax.random.normal(key, (3,)), "b": jnp.zeros(())}

  def loss(self, params, key, batch):
    return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)


def hand_unroll_sgd(theta, task, key, datas, num_steps):
  """SGD (lr = exp(log_lr)) written out: the mean of the losses before each update, init from LO's first split."""
  params = task.init(jax.random.split(key)[0])
  losses = []
  for t in range(num_steps):
    batch = jax.tree.map(lambda d: d[t], datas)
    loss, grad = jax.value_and_grad(task.loss)(params, None, batch)
    losses.append(task.normalizer(loss))
    params = jax.tree.map(lambda p, g: p - jnp.exp(theta["log_lr"]) * g, params, grad)
  return jnp.mean(jnp.stack(losses))


# -- tasks.fixed.lopt ------------------------------------------------------------------------------------------------
def test_lopt_task_on_a_quadratic_matches_the_closed_form_loss_and_meta_gradient():
  num_steps, lopt_ = 7, lopt_base.LearnableSGD(initial_lr=0.1)
  task = lopt.LOptTask(Quadratic(1.3), lopt_, num_steps)
  theta = task.init(KEY)
  assert task.datasets is None
  loss, grad = jax.value_and_grad(task.loss)(theta, KEY, ())
  want_loss, want_grad = closed_form(1.3, np.log(0.1), num_steps)
  # float32 through 7 steps of a contraction: relative errors of a few ulps per step
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  np.testing.assert_allclose(grad["log_lr"], want_grad, rtol=1e-4)
  assert abs(want_grad) > 0.1  # a gradient that is not trivially zero


def test_lopt_task_with_data_equals_a_hand_unroll_and_its_jax_grad():
  num_steps, inner = 5, LeastSquares()
  task = lopt.LOptTask(inner, lopt_base.LearnableSGD(initial_lr=0.05), num_steps)
  datas = next(task.datasets.train)
  assert jax.tree.map(np.shape, datas) == {"x": (5, 4, 3), "y": (5, 4)}
  assert jax.tree.map(lambda s: s.shape, task.datasets.abstract_batch) == {"x": (5, 4, 3), "y": (5, 4)}
  theta = task.init(KEY)
  loss, grad = jax.jit(jax.value_and_grad(task.loss))(theta, KEY, datas)
  want_loss, want_grad = jax.value_and_grad(hand_unroll_sgd)(theta, inner, KEY, datas, num_steps)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  np.testing.assert_allclose(grad["log_lr"], want_grad["log_lr"], rtol=1e-4, atol=1e-7)
  assert abs(float(want_grad["log_lr"])) > 1e-4


def test_lopt_task_family_task_is_the_mean_of_the_sampled_tasks_closed_forms():
  num_steps, batch, lopt_ = 4, 3, lopt_base.LearnableSGD(initial_lr=0.2)
  family = QuadraticFamily()
  task = lopt.LOptTaskFamilyTask(family, lopt_, num_steps=num_steps, outer_batch_size=batch)
  key = jax.random.PRNGKey(3)
  loss, grad = jax.value_and_grad(task.loss)(task.init(KEY), key, ())
  # each task's key is split(key, batch)[i]; its config is sampled from the first half of that key's split
  a = [float(family.sample(jax.random.split(k)[0])) for k in jax.random.split(key, batch)]
  assert len(set(a)) == batch
  forms = [closed_form(ai, np.log(0.2), num_steps) for ai in a]
  np.testing.assert_allclose(loss, np.mean([f[0] for f in forms]), rtol=1e-5)
  np.testing.assert_allclose(grad["log_lr"], np.mean([f[1] for f in forms]), rtol=1e-4)


def test_unrolled_loss_accepts_a_metafam_optimizer_and_names_bad_input():
  from metafam.optimizers import SGD
  want, _ = closed_form(1.0, np.log(0.1), 3)
  np.testing.assert_allclose(lopt.unrolled_loss(Quadratic(), SGD(0.1), KEY, (), 3), want, rtol=1e-5)
  with pytest.raises(ValueError, match="num_steps"):
    lopt.unrolled_loss(Quadratic(), SGD(0.1), KEY, (), 0)
  with pytest.raises(ValueError, match="num_steps"):
    lopt.LOptTask(Quadratic(), lopt_base.LearnableSGD(), num_steps=2.5)
  with pytest.raises(TypeError, match="lopt"):
    lopt.LOptTask(Quadratic(), SGD(0.1))
  with pytest.raises(TypeError, match="task"):
    lopt.LOptTask("Quadratic", lopt_base.LearnableSGD())
  with pytest.raises(ValueError, match="outer_batch_size"):
    lopt.LOptTaskFamilyTask(QuadraticFamily(), lopt_base.LearnableSGD(), 2, outer_batch_size=0)
  with pytest.raises(TypeError, match="task_family"):
    lopt.LOptTaskFamilyTask(Quadratic(), lopt_base.LearnableSGD())
  with pytest.raises(ValueError, match="task_name"):
    lopt._make_grad_est_lopt("Mnist", 4, 50, 5)
  with pytest.raises(TypeError, match="grad_estimator"):
    lopt.TruncGradEstTask(lopt_base.LearnableSGD(), object())


def _pes_task(num_tasks=2, length=6, trunc=3):
  lopt_ = lopt_base.LearnableSGD(initial_lr=0.1)
  step = lopt_truncated_step.VectorizedLOptTruncatedStep(
      QuadraticFamily(), lopt_, truncation_schedule.ConstantTruncationSchedule(length), num_tasks)
  return lopt.TruncGradEstTask(lopt_, truncated_pes.TruncatedPES(step, trunc, std=0.01, steps_per_jit=trunc))


def test_trunc_grad_est_task_gradient_is_the_estimate_and_its_state_carries():
  task = _pes_task()
  theta, state = task.init_with_state(KEY)
  k1, k2 = jax.random.split(jax.random.PRNGKey(5))
  (loss, state1), grad = jax.value_and_grad(task.loss_with_state, has_aux=True)(theta, state, k1, None)
  weights = gradient_learner.WorkerWeights(theta=theta, theta_model_state=None, outer_state=None)
  out, _ = task.grad_estimator.compute_gradient_estimate(weights, k1, state, with_summary=False)
  assert np.isfinite(loss) and np.isfinite(grad["log_lr"])
  np.testing.assert_array_equal(loss, out.mean_loss)
  np.testing.assert_array_equal(grad["log_lr"], out.grad["log_lr"])
  # the cotangent of the loss scales the gradient (the custom vjp): d(3 * loss) = 3 * estimate
  grad3 = jax.grad(lambda t: 3.0 * task.loss_with_state(t, state, k1, None)[0])(theta)
  np.testing.assert_allclose(grad3["log_lr"], 3.0 * out.grad["log_lr"], rtol=1e-6)
  # the state carries: each call advances every lane by one truncation (3 of the 6 steps), then they reset
  assert np.all(np.asarray(state.lanes.iteration) == 0) and np.all(np.asarray(state1.lanes.iteration) == 3)
  loss2, state2, aux = task.loss_with_state_and_aux(theta, state1, k2, None)
  assert np.isfinite(loss2) and aux == {} and loss2 != loss
  assert not np.array_equal(np.asarray(state2.lanes.iteration), np.asarray(state1.lanes.iteration))
  with pytest.raises(ValueError, match="init_with_state"):
    task.init(KEY)
  with pytest.raises(ValueError, match="loss_with_state"):
    task.loss(theta, KEY, None)


# -- the named tasks ---------------------------------------------------------------------------------------------
def test_every_named_lopt_task_builds_without_reading_data():
  assert len(lopt.TASKS) == 23 and set(lopt.TASKS) <= set(fixed_all.FIXED_TASKS)
  for name in lopt.TASKS:
    task = base.get_task_from_name(name)
    assert task.name == name and callable(getattr(fixed_all, name))
    kind = lopt.TASKS[name][0]
    if kind == "PES":
      assert isinstance(task, lopt.TruncGradEstTask) and task.datasets is None
    else:
      steps = lopt.TASKS[lopt.TASKS[name][1]][3] if kind == "ES" else lopt.TASKS[name][3]
      assert task.datasets.abstract_batch["image"].shape[:2] == (steps, 128), name
  cifar = lopt.LOpt_LearnableAdam_Cifar10_8_200()
  with pytest.raises(dbase.DatasetUnavailableError):
    next(cifar.datasets.train)
  with pytest.raises(dbase.DatasetUnavailableError):  # the PES task's truncated step is built on first use
    lopt.LOptPES_Adafac_Cifar_OuterBS4_Length50_Trunc5().init_with_state(KEY)


def test_a_fashion_mnist_lopt_task_trains_on_real_batches():
  task = lopt.LOpt_MLPLOpt_FahionMnist_10()
  datas = next(task.datasets.train)
  assert datas["image"].shape == (10, 128, 8, 8, 1)
  theta = task.init(KEY)
  loss, grad = jax.jit(jax.value_and_grad(task.loss))(theta, KEY, datas)
  assert np.isfinite(loss) and all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grad))
  assert any(np.any(g != 0) for g in jax.tree.leaves(grad))


# -- tasks.parametric -------------------------------------------------------------------------------------------
def test_parametric_lopt_samples_static_cfgs_and_its_task_fn_vmaps():
  family = p_lopt.ParametricLOpt(QuadraticFamily(), lopt_base.LearnableSGD(initial_lr=0.2), 4, 2)
  keys = jax.random.split(KEY, 3)
  cfgs = jax.vmap(family.sample)(keys)
  assert cfgs == family.sample(KEY) == cfgobject.CFGNamed("ParametricLOpt", {})
  theta = family.task_fn(family.sample(KEY)).init(KEY)
  losses = jax.vmap(lambda k: family.task_fn(family.sample(k)).loss(theta, k, ()))(keys)
  one = lopt.LOptTaskFamilyTask(QuadraticFamily(), family.lopt, 4, 2)
  np.testing.assert_allclose(losses, [one.loss(theta, k, ()) for k in keys], rtol=1e-6)
  assert len(set(np.asarray(losses).tolist())) == 3


def test_parametric_lopt_trunc_tasks_carry_state_and_vmap_over_keys():
  family = p_lopt_trunc.ParametricLOptTrunc(QuadraticFamily(), lopt_base.LearnableSGD(initial_lr=0.1),
                                            truncation_schedule.ConstantTruncationSchedule(6), 3, 2, 6,
                                            "TruncatedGrad")
  assert family.sample(KEY) == cfgobject.CFGNamed("ParametricLOpt", {})
  task = family.task_fn(family.sample(KEY))
  theta, state = task.init_with_state(KEY)
  keys = jax.random.split(KEY, 2)
  losses, grads = jax.vmap(lambda k: jax.value_and_grad(
      lambda t: family.task_fn(family.sample(k)).loss_with_state(t, state, k, None)[0])(theta))(keys)
  assert np.all(np.isfinite(losses)) and np.all(np.isfinite(grads["log_lr"]))
  with pytest.raises(NotImplementedError, match="TruncatedSNES"):
    p_lopt_trunc.ParametricLOptTrunc(QuadraticFamily(), lopt_base.LearnableSGD(),
                                     truncation_schedule.ConstantTruncationSchedule(6), 3, 2, 6, "TruncatedSNES")
  with pytest.raises(ValueError, match="mode"):
    p_lopt_trunc.ParametricLOptTrunc(QuadraticFamily(), lopt_base.LearnableSGD(),
                                     truncation_schedule.ConstantTruncationSchedule(6), 3, 2, 6, "PES")
  with pytest.raises(ValueError, match="unroll_length"):
    p_lopt_trunc.ParametricLOptTrunc(QuadraticFamily(), lopt_base.LearnableSGD(),
                                     truncation_schedule.ConstantTruncationSchedule(6), 0, 2, 6, "TruncatedPES")


@pytest.mark.parametrize("sampler", [p_lopt.sample_lopt, p_lopt_trunc.sample_lopt_trunc])
def test_sampled_configs_serialize_and_name_callables_that_exist(sampler):
  names = set()
  for i in range(12):
    cfg = sampler(jax.random.PRNGKey(i))
    assert cfgobject.deserialize_cfg(cfgobject.serialize_cfg(cfg)) == cfg
    lopt_cfg = cfg.kwargs["lopt"]
    names.add(lopt_cfg.obj)
    built = cfgobject.object_from_config(lopt_cfg)
    assert callable(built.opt_fn) and jax.tree.leaves(built.init(KEY))
  assert len(names) >= 3
  assert cfg == sampler(jax.random.PRNGKey(11))  # deterministic in the key


def test_a_sampled_parametric_lopt_config_builds_a_family():
  for i in range(40):
    cfg = p_lopt.sample_lopt(jax.random.PRNGKey(i))
    if cfg.kwargs["task_family"].kwargs["datasets"].obj == "fashion_mnist_datasets":
      break
  else:
    pytest.skip("no Fashion-MNIST config among the first 40 keys")
  family = cfgobject.object_from_config(cfg)
  assert isinstance(family, p_lopt.ParametricLOpt)
  steps, batch = cfg.kwargs["num_steps"].value, cfg.kwargs["outer_batch_size"].value
  assert family.datasets.abstract_batch["image"].shape[:2] == (batch, steps)


def test_timed_samplers_are_unavailable_offline():
  with pytest.raises(NotImplementedError, match="sample_lopt"):
    p_lopt.timed_sample_lopt(KEY)
  with pytest.raises(NotImplementedError, match="sample_lopt_trunc"):
    p_lopt_trunc.timed_sample_lopt_trunc(KEY, max_time=1.0)


@pytest.mark.slow  # 10-20 s here: the parametric MLP's 12-way activation switch compiled three times
def test_a_parametric_lopt_family_with_data_trains_on_stacked_batches():
  from metafam.compat.learned_optimization.tasks.datasets import image
  from metafam.compat.learned_optimization.tasks.parametric import image_mlp as p_image_mlp
  inner = p_image_mlp.ParametricImageMLP(image.fashion_mnist_datasets(4, (8, 8)), 10, (8,))
  family = p_lopt.ParametricLOpt(inner, lopt_base.LearnableSGD(initial_lr=0.1), 3, 2)
  datas = next(family.datasets.train)
  assert datas["image"].shape == (2, 3, 4, 8, 8, 1) and datas["label"].shape == (2, 3, 4)
  task = family.sample_task(KEY)
  theta = task.init(KEY)
  loss, grad = jax.value_and_grad(task.loss)(theta, KEY, datas)
  # the mean of the two sampled tasks' unrolls, each on its own slice of the stacked batches
  keys = jax.random.split(KEY, 2)
  per_task = [lopt.unrolled_loss(inner.task_fn(inner.sample(jax.random.split(k)[0])), lopt_base.LearnableSGD(
      ).opt_fn(theta), jax.random.split(k)[1], jax.tree.map(lambda d: d[i], datas), 3) for i, k in enumerate(keys)]
  np.testing.assert_allclose(loss, np.mean(per_task), rtol=1e-5)
  assert np.isfinite(grad["log_lr"]) and grad["log_lr"] != 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["LOpt_ES4_AdafacMLPLOpt_FashionMnist_20",
                                  "LOptPES_Adafac_Fashion_OuterBS4_Length50_Trunc5"])
def test_named_fashion_mnist_lopt_tasks_give_finite_losses_and_gradients(name):
  task = fixed_all.FIXED_TASKS[name]()
  theta, state = task.init_with_state(KEY)
  datas = None if task.datasets is None else next(task.datasets.train)
  (loss, _), grad = jax.value_and_grad(task.loss_with_state, has_aux=True)(theta, state, KEY, datas)
  assert np.isfinite(loss) and all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grad))
  assert any(np.any(g != 0) for g in jax.tree.leaves(grad))
