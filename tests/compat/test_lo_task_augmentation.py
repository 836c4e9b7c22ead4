"""`tasks.task_augmentation` of the learned_optimization compat layer: known values for every augmentation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.compat.learned_optimization.tasks import base as tasks_base
from metafam.compat.learned_optimization.tasks import quadratics
from metafam.compat.learned_optimization.tasks import task_augmentation as ta
from metafam.compat.learned_optimization.tasks.datasets import base as datasets_base
from metafam.tasks import augmentations as mf_aug


def _counting_datasets(batch=8):
  def it():
    i = 0
    while True:
      yield {"x": np.arange(batch, dtype=np.float32) + i}
      i += 1
  return datasets_base.Datasets(it(), it(), it(), it())


class LinearTask(tasks_base.Task):
  """loss = sum(w * mean(x)) + sum(v); params (w: f32[3], v: f32[2])."""

  def __init__(self):
    self.datasets = _counting_datasets()

  def init(self, key):
    return {"w": jnp.arange(1.0, 4.0), "v": jnp.full((2,), 2.0)}

  def loss(self, params, key, batch):
    return jnp.sum(params["w"] * jnp.mean(batch["x"])) + jnp.sum(params["v"])


class LinearFamily(tasks_base.TaskFamily):

  def __init__(self):
    super().__init__()
    self.datasets = _counting_datasets()

  def sample(self, key):
    return jnp.zeros(())

  def task_fn(self, cfg):
    return LinearTask()


KEY = jax.random.PRNGKey(0)
BATCH = {"x": jnp.arange(8.0)}  # mean 3.5


def test_reparam_weights_is_metafams_with_lo_argument():
  task = ta.ReparamWeights(LinearTask(), {"w": 2.0, "v": 0.5})
  assert isinstance(task, mf_aug.ReparamWeights)
  q = task.init(KEY)
  np.testing.assert_allclose(q["w"], [0.5, 1.0, 1.5])
  np.testing.assert_allclose(q["v"], [4.0, 4.0])
  np.testing.assert_allclose(task.loss(q, KEY, BATCH), 6 * 3.5 + 4.0)
  grads = jax.grad(task.loss)(q, KEY, BATCH)
  np.testing.assert_allclose(grads["w"], [7.0] * 3)  # 2 * 3.5
  np.testing.assert_allclose(grads["v"], [0.5, 0.5])


@pytest.mark.parametrize("level,distinct_per_leaf,distinct_in_leaf", [
    ("global", False, False), ("tensor", True, False), ("parameter", True, True)])
def test_reparam_family_levels(level, distinct_per_leaf, distinct_in_leaf):
  family = ta.ReparamWeightsFamily(LinearFamily(), level, (0.01, 100.0))
  task = family.sample_task(jax.random.PRNGKey(1))
  scale_w = 1.0 / task.init(KEY)["w"] * jnp.arange(1.0, 4.0)
  scale_v = 2.0 / task.init(KEY)["v"]
  assert bool(jnp.all((scale_w > 0.0099) & (scale_w < 101)))
  assert (float(jnp.ptp(scale_w)) > 1e-3) == distinct_in_leaf
  assert (abs(float(scale_w[0] - scale_v[0])) > 1e-3) == distinct_per_leaf
  # The scale is part of the sampled config: another sample differs, the same sample does not.
  again = family.sample_task(jax.random.PRNGKey(1)).init(KEY)
  other = family.sample_task(jax.random.PRNGKey(2)).init(KEY)
  np.testing.assert_allclose(again["w"], task.init(KEY)["w"])
  assert float(jnp.abs(other["w"] - again["w"]).max()) > 1e-3
  with pytest.raises(ValueError):
    ta.ReparamWeightsFamily(LinearFamily(), "layer")


def test_reduced_batchsize_family_slices_datasets_and_device_splits():
  family = ta.ReducedBatchsizeFamily(LinearFamily(), fraction_of_batchsize=0.25)
  np.testing.assert_array_equal(next(family.datasets.train)["x"], [0.0, 1.0])
  assert family.datasets.abstract_batch["x"].shape == (2,)
  task = family.sample_task(KEY)
  assert task.datasets is family.datasets
  np.testing.assert_allclose(task.loss(task.init(KEY), KEY, {"x": jnp.arange(8.0)}), 6 * 0.5 + 4.0)
  data_family = ta.ReducedBatchsizeFamily(quadratics.FixedDimQuadraticFamilyData(3), 0.5)
  assert data_family.datasets.has_device_data
  with pytest.raises(ValueError):
    ta.ReducedBatchsizeFamily(LinearFamily(), 0.0)


def test_convert_float_dtype():
  task = ta.ConvertFloatDType(LinearTask(), dtype=jnp.bfloat16)
  params = task.init(KEY)
  assert params["w"].dtype == jnp.bfloat16
  loss = task.loss(params, KEY, BATCH)
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, 25.0)
  family = ta.ConvertFloatDTypeTaskFamily(LinearFamily(), dtype=jnp.float16)
  assert family.sample_task(KEY).init(KEY)["v"].dtype == jnp.float16


def test_gradient_modifiers_known_values():
  base = LinearTask()
  params = base.init(KEY)
  doubled = ta.ModifyTaskGradient(base, lambda g, key: jax.tree.map(lambda x: 2 * x, g))
  np.testing.assert_allclose(doubled.loss(params, KEY, BATCH), base.loss(params, KEY, BATCH))
  np.testing.assert_allclose(jax.grad(doubled.loss)(params, KEY, BATCH)["w"], [7.0] * 3)
  normed = jax.grad(ta.NormalizeTaskGradient(base).loss)(params, KEY, BATCH)
  norm = np.sqrt(3 * 3.5 ** 2 + 2)
  np.testing.assert_allclose(normed["w"], [3.5 / norm] * 3, rtol=1e-6)
  np.testing.assert_allclose(normed["v"], [1 / norm] * 2, rtol=1e-6)
  # With as many directions as parameters the projection scale is 1: one direction gives an unbiased estimate
  # whose average over many keys approaches the gradient.
  sub = ta.SubsampleDirectionsTaskGradient(base, directions=1)
  grads = jax.vmap(lambda k: jax.grad(sub.loss)(params, k, BATCH))(jax.random.split(KEY, 4000))
  np.testing.assert_allclose(jnp.mean(grads["w"], 0), [3.5] * 3, atol=0.35)
  np.testing.assert_allclose(jnp.mean(grads["v"], 0), [1.0] * 2, atol=0.35)
  with pytest.raises(ValueError):
    ta.SubsampleDirectionsTaskGradient(base, directions=0)


def test_async_delayed_gradients_uses_stale_params():
  class Square(tasks_base.Task):
    datasets = None

    def init(self, key):
      return jnp.asarray(3.0)

    def loss(self, params, key, batch):
      return params ** 2

  task = ta.AsyncDelayedGradients(Square(), delay_steps=2)
  params, state = task.init_with_state(KEY)
  seen = []
  for new_params in [3.0, 1.0, 5.0, 0.5]:
    (loss, state), grad = jax.value_and_grad(task.loss_with_state, has_aux=True)(
        jnp.asarray(new_params), state, KEY, ())
    seen.append((float(loss), float(grad)))
  # Params pushed: 3, 1, 5, 0.5 after an initial buffer of [3, 3]: the stale params are 3, 3, 3, 1.
  assert seen == [(9.0, 6.0), (9.0, 6.0), (9.0, 6.0), (1.0, 2.0)]
  family = ta.AsyncDelayedGradientsTaskFamily(LinearFamily(), 3)
  _, state = family.sample_task(KEY).init_with_state(KEY)
  assert state[1]["w"].shape == (3, 3)
