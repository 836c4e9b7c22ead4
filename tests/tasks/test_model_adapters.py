"""The model adapters of `metafam.tasks` (plain functions, Equinox, Flax NNX, Flax linen) and `FunctionFamily`: each
task's loss and gradient equal the hand-written library code's, model state updates as the library's own eager call
does, families are vmappable and train, and an Equinox module handed over whole as params is refused in one line
that names the leaf and the fix."""

import ast
import os
import subprocess
import sys

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.optimizers import Adam
from metafam.taskfamilies import FunctionFamily, check_family, single_task_to_family
from metafam.tasks import FunctionTask, Task, equinox_task, linen_task, nnx_task, non_array_leaf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = jax.random.key(0)
X = jax.random.normal(jax.random.key(1), (16, 4))
BATCH = {"x": X, "y": jnp.sin(X[:, :1]) + 0.5 * X[:, 1:2]}


def _close(a, b):
  jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6), a, b)


def eqx_mse(model, key, batch):
  return jnp.mean((jax.vmap(model)(batch["x"]) - batch["y"]) ** 2)


def call_mse(model, key, batch):
  return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)


class NNXNet(nnx.Module):
  def __init__(self, width, rngs, batch_norm=False):
    self.hidden = nnx.Linear(4, width, rngs=rngs)
    self.norm = nnx.BatchNorm(width, rngs=rngs) if batch_norm else None
    self.out = nnx.Linear(width, 1, rngs=rngs)

  def __call__(self, x):
    h = self.hidden(x)
    return self.out(jax.nn.relu(h if self.norm is None else self.norm(h)))


class LinenNet(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(jnp.tanh(nn.Dense(self.width)(x)))


def test_function_task_is_its_two_functions():
  init = lambda key: {"w": jax.random.normal(key, (4, 1))}
  loss = lambda p, key, batch: jnp.mean((batch["x"] @ p["w"] - batch["y"]) ** 2)
  task = FunctionTask(init, loss, name="linear")
  params = task.init(KEY)
  _close(params, init(KEY))
  assert task.name == "linear" and task.datasets is None
  assert float(task.loss(params, KEY, BATCH)) == pytest.approx(float(loss(params, KEY, BATCH)))
  _close(jax.grad(task.loss)(params, KEY, BATCH), jax.grad(loss)(params, KEY, BATCH))
  assert task.loss_and_aux(params, KEY, BATCH)[1] == {}
  with pytest.raises(TypeError, match="FunctionTask: loss must be callable, got int"):
    FunctionTask(init, 3)


def test_equinox_task_matches_partition_and_combine_by_hand():
  make = lambda key: eqx.nn.MLP(4, 1, 8, 2, key=key)
  task = equinox_task(make, eqx_mse)
  params = task.init(KEY)
  hand_params, static = eqx.partition(make(KEY), eqx.is_inexact_array)
  _close(params, hand_params)
  assert non_array_leaf(params) is None and len(jax.tree.leaves(params)) == 6  # 3 weights, 3 biases
  hand_loss = lambda p: eqx_mse(eqx.combine(p, static), KEY, BATCH)
  assert float(jax.jit(task.loss)(params, KEY, BATCH)) == pytest.approx(float(hand_loss(hand_params)), rel=1e-6)
  _close(jax.jit(jax.grad(task.loss))(params, KEY, BATCH), jax.grad(hand_loss)(hand_params))
  assert task.init_with_state(KEY)[1] is None  # no arrays besides the params
  assert task.name == "equinox_eqx_mse"
  assert equinox_task(make, lambda m, key, batch: eqx_mse(m, key, batch)).name == "equinox_task"
  assert FunctionTask(lambda key: 0.0, lambda p, key, batch: p).name == "FunctionTask"


def test_equinox_task_of_a_built_model_returns_its_arrays_for_every_key():
  model = eqx.nn.MLP(4, 1, 8, 2, key=jax.random.key(3))
  task = equinox_task(model, eqx_mse)
  _close(task.init(KEY), task.init(jax.random.key(9)))
  _close(task.init(KEY), eqx.filter(model, eqx.is_inexact_array))
  assert float(task.loss(task.init(KEY), KEY, BATCH)) == pytest.approx(float(eqx_mse(model, KEY, BATCH)), rel=1e-6)


def test_equinox_integer_arrays_are_model_state_not_params():
  class Shifted(eqx.Module):
    linear: eqx.nn.Linear
    index: jax.Array

    def __call__(self, x):
      return self.linear(x)[self.index]

  make = lambda key: Shifted(eqx.nn.Linear(4, 3, key=key), jnp.array(2))
  task = equinox_task(make, lambda m, key, batch: jnp.mean((jax.vmap(m)(batch["x"]) - batch["y"][:, 0]) ** 2))
  params, state = task.init_with_state(KEY)
  assert all(jnp.issubdtype(leaf.dtype, jnp.floating) for leaf in jax.tree.leaves(params))
  assert [int(leaf) for leaf in jax.tree.leaves(state)] == [2]
  want = jnp.mean((jax.vmap(make(KEY))(X) - BATCH["y"][:, 0]) ** 2)
  loss, new_state = task.loss_with_state(params, state, KEY, BATCH)
  assert float(loss) == pytest.approx(float(want), rel=1e-6)
  _close(new_state, state)
  with pytest.raises(ValueError, match=r"arrays that are not trained params \(\.index\).*init_with_state"):
    task.loss(params, KEY, BATCH)


def test_nnx_task_matches_split_and_merge_by_hand():
  make = lambda key: NNXNet(8, nnx.Rngs(key))
  task = nnx_task(make, call_mse)
  params = task.init(KEY)
  graphdef, hand_state = nnx.split(make(KEY))
  _close(params, nnx.to_pure_dict(hand_state))
  assert sorted(params) == ["hidden", "out"] and sorted(params["hidden"]) == ["bias", "kernel"]
  hand_loss = lambda p: call_mse(nnx.merge(graphdef, p), KEY, BATCH)
  assert float(jax.jit(task.loss)(params, KEY, BATCH)) == pytest.approx(float(hand_loss(params)), rel=1e-6)
  _close(jax.jit(jax.grad(task.loss))(params, KEY, BATCH), jax.grad(hand_loss)(params))


def test_nnx_batch_norm_statistics_update_as_the_eager_call_does():
  make = lambda key: NNXNet(8, nnx.Rngs(key), batch_norm=True)
  task = nnx_task(make, call_mse)
  params, state = task.init_with_state(KEY)
  assert sorted(params["norm"]) == ["bias", "scale"] and sorted(state["norm"]) == ["mean", "var"]
  loss, new_state = jax.jit(task.loss_with_state)(params, state, KEY, BATCH)
  eager = make(KEY)
  want = call_mse(eager, KEY, BATCH)  # train mode: updates eager.norm's running averages in place
  assert float(loss) == pytest.approx(float(want), rel=1e-5)
  np.testing.assert_allclose(new_state["norm"]["mean"], eager.norm.mean[...], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(new_state["norm"]["var"], eager.norm.var[...], rtol=1e-5)
  assert not np.allclose(new_state["norm"]["mean"], state["norm"]["mean"])
  with pytest.raises(ValueError, match=r"\['norm'\]\['mean'\]"):
    task.loss(params, KEY, BATCH)


def test_linen_task_matches_init_and_apply_by_hand():
  module = LinenNet(8)
  task = linen_task(module, call_mse, example_args=(X[:1],))
  params = task.init(KEY)
  hand = module.init(KEY, X[:1])["params"]
  _close(params, hand)
  hand_loss = lambda p: jnp.mean((module.apply({"params": p}, X) - BATCH["y"]) ** 2)
  assert float(jax.jit(task.loss)(params, KEY, BATCH)) == pytest.approx(float(hand_loss(hand)), rel=1e-6)
  _close(jax.jit(jax.grad(task.loss))(params, KEY, BATCH), jax.grad(hand_loss)(hand))
  with pytest.raises(TypeError, match="example_args must be a tuple"):
    linen_task(module, call_mse, example_args=X[:1])
  with pytest.raises(TypeError, match="module must be a flax.linen.Module, got function"):
    linen_task(lambda key: module, call_mse, (X[:1],))


def test_adapters_refuse_what_is_not_a_model_or_a_function():
  with pytest.raises(TypeError, match="equinox_task: model must be a equinox.*Module or a function key -> model"):
    equinox_task(3, eqx_mse)
  with pytest.raises(TypeError, match="nnx_task: loss must be callable"):
    nnx_task(lambda key: NNXNet(4, nnx.Rngs(key)), None)


def _scaled_mlp_family(width):
  def task_fn(cfg):
    def make(key):
      model = eqx.nn.MLP(4, 1, width, 1, key=key)
      return jax.tree.map(lambda a: a * cfg["init_scale"] if eqx.is_inexact_array(a) else a, model)
    return equinox_task(make, lambda m, key, batch: eqx_mse(m, key, BATCH))  # data-free: batch is None

  sample = lambda key: {"init_scale": jax.random.uniform(key, (), minval=0.5, maxval=2.0)}
  return FunctionFamily(sample, task_fn, name=f"mlp_{width}")


def test_function_family_of_an_adapter_is_vmappable_and_its_sampled_scale_scales_the_init():
  family = _scaled_mlp_family(8)
  assert family.name == "mlp_8"
  check_family(family)
  one = family.task_fn({"init_scale": jnp.float32(1.0)}).init(KEY)
  three = family.task_fn({"init_scale": jnp.float32(3.0)}).init(KEY)
  _close(three, jax.tree.map(lambda a: 3.0 * a, one))
  keys = jax.random.split(KEY, 4)
  cfgs = jax.vmap(family.sample)(keys)
  params = jax.vmap(lambda c, k: family.task_fn(c).init(k))(cfgs, keys)
  assert params.layers[0].weight.shape == (4, 8, 4)
  with pytest.raises(TypeError, match="FunctionFamily: task_fn must be callable"):
    FunctionFamily(family.sample, "task")




def test_vmapped_training_of_an_nnx_family_with_batch_norm_lowers_the_loss():
  data_batch = BATCH

  def task_fn(cfg):
    return nnx_task(lambda key: NNXNet(8, nnx.Rngs(key), batch_norm=True),
                    lambda m, key, batch: call_mse(m, key, data_batch))

  family = FunctionFamily(lambda key: {"unused": jnp.zeros(())}, task_fn, name="nnx_bn")
  step = TruncatedStep(family, Adam(0.03), num_tasks=4, schedule=ConstantSchedule(100), meta_loss_split=None)
  state = step.init_step_state({}, jax.random.key(0))
  state, out = step.unroll({}, state, jax.random.key(1), 60)
  first, last = np.asarray(out.loss[0]), np.asarray(out.loss[-5:]).mean(axis=0)
  assert first.shape == (4,) and np.all(last < 0.5 * first), (first, last)


class _ModuleAsParams(Task):
  """What an Equinox user writes first: the whole module as the params."""

  def init(self, key):
    return eqx.nn.MLP(4, 1, 8, 1, key=key)

  def loss(self, params, key, batch):
    return eqx_mse(params, key, BATCH)


def test_an_equinox_module_passed_as_params_gets_one_line_naming_the_leaf_and_the_fix():
  with pytest.raises(ValueError) as info:
    check_family(single_task_to_family(_ModuleAsParams()))
  message = str(info.value)
  assert "\n" not in message
  assert "params leaf .activation is a custom_jvp (relu), not an array" in message
  assert "eqx.partition(model, eqx.is_inexact_array)" in message and "equinox_task" in message
  assert non_array_leaf({"a": jnp.ones(2), "b": [1.0, np.float32(2)]}) is None
  assert non_array_leaf({"a": jnp.ones(2), "f": jnp.tanh})[0] == "['f']"


def test_an_equinox_module_as_params_gets_the_same_line_from_trainer_and_truncated_step():
  """Without check_family: the engines refuse it where they first initialize the task, before optax sees it."""
  from metafam.training import Trainer
  import re
  expected = re.escape("task '_ModuleAsParams': params leaf .activation is a custom_jvp (relu), not an array")
  with pytest.raises(ValueError, match=expected) as info:
    Trainer(_ModuleAsParams(), Adam(0.01), eval_every=5, eval_batches=1, progress=False).fit(10)
  assert "\n" not in str(info.value) and "equinox_task" in str(info.value)
  step = TruncatedStep(single_task_to_family(_ModuleAsParams()), Adam(0.01), num_tasks=2,
                       schedule=ConstantSchedule(10), meta_loss_split=None)
  with pytest.raises(ValueError, match=expected):
    step.init_step_state({}, jax.random.key(0))


def test_a_non_array_config_leaf_is_named():
  family = FunctionFamily(lambda key: {"act": jax.nn.relu}, lambda cfg: FunctionTask(lambda k: jnp.zeros(2),
                                                                                      lambda p, k, b: jnp.sum(p)))
  with pytest.raises(ValueError, match=r"config leaf \['act'\] is a .*\(relu\), not an array"):
    check_family(family)


def test_flax_and_equinox_are_imported_lazily():
  tree = ast.parse(open(os.path.join(ROOT, "metafam", "tasks", "adapters.py"), encoding="utf-8").read())
  top = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
  top |= {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
  assert not {m for m in top if m.split(".")[0] in ("flax", "equinox")}, top
  code = ("import sys; sys.modules['equinox'] = None\n"
          "import metafam, metafam.tasks, metafam.taskfamilies, metafam.datasets\n"
          "from metafam.tasks import equinox_task\n"
          "try:\n  equinox_task(lambda k: None, lambda m, k, b: 0.0)\n"
          "except ImportError as e:\n  print(e)\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
  assert proc.returncode == 0, proc.stderr
  assert 'equinox_task needs equinox (pip install "metafam[equinox]")' in proc.stdout
