"""Task families: single_task_to_family, vmap-ability checks, vectorized training of a family. (`check_family` over
every registered family: the conformance table, tests/test_conformance.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.optimizers.base import Adam
from metafam.taskfamilies.base import TaskFamily, check_family, single_task_to_family
from metafam.taskfamilies.quadratic import NoisyQuadraticFamily, QuadraticFamily
from metafam.tasks.quadratic import QuadraticTask
from metafam.taskfamilies.registry import get_family


def test_single_task_to_family_returns_the_same_task():
  task = QuadraticTask(5)
  family = single_task_to_family(task)
  cfg = family.sample(jax.random.key(0))
  assert cfg.shape == () and cfg.dtype == jnp.int32
  assert family.task_fn(cfg) is task
  assert family.sample_task(jax.random.key(1)) is task
  check_family(family)
  with pytest.raises(TypeError, match="needs a Task"):
    single_task_to_family("not a task")


class _ShapeShifting(QuadraticFamily):
  """Broken on purpose: the config's 'target' length depends on the key."""

  def sample(self, key):
    cfg = super().sample(key)
    n = 3 + int(jax.random.randint(key, (), 0, 2))
    return dict(cfg, target=jnp.zeros((n,)))


class _DtypeShifting(QuadraticFamily):

  def __init__(self):
    super().__init__(3)
    self.calls = 0

  def sample(self, key):
    self.calls += 1
    cfg = super().sample(key)
    return dict(cfg, scale=cfg["scale"].astype(jnp.float32 if self.calls == 1 else jnp.float16))


def test_check_family_names_the_varying_leaf():
  with pytest.raises(ValueError, match=r"config leaf \['target'\] is float32\[\d\] in sample 0 but float32\[\d\]"):
    check_family(_ShapeShifting(3), jax.random.key(0), num_samples=8)
  with pytest.raises(ValueError, match=r"config leaf \['scale'\] is float32\[\] in sample 0 but float16\[\]"):
    check_family(_DtypeShifting())


def test_check_family_catches_varying_init():
  class VaryingInit(TaskFamily):
    def sample(self, key):
      return {"n": jax.random.randint(key, (), 0, 2)}

    def task_fn(self, cfg):

      class T(QuadraticTask):
        def init(self, key):
          return jnp.zeros((2 + int(cfg["n"]),))
      return T(2)

  with pytest.raises(ValueError, match="init .* leaf"):
    check_family(VaryingInit(), num_samples=8)


def test_quadratic_family_samples_within_ranges_and_loss_matches():
  family = QuadraticFamily(6, scale_range=(0.5, 4.0))
  cfgs = jax.vmap(family.sample)(jax.random.split(jax.random.key(0), 256))
  assert cfgs["target"].shape == (256, 6)
  assert float(cfgs["scale"].min()) >= 0.5 and float(cfgs["scale"].max()) <= 4.0
  # log-uniform: the median of log(scale) sits near the middle of [log 0.5, log 4].
  assert abs(float(jnp.median(jnp.log(cfgs["scale"]))) - np.log(np.sqrt(2.0))) < 0.25
  cfg = jax.tree.map(lambda x: x[0], cfgs)
  x = jnp.ones(6)
  expected = 0.5 * cfg["scale"] * jnp.sum((x - cfg["target"]) ** 2)
  assert float(family.task_fn(cfg).loss(x, None, None)) == pytest.approx(float(expected), rel=1e-6)


def test_noisy_quadratic_expected_loss_adds_noise_variance():
  family = NoisyQuadraticFamily(dim=8, noise_std=0.5, batch_size=512)
  cfg = family.sample(jax.random.key(0))
  task = family.task_fn(cfg)
  x = cfg["target"]  # at the optimum only the noise term remains: E = 0.5 * scale * dim * std^2
  losses = [float(task.loss(x, None, next(task.datasets.train))) for _ in range(20)]
  expected = 0.5 * float(cfg["scale"]) * 8 * 0.25
  # Each batch mean has relative std sqrt(2 / (dim * B)) ~ 1.8%; 20 batches -> ~0.4%; allow 3%.
  assert np.mean(losses) == pytest.approx(expected, rel=0.03)


def test_vmapped_family_of_32_trains_with_adam_and_mean_loss_decreases():
  family = get_family("fmnist_mlp_family_8x8_32")
  opt = Adam(3e-3)
  data = family.datasets.device_data("train")
  valid = family.datasets.device_data("inner_valid")
  n = 32

  def init(key):
    k1, k2 = jax.random.split(key)
    cfg = family.sample(k1)
    return cfg, opt.init(family.task_fn(cfg).init(k2))

  def valid_loss(cfg, state):
    return family.task_fn(cfg).loss(opt.get_params(state), jax.random.key(0), valid.sample(jax.random.key(7)))

  @jax.jit
  def train(cfgs, states, key):
    def step(states, key):
      def one(cfg, state, k):
        kb, kl = jax.random.split(k)
        loss, g = jax.value_and_grad(family.task_fn(cfg).loss)(opt.get_params(state), kl, data.sample(kb))
        return opt.update(state, g, loss=loss), loss
      return jax.vmap(one)(cfgs, states, jax.random.split(key, n))
    return jax.lax.scan(step, states, jax.random.split(key, 150))

  cfgs, states = jax.vmap(init)(jax.random.split(jax.random.key(0), n))
  before = jax.vmap(valid_loss)(cfgs, states)
  states, losses = train(cfgs, states, jax.random.key(1))
  after = jax.vmap(valid_loss)(cfgs, states)
  assert losses.shape == (150, n)
  assert np.all(np.isfinite(losses))
  # Chance level is log(10) = 2.30; 150 Adam steps on 8x8 Fashion-MNIST reach well below 1.2 on average.
  assert float(before.mean()) > 2.0
  assert float(after.mean()) < 1.2
  assert float(losses[-10:].mean()) < float(losses[:10].mean()) - 0.8
  assert int(jnp.sum(after < before)) == n  # every instance improved


def test_image_mlp_family_without_label_noise_sees_the_labels_a_zero_noise_draw_gives():
  """A family whose label_noise_range is (0, 0) skips the per-example draw; its loss equals the loss a noisy family
  computes for an instance whose label_noise is 0 (same params, batch and key)."""
  from metafam.taskfamilies.image_mlp import ImageMLPFamily
  clean, noisy = (ImageMLPFamily((4,), image_size=8, batch_size=16, label_noise_range=r)
                  for r in [(0.0, 0.0), (0.0, 0.5)])
  cfg = clean.sample(jax.random.key(0))
  params = clean.task_fn(cfg).init(jax.random.key(1))
  batch = clean.datasets.device_data("train").sample(jax.random.key(2))
  for key in jax.random.split(jax.random.key(3), 3):
    assert float(clean.task_fn(cfg).loss(params, key, batch)) == float(noisy.task_fn(cfg).loss(params, key, batch))
  flipped = dict(cfg, label_noise=jnp.asarray(0.5, jnp.float32))  # and the noisy path does flip labels
  losses = {float(noisy.task_fn(flipped).loss(params, k, batch)) for k in jax.random.split(jax.random.key(4), 3)}
  assert len(losses) > 1
