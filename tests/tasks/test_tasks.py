"""Task defaults are symmetric; built-in tasks compute the right numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.tasks.base import Task
from metafam.tasks.quadratic import QuadraticTask

BATCH = {"x": jnp.arange(12.0).reshape(4, 3) / 10.0, "y": jnp.array([1.0, -1.0, 0.5, 0.0])}


def _mse(params, batch):
  return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)


class _Base(Task):
  def init(self, key):
    return {"w": jax.random.normal(key, (3,)), "b": jnp.asarray(0.3)}


class OnlyLoss(_Base):
  def loss(self, params, key, batch):
    return _mse(params, batch)


class OnlyLossAndAux(_Base):
  def loss_and_aux(self, params, key, batch):
    return _mse(params, batch), {"mse": _mse(params, batch)}


class OnlyLossWithState(_Base):
  def loss_with_state(self, params, state, key, batch):
    return _mse(params, batch), state


class OnlyGeneral(Task):
  """Also defines only init_with_state, with a real model state (a counter)."""

  def init_with_state(self, key):
    return {"w": jax.random.normal(key, (3,)), "b": jnp.asarray(0.3)}, jnp.asarray(0)

  def loss_with_state_and_aux(self, params, state, key, batch):
    new_state = None if state is None else state + 1
    return _mse(params, batch), new_state, {"mse": _mse(params, batch)}


@pytest.mark.parametrize("cls", [OnlyLoss, OnlyLossAndAux, OnlyLossWithState, OnlyGeneral])
def test_any_one_loss_variant_gives_all_others(cls):
  task = cls()
  key = jax.random.key(0)
  params, state = task.init_with_state(key)
  params2 = task.init(key)
  jax.tree.map(np.testing.assert_array_equal, params, params2)
  expected = float(_mse(params, BATCH))
  assert float(task.loss(params, key, BATCH)) == pytest.approx(expected, rel=1e-6)
  loss, aux = task.loss_and_aux(params, key, BATCH)
  assert float(loss) == pytest.approx(expected, rel=1e-6)
  assert isinstance(aux, dict)
  loss, new_state = task.loss_with_state(params, state, key, BATCH)
  assert float(loss) == pytest.approx(expected, rel=1e-6)
  loss, new_state2, aux = task.loss_with_state_and_aux(params, state, key, BATCH)
  assert float(loss) == pytest.approx(expected, rel=1e-6)
  if cls is OnlyGeneral:
    assert int(new_state) == 1 and int(new_state2) == 1  # state threaded through
    assert float(aux["mse"]) == pytest.approx(expected, rel=1e-6)
  else:
    assert new_state is state
  # Every variant is differentiable and jittable.
  g = jax.jit(jax.grad(task.loss))(params, key, BATCH)
  g_ref = jax.grad(_mse)(params, BATCH)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), g, g_ref)


def test_task_without_loss_or_init_raises_clearly():
  class Empty(Task):
    pass

  with pytest.raises(NotImplementedError, match="must implement one of"):
    Empty().loss({}, jax.random.key(0), None)
  with pytest.raises(NotImplementedError, match="init"):
    Empty().init(jax.random.key(0))


def test_quadratic_task_value_and_gradient():
  target = jnp.arange(4.0)
  task = QuadraticTask(4, scale=3.0, target=target)
  x = jnp.ones(4)
  assert float(task.loss(x, None, None)) == pytest.approx(0.5 * 3.0 * float(jnp.sum((x - target) ** 2)))
  np.testing.assert_allclose(jax.grad(task.loss)(x, None, None), 3.0 * (x - target), rtol=1e-6)
  with pytest.raises(ValueError, match="target must have shape"):
    QuadraticTask(3, target=jnp.zeros(4))


def test_image_mlp_task_param_count_and_loss_at_init():
  from metafam.tasks._nn import num_params
  from metafam.tasks.image_mlp import ImageMLPTask
  task = ImageMLPTask((32,), image_size=8, batch_size=64)
  params = task.init(jax.random.key(0))
  assert num_params(params) == 64 * 32 + 32 + 32 * 10 + 10 == 2410
  losses = [float(task.loss(params, jax.random.key(i), next(task.datasets.train))) for i in range(3)]
  # Small random init: logits near zero, so the cross-entropy is near log(10) = 2.303.
  assert all(abs(l - np.log(10)) < 0.3 for l in losses)
  assert float(task.normalizer(jnp.log(10.0))) == pytest.approx(1.0)
  _, aux = task.loss_and_aux(params, jax.random.key(0), next(task.datasets.test))
  assert 0.0 <= float(aux["accuracy"]) <= 1.0


def test_registry_lists_and_builds_and_rejects_unknown():
  from metafam.tasks import get_task, list_tasks
  assert "fmnist_mlp_8x8_32" in list_tasks()
  assert get_task("quadratic_10").dim == 10
  with pytest.raises(KeyError, match="unknown task 'nope'; valid names: .*fmnist_mlp_8x8_32"):
    get_task("nope")
