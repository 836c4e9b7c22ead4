"""Tasks, datasets, optimizers and learned optimizers of the learned_optimization compatibility layer, checked
the way the reference's smoke tests check them."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import metafam
from metafam.compat.learned_optimization.learned_optimizers import adafac_mlp_lopt, adafac_nominal, mlp_lopt
from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.learned_optimizers import nn_adam, rnn_mlp_lopt
from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.compat.learned_optimization.optimizers import optax_opts
from metafam.compat.learned_optimization.tasks import base as tasks_base
from metafam.compat.learned_optimization.tasks import quadratics
from metafam.compat.learned_optimization.tasks.datasets import base as datasets_base

MODULES = ["tasks.base", "tasks.quadratics", "tasks.datasets.base", "optimizers.base", "optimizers.optax_opts",
           "learned_optimizers.base", "learned_optimizers.mlp_lopt", "learned_optimizers.adafac_mlp_lopt",
           "learned_optimizers.nn_adam", "learned_optimizers.rnn_mlp_lopt", "learned_optimizers.adafac_nominal",
           "outer_trainers.truncation_schedule", "outer_trainers.truncated_step",
           "outer_trainers.lopt_truncated_step", "outer_trainers.truncated_pes", "outer_trainers.full_es",
           "outer_trainers.truncated_es", "outer_trainers.truncated_grad", "outer_trainers.gradient_learner"]


@pytest.mark.parametrize("module", MODULES)
def test_module_tree_and_all(module):
  mod = importlib.import_module(f"metafam.compat.learned_optimization.{module}")
  for name in getattr(mod, "__all__", []):
    assert hasattr(mod, name), (module, name)


def smoketest_optimizer(optimizer, strict_types=True):
  """The reference's optimizer smoke test, restated: runs, keeps structure, shapes and (strictly) dtypes, accepts
  ``is_valid`` and carries the model state."""
  loss = lambda p: jnp.mean(p["a"] ** 2) + jnp.mean(p["b"] ** 2)
  for dtype in [jnp.float32] + ([jnp.float16] if strict_types else []):
    key = jax.random.PRNGKey(0)
    params = {"a": jnp.ones((3,), dtype), "b": jnp.ones((2, 2), dtype)}
    opt_state = optimizer.init(params, model_state=jnp.asarray(0), num_steps=100)
    spec = lambda tree: jax.tree.map(lambda x: (jnp.shape(x), jnp.asarray(x).dtype), tree)
    before = spec(opt_state)
    p, s = optimizer.get_params_state(opt_state)
    l, grad = jax.value_and_grad(loss)(p)
    opt_state = optimizer.update(opt_state, grad, loss=l, model_state=s + 1, key=key)
    assert jax.tree.structure(opt_state) == jax.tree.structure(jax.tree.map(lambda x: 0, opt_state))
    if strict_types:
      assert spec(opt_state) == before, optimizer.name
    opt_state = optimizer.update(opt_state, grad, loss=l, model_state=s + 1, is_valid=True, key=key)
    assert optimizer.get_state(opt_state) == 1
    new_params = optimizer.get_params(opt_state)
    assert all(x.dtype == dtype for x in jax.tree.leaves(new_params))
    assert float(loss(new_params)) < float(loss(params)) or "Fromage" in optimizer.name or "Lars" in optimizer.name
    moved = optimizer.set_params(opt_state, jax.tree.map(jnp.zeros_like, new_params))
    assert float(jnp.sum(optimizer.get_params(moved)["a"])) == 0.0


OPTIMIZERS = [optax_opts.SGD(0.1), optax_opts.SGDM(0.1), optax_opts.Adam(0.1), optax_opts.RMSProp(0.1),
              optax_opts.AdaBelief(0.1), optax_opts.AdamW(0.1), optax_opts.Fromage(0.1), optax_opts.Lars(0.1),
              optax_opts.Lamb(0.1), optax_opts.RAdam(0.1), optax_opts.SM3(0.1), optax_opts.Yogi(0.1),
              optax_opts.Adafactor(0.1), optax_opts.AdaGrad(0.1),
              optax_opts.PiecewiseLinearAdam(times=(0, 100), lrs=(0.1, 0.01)),
              opt_base.GradientClipOptimizer(optax_opts.Adam(0.1)),
              opt_base.GraftedOptimizer(optax_opts.SGD(0.1), optax_opts.Adam(0.1))]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: type(o).__name__)
def test_optimizer_smoke(optimizer):
  smoketest_optimizer(optimizer)


LEARNED = [lopt_base.LearnableSGD(), lopt_base.LearnableSGDM(), lopt_base.LearnableAdam(),
           lopt_base.learned_optimizer_from_opt(optax_opts.SGD(0.1)), mlp_lopt.MLPLOpt(),
           adafac_mlp_lopt.AdafacMLPLOpt(), nn_adam.NNAdam(),
           rnn_mlp_lopt.RNNMLPLOpt(hidden_size=8, lstm_hidden_size=8),
           adafac_nominal.MLPNomLOpt()]


@pytest.mark.parametrize("lopt", LEARNED, ids=lambda l: type(l).__name__)
def test_learned_optimizer_smoke(lopt):
  theta = lopt.init(jax.random.PRNGKey(0))
  opt = lopt.opt_fn(theta)
  assert isinstance(opt, opt_base.Optimizer)
  state = opt.init({"a": jnp.ones((3,), jnp.float16), "b": jnp.ones((2, 2), jnp.float16)}, num_steps=10)
  new = opt.update(state, jax.tree.map(jnp.ones_like, opt.get_params(state)), loss=1.0, is_valid=True,
                   key=jax.random.PRNGKey(1))
  same = lambda tree: jax.tree.map(lambda x: (jnp.shape(x), jnp.asarray(x).dtype), tree)
  assert same(new) == same(state)
  assert isinstance(lopt, metafam.optimizers.LearnedOptimizer)


def test_learned_optimizer_arguments():
  assert mlp_lopt.MLPLOpt(hidden_size=8, hidden_layers=1).hidden_sizes == (8,)
  assert float(jnp.exp(lopt_base.LearnableAdam(initial_lr=3e-3).init(None)["log_lr"])) == pytest.approx(3e-3)
  with pytest.raises(NotImplementedError):
    adafac_mlp_lopt.AdafacMLPLOpt(split_weights=True)
  with pytest.raises(ValueError):
    opt_base.GradientClipOptimizer(optax_opts.Adam)  # the class, not an instance
  with pytest.raises(ValueError):
    optax_opts.piecewise_linear((1, 2), (0.1,))


def test_data_free_tasks_accept_an_empty_batch():
  key = jax.random.PRNGKey(0)
  for task in [quadratics.QuadraticTask(), quadratics.LogQuadraticTask(), quadratics.SumQuadraticTask(),
               quadratics.FixedDimQuadraticFamily(5).sample_task(key),
               quadratics.NoisyQuadraticFamily(5, 0.1).sample_task(key)]:
    params = task.init(key)
    value, grad = jax.value_and_grad(task.loss)(params, key, ())
    assert np.isfinite(float(value)) and jax.tree.structure(grad) == jax.tree.structure(params)
    loss, state, aux = task.loss_with_state_and_aux(params, None, key, ())  # symmetric defaults
    assert float(loss) == pytest.approx(float(value))


def test_tasks_with_data_and_families():
  key = jax.random.PRNGKey(0)
  task = quadratics.BatchQuadraticTask()
  assert next(task.datasets.train).shape == (4, 2)
  family = tasks_base.single_task_to_family(task, name="bq")
  assert family.name == "bq" and family.task_fn(family.sample(key)) is task and family.eval_task_fn(0) is task
  data_family = quadratics.FixedDimQuadraticFamilyData(4)
  t = data_family.task_fn(data_family.sample(key))
  loss, aux = t.loss_and_aux(t.init(key), key, next(data_family.datasets.train))
  assert set(aux) == {"l1", "l2"} and float(t.normalizer(jnp.asarray(5000.0))) == 1000.0
  for fam in [quadratics.FixedDimQuadraticFamily(4), data_family, quadratics.NoisyQuadraticFamily(4, 0.5)]:
    assert isinstance(fam, metafam.TaskFamily)
    metafam.check_family(fam)
  with pytest.raises(ValueError):
    quadratics.FixedDimQuadraticFamily(0)


def test_datasets_module():
  assert datasets_base.Datasets is metafam.Datasets
  it = datasets_base.ThreadSafeIterator(iter(range(3)))
  assert list(it) == [0, 1, 2]
  calls = []

  @datasets_base.dataset_lru_cache
  def build(n):
    calls.append(n)
    return n

  assert build(1) == build(1) and calls == [1]
