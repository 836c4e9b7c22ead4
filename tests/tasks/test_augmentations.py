"""Task and family augmentations against hand computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.taskfamilies import augmentations as faug
from metafam.taskfamilies.quadratic import NoisyQuadraticFamily, QuadraticFamily
from metafam.tasks import augmentations as aug
from metafam.tasks.base import Task
from metafam.tasks.image_mlp import ImageMLPTask
from metafam.tasks.quadratic import QuadraticTask
from test_conformance import check_augmented_family

BATCH = {"x": jnp.arange(24.0).reshape(8, 3) / 10.0 - 1.0, "y": jnp.linspace(-1.0, 1.0, 8)}


class _Regression(Task):
  """Linear regression with dict params, an aux value, a call-counting model state and a normalizer."""

  def init_with_state(self, key):
    return {"w": jax.random.normal(key, (3,)), "b": jnp.asarray(0.3)}, jnp.zeros((), jnp.float32)

  def loss_with_state_and_aux(self, params, state, key, batch):
    err = batch["x"] @ params["w"] + params["b"] - batch["y"]
    return jnp.mean(err ** 2), None if state is None else state + 1, {"max_err": jnp.max(jnp.abs(err))}

  def normalizer(self, loss):
    return loss / 4.0


@pytest.fixture(scope="module")
def mlp():
  return ImageMLPTask((8,), image_size=8, batch_size=16)


@pytest.fixture(scope="module")
def mlp_params(mlp):
  return jax.jit(mlp.init)(jax.random.key(0))  # eager haiku init is several times slower than one compile


def _close(a, b, **kw):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), **kw),
               a, b)


def test_wrappers_keep_datasets_name_and_every_loss_variant(mlp):
  key, batch = jax.random.key(0), BATCH
  base = _Regression()
  for wrapped in [aug.ReparamWeights(base, 2.0), aug.ReducedBatchSize(base, 8), aug.LossScale(base, 1.0),
                  aug.NoisyGradients(base, 0.0), aug.ClipGradients(base, 1e6), aug.LowPrecision(base, jnp.float32)]:
    assert wrapped.task is base and wrapped.name.startswith("_Regression_")
    params, state = wrapped.init_with_state(key)
    loss, new_state, aux = wrapped.loss_with_state_and_aux(params, state, key, batch)
    # With these neutral settings every wrapper computes exactly the base task's numbers.
    ref = base.loss_with_state_and_aux(*base.init_with_state(key), key, batch)
    _close((loss, new_state, aux), ref, rtol=1e-6)
    assert float(wrapped.loss(params, key, batch)) == pytest.approx(float(loss), rel=1e-6)
    assert float(wrapped.loss_with_state(params, state, key, batch)[0]) == pytest.approx(float(loss), rel=1e-6)
    assert set(wrapped.loss_and_aux(params, key, batch)[1]) == {"max_err"}
    assert float(wrapped.normalizer(loss)) == pytest.approx(float(loss) / 4.0, rel=1e-6)
  assert aug.ReducedBatchSize(mlp, 4).datasets is mlp.datasets
  assert aug.BF16Params(mlp).name == f"{mlp.name}_bfloat16"


@pytest.mark.parametrize("scales", [4.0, {"w": jnp.asarray([0.5, 2.0, 8.0]), "b": 0.25}])
def test_reparam_weights(scales):
  base = _Regression()
  task = aug.ReparamWeights(base, scales)
  key = jax.random.key(1)
  p0 = base.init(key)
  s = jax.tree.map(lambda sc, sub: jax.tree.map(lambda p: jnp.broadcast_to(jnp.asarray(sc), p.shape), sub), scales, p0)
  q0 = task.init(key)
  _close(q0, jax.tree.map(lambda p, sc: p / sc, p0, s), rtol=1e-6)
  q = jax.tree.map(lambda x: x + 0.1, q0)  # any point
  p = jax.tree.map(lambda x, sc: x * sc, q, s)
  # loss(q) == base.loss(q * scale) and grad_q == scale * grad_p at p = q * scale (chain rule).
  assert float(task.loss(q, key, BATCH)) == pytest.approx(float(base.loss(p, key, BATCH)), rel=1e-6)
  grad_q = jax.grad(task.loss)(q, key, BATCH)
  grad_p = jax.grad(base.loss)(p, key, BATCH)
  _close(grad_q, jax.tree.map(lambda g, sc: g * sc, grad_p, s), rtol=1e-5)
  with pytest.raises(ValueError, match="prefix of the params"):
    aug.ReparamWeights(base, {"w": 1.0, "c": 2.0}).init(key)
  with pytest.raises(ValueError, match="positive"):
    aug.ReparamWeights(base, 0.0)


def test_reduced_batch_size_slices_the_batch(mlp, mlp_params):
  task = aug.ReducedBatchSize(mlp, 5)
  key, batch = jax.random.key(1), next(mlp.datasets.train)
  sliced = {k: v[:5] for k, v in batch.items()}
  value_and_grad = lambda t, b: jax.jit(jax.value_and_grad(t.loss_and_aux, has_aux=True))(mlp_params, key, b)
  (loss, aux), grad = value_and_grad(task, batch)
  (ref_loss, ref_aux), ref_grad = value_and_grad(mlp, sliced)
  assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
  assert float(aux["accuracy"]) == pytest.approx(float(ref_aux["accuracy"]))
  # The accuracy of 5 examples is a multiple of 1/5: the loss really saw 5 examples.
  assert float(aux["accuracy"]) * 5 == pytest.approx(round(float(aux["accuracy"]) * 5), abs=1e-5)
  _close(grad, ref_grad, rtol=1e-5, atol=1e-7)
  assert aug.ReducedBatchSize(QuadraticTask(3), 2).loss(jnp.ones(3), key, None) == pytest.approx(1.5)
  with pytest.raises(ValueError, match="exceeds the datasets' batch size 16"):
    aug.ReducedBatchSize(mlp, 17)


def test_bf16_params(mlp, mlp_params):
  task = aug.BF16Params(mlp)
  key = jax.random.key(0)
  params = jax.jit(task.init)(key)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  _close(params, mlp_params, rtol=2 ** -8)  # round-to-nearest: relative error <= 2^-9 per entry
  loss_fn = jax.jit(jax.value_and_grad(task.loss_and_aux, has_aux=True))
  ref_fn = jax.jit(mlp.loss)
  for _ in range(3):
    batch = next(mlp.datasets.train)
    (loss, aux), grads = loss_fn(params, key, batch)
    assert loss.dtype == jnp.float32 and aux["accuracy"].dtype == jnp.float32
    assert all(g.dtype == jnp.bfloat16 for g in jax.tree.leaves(grads))
    # bf16 keeps 8 significant bits: the returned loss (~2.3) is a bf16 value (spacing 2^-6 in [2, 4), so rounding
    # alone is up to 2^-7 / 2.3 relative), and rounding inputs and weights (2^-9 each) perturbs the logits by a few
    # 2^-9. Allow 2^-6 relative, i.e. about two bf16 steps; measured errors are ~0.1-0.3%.
    assert float(loss) == pytest.approx(float(ref_fn(mlp_params, key, batch)), rel=2 ** -6)
  with pytest.raises(ValueError, match="floating dtype"):
    aug.LowPrecision(mlp, jnp.int32)


def test_low_precision_keeps_model_state_dtype():
  task = aug.LowPrecision(_Regression(), jnp.float16)
  params, state = task.init_with_state(jax.random.key(0))
  assert params["w"].dtype == jnp.float16 and state.dtype == jnp.float32
  _, new_state = task.loss_with_state(params, state, jax.random.key(0), BATCH)
  assert new_state.dtype == jnp.float32 and float(new_state) == 1.0
  # Params promoted to float32 by an optimizer update are rounded back for the computation.
  promoted = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  assert float(task.loss(promoted, jax.random.key(0), BATCH)) == float(task.loss(params, jax.random.key(0), BATCH))


def test_loss_scale(mlp, mlp_params):
  key, batch = jax.random.key(1), next(mlp.datasets.train)
  task = aug.LossScale(mlp, 30.0)
  value_and_grad = lambda t: jax.jit(jax.value_and_grad(t.loss))(mlp_params, key, batch)
  (loss, grad), (ref, ref_grad) = value_and_grad(task), value_and_grad(mlp)
  assert float(loss) == pytest.approx(30.0 * float(ref), rel=1e-6)
  _close(grad, jax.tree.map(lambda g: 30.0 * g, ref_grad), rtol=1e-5, atol=1e-6)
  # The normalizer undoes the scale: normalized losses are comparable with the unscaled task's.
  assert float(task.normalizer(loss)) == pytest.approx(float(mlp.normalizer(ref)), rel=1e-6)
  with pytest.raises(ValueError, match="nonzero"):
    aug.LossScale(mlp, 0.0)


def test_noisy_gradients_mean_and_std():
  dim, std, n = 4, 0.3, 4000
  target = jnp.arange(dim, dtype=jnp.float32)
  base = QuadraticTask(dim, scale=2.0, target=target)
  task = aug.NoisyGradients(base, std)
  x = jnp.ones(dim)
  keys = jax.random.split(jax.random.key(0), n)
  losses, grads = jax.jit(jax.vmap(jax.value_and_grad(task.loss), in_axes=(None, 0, None)))(x, keys, None)
  np.testing.assert_allclose(losses, base.loss(x, keys[0], None), rtol=1e-6)  # values unchanged
  true_grad = np.asarray(2.0 * (x - target))
  noise = np.asarray(grads, np.float64) - true_grad
  # Mean of n i.i.d. N(0, std^2): standard error std / sqrt(n) = 0.0047; allow 5 standard errors.
  np.testing.assert_allclose(noise.mean(0), 0.0, atol=5 * std / np.sqrt(n))
  # Sample std: relative standard error 1 / sqrt(2 n) = 1.1%; allow 5%.
  np.testing.assert_allclose(noise.std(0), std, rtol=0.05)
  # Coordinates are independent (|corr| ~ 1 / sqrt(n) = 0.016).
  corr = np.corrcoef(noise.T)[np.triu_indices(dim, 1)]
  assert np.all(np.abs(corr) < 0.1)
  # Same key, same noise; zero noise gives the exact gradient.
  np.testing.assert_array_equal(jax.grad(task.loss)(x, keys[3], None), grads[3])
  np.testing.assert_allclose(jax.grad(aug.NoisyGradients(base, 0.0).loss)(x, keys[0], None), true_grad, rtol=1e-6)


def test_noisy_gradients_are_differentiable_for_meta_gradients():
  base = QuadraticTask(3)
  task = aug.NoisyGradients(base, 0.5)
  x, k1, k2 = jnp.asarray([1.0, -2.0, 0.5]), jax.random.key(1), jax.random.key(2)

  def meta_loss(lr):
    return task.loss(x - lr * jax.grad(task.loss)(x, k1, None), k2, None)

  lr = 0.1
  g = jax.grad(task.loss)(x, k1, None)  # x + noise_1; the noise does not depend on lr
  # The meta-loss's own backward pass goes through the hook too, so it sees grad(x') + noise_2 at x' = x - lr g:
  # d/dlr loss(x - lr g) = -(x' + noise_2) . g.
  g_outer = jax.grad(task.loss)(x - lr * g, k2, None)
  assert float(jax.grad(meta_loss)(lr)) == pytest.approx(float(-jnp.dot(g_outer, g)), rel=1e-5)
  # The unwrapped task gives the exact derivative of the loss value, -(x') . g.
  exact = jax.grad(lambda lr: base.loss(x - lr * jax.grad(task.loss)(x, k1, None), k2, None))(lr)
  assert float(exact) == pytest.approx(float(-jnp.dot(x - lr * g, g)), rel=1e-5)


def test_clip_gradients():
  base = QuadraticTask(3)
  x = jnp.asarray([3.0, 4.0, 0.0])  # grad = x, norm 5
  np.testing.assert_allclose(jax.grad(aug.ClipGradients(base, 1.0).loss)(x, jax.random.key(0), None),
                             [0.6, 0.8, 0.0], rtol=1e-6)
  np.testing.assert_allclose(jax.grad(aug.ClipGradients(base, 10.0).loss)(x, jax.random.key(0), None), x)
  with pytest.raises(ValueError, match="positive"):
    aug.ClipGradients(base, 0.0)


# -- families (every registered augmentation: the conformance table, tests/test_conformance.py) -------------------
def test_per_leaf_reparam_meets_the_augmentation_contract():
  family = faug.ReparamFamily(NoisyQuadraticFamily(4, batch_size=8), (-1.0, 1.0), per_leaf=True)
  check_augmented_family(family, {"log_scale"})


def test_family_wrappers_compute_the_wrapped_tasks():
  quad = QuadraticFamily(4, scale_range=(0.5, 2.0))
  scaled, reparam = faug.LossScaleFamily(quad, (-2.0, 2.0)), faug.ReparamFamily(quad, (-1.0, 1.0))
  x = jnp.linspace(-1.0, 1.0, 4)

  @jax.jit
  @jax.vmap
  def run(k):
    value_and_grad = lambda family, at: jax.value_and_grad(family.task_fn(family.sample(k)).loss)(at, k, None)
    loss_scale = jnp.exp(scaled.sample(k)["log_loss_scale"])
    reparam_scale = jnp.exp(reparam.sample(k)["log_scale"])
    return dict(base=value_and_grad(quad, x), scaled=value_and_grad(scaled, x), loss_scale=loss_scale,
                reparam=value_and_grad(reparam, x), at_p=value_and_grad(quad, reparam_scale * x),
                reparam_scale=reparam_scale)

  out = run(jax.random.split(jax.random.key(0), 6))
  (base_loss, base_grad), c = out["base"], out["loss_scale"]
  assert float(jnp.std(c)) > 0  # sampled per instance
  np.testing.assert_allclose(out["scaled"][0], c * base_loss, rtol=1e-5)
  np.testing.assert_allclose(out["scaled"][1], c[:, None] * base_grad, rtol=1e-5)
  # Reparam at q = x is the base task at p = s * x, with gradient s * grad_p.
  s, (p_loss, p_grad) = out["reparam_scale"], out["at_p"]
  np.testing.assert_allclose(out["reparam"][0], p_loss, rtol=1e-5)
  np.testing.assert_allclose(out["reparam"][1], s[:, None] * p_grad, rtol=1e-5)


def test_family_wrapper_validation():
  quad = QuadraticFamily(3)
  with pytest.raises(TypeError, match="wraps a TaskFamily"):
    faug.LossScaleFamily(QuadraticTask(3))
  with pytest.raises(ValueError, match="low <= high"):
    faug.ReparamFamily(quad, (1.0, -1.0))
  with pytest.raises(ValueError, match="0 <= low"):
    faug.NoisyGradientsFamily(quad, (-0.1, 0.1))
  with pytest.raises(ValueError, match="exceeds"):
    faug.ReducedBatchSizeFamily(NoisyQuadraticFamily(3, batch_size=4), 5)
