"""Lane sharding: `TruncatedStep(devices=...)` spreads lanes over devices and changes no number."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding

from meta_setup import build_trainer, quadratic_family
from metafam.inner import ConstantSchedule, LogUniformSchedule, TruncatedStep
from metafam.inner.sharding import lane_mesh
from metafam.optimizers.base import Adam
from metafam.optimizers.learned import LearnableSGD
from metafam.outer_trainers import MetaTrainer, make_estimator
from metafam.runs import train
from metafam.taskfamilies.quadratic import NoisyQuadraticFamily

pytestmark = pytest.mark.skipif(len(jax.devices()) < 2, reason="needs 2 devices (tests/conftest.py asks for 2 CPUs)")


def _run(family, opt, theta, devices, steps=(5, 5), theta_is_batched=False, **kw):
  ts = TruncatedStep(family, opt, 8, devices=devices, **kw)
  state = ts.init_step_state(theta, jax.random.key(1), theta_is_batched=theta_is_batched)
  outs = []
  for i, n in enumerate(steps):
    state, out = ts.unroll(theta, state, jax.random.key(10 + i), n, theta_is_batched=theta_is_batched)
    outs.append(out)
  return state, outs


def _assert_same(a, b):
  # Each lane runs the same per-lane program on either placement; allow only float reassociation noise.
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64),
                                                       rtol=1e-6, atol=1e-7), a, b)


@pytest.mark.parametrize("kw", [
    dict(schedule=LogUniformSchedule(2, 9), random_initial_iteration=True),
    # Antithetic lanes on two devices: also in the sharded PES estimate below, so only in the slow suite here.
    pytest.param(dict(schedule=ConstantSchedule(3), antithetic=True, stack_antithetic=False), marks=pytest.mark.slow),
    dict(schedule=ConstantSchedule(3), lane_groups=4),
], ids=["staggered", "antithetic", "groups"])
def test_sharded_unroll_equals_single_device(kw):
  family = NoisyQuadraticFamily(4, scale_range=(0.5, 2.0))
  opt = Adam(0.05)
  single = _run(family, opt, {}, None, **kw)
  sharded = _run(family, opt, {}, 2, **kw)
  _assert_same(single, sharded)
  state, outs = sharded
  # The lanes really are split: every lane-major leaf and every [steps, lanes] output is sharded over 2 devices.
  for leaf in jax.tree.leaves(state) + jax.tree.leaves(outs):
    assert isinstance(leaf.sharding, NamedSharding) and len(leaf.sharding.device_set) == 2
    assert not leaf.sharding.is_fully_replicated
  # Resets happened inside the compared window, so the per-device reset logic was exercised.
  assert bool(jnp.any(outs[1].is_done))


def test_sharded_per_lane_theta():
  family = NoisyQuadraticFamily(3)
  lopt = LearnableSGD()
  # Per-lane theta: lane i gets its own learning rate, so lanes really differ.
  theta = {k: jnp.broadcast_to(v, (8,) + v.shape) for k, v in lopt.init(jax.random.key(0)).items()}
  theta["log_lr"] = theta["log_lr"] + jnp.linspace(-1.0, 1.0, 8).reshape((8,) + theta["log_lr"].shape[1:])
  single = _run(family, lopt, theta, None, theta_is_batched=True, schedule=ConstantSchedule(4))
  sharded = _run(family, lopt, theta, 2, theta_is_batched=True, schedule=ConstantSchedule(4))
  _assert_same(single, sharded)


def test_sharded_unroll_is_differentiable():
  """Backpropagating through the per-device program gives the single-device gradient (TBPTT uses this)."""
  family = NoisyQuadraticFamily(3)
  lopt = LearnableSGD()
  theta = lopt.init(jax.random.key(0))
  grads = []
  for devices in (None, 2):
    ts = TruncatedStep(family, lopt, 4, ConstantSchedule(3), donate=False, devices=devices)
    state = ts.init_step_state(theta, jax.random.key(1))
    keys = jax.random.split(jax.random.key(2), 5)

    def meta_loss(th):
      return jnp.mean(ts.unroll_fn(th, state, keys)[1].meta_loss)
    grads.append(jax.jit(jax.grad(meta_loss))(ts.place_theta(theta)))
  _assert_same(grads[0], grads[1])
  assert all(float(jnp.abs(g)) > 0 for g in jax.tree.leaves(grads[0]))


def test_bad_devices_are_rejected_before_any_work():
  family = NoisyQuadraticFamily(3)
  with pytest.raises(ValueError, match="num_tasks=5 lanes cannot be split evenly over 2 devices"):
    TruncatedStep(family, Adam(0.1), 5, devices=2)
  with pytest.raises(ValueError, match=r"devices=99, but \d+ cpu device\(s\) are available.*jax_num_cpu_devices"):
    TruncatedStep(family, Adam(0.1), 4, devices=99)
  with pytest.raises(TypeError, match="devices must be"):
    TruncatedStep(family, Adam(0.1), 4, devices=["cpu:0"])
  with pytest.raises(ValueError, match="lists a device twice"):
    TruncatedStep(family, Adam(0.1), 4, devices=[jax.devices()[0]] * 2)
  assert lane_mesh(1, 5) is None and lane_mesh(None, 5) is None  # one device: nothing to shard


# -- estimators and the meta-trainer on 2 devices ---------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda fam, lopt, dev: make_estimator("pes", fam, lopt, num_tasks=4, unroll_length=5,
                                          schedule=ConstantSchedule(7), devices=dev),
    # TruncatedES shards the same truncated antithetic unroll as PES: in the slow suite.
    pytest.param(lambda fam, lopt, dev: make_estimator("truncated_es", fam, lopt, num_tasks=4, unroll_length=5,
                                                       schedule=ConstantSchedule(7), devices=dev),
                 marks=pytest.mark.slow),
    lambda fam, lopt, dev: make_estimator("full_es", fam, lopt, num_tasks=4, trajectory_length=6, devices=dev),
], ids=["pes", "truncated_es", "full_es"])  # TBPTT: in the meta-trainer test below
def test_sharded_estimators_equal_single_device(make):
  family = NoisyQuadraticFamily(4, scale_range=(0.5, 2.0))
  lopt = LearnableSGD()
  theta = lopt.init(jax.random.key(0))
  runs = []
  for devices in (None, 2):
    est = make(family, lopt, devices)
    ws = est.init_worker_state(theta, jax.random.key(1))
    estimates = []
    for i in range(2):  # 10 steps of trajectories of 7: the PES accumulators restart inside the window
      estimate, ws = est.estimate(theta, ws, jax.random.key(5 + i))
      estimates.append(estimate)
    runs.append((estimates, ws))
  # Per-lane numbers are identical; only the reductions over lanes may be summed in another order across devices.
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6), *runs)
  assert all(float(jnp.abs(g)) > 0 for e in runs[1][0] for g in jax.tree.leaves(e.grad))
  for leaf in jax.tree.leaves(getattr(runs[1][1], "lanes", runs[1][1])):
    assert len(leaf.sharding.device_set) == 2 and not leaf.sharding.is_fully_replicated


def test_meta_trainer_on_two_devices_matches_one_and_resumes(tmp_path, caplog):
  # PES and TBPTT (whose gradient flows back through the per-device programs) averaged in one meta-step.
  single = build_trainer(num_tasks=4, with_tbptt=True)
  sharded = build_trainer(num_tasks=4, with_tbptt=True, devices=2)
  assert single.mesh is None and sharded.mesh is not None
  want, _ = train(single, 4, key=jax.random.key(3), progress=False)
  with jax.log_compiles():
    train(sharded, 2, key=jax.random.key(3), progress=False, output_dir=str(tmp_path), checkpoint_every=2)
    # The run resumes from its checkpoint, and the restored host arrays are placed on both devices again.
    resumed, history = train(sharded, 4, key=jax.random.key(3), progress=False, output_dir=str(tmp_path))
  # Every step's output is laid out like its input, so all 4 steps (resumed ones included) ran one compiled program
  # (the training loop's `step_fn` with its metrics packed, `MetaTrainer._step_and_pack`).
  assert sum("Compiling jit(_step_and_pack)" in r.getMessage() for r in caplog.records) == 1
  assert [h["step"] for h in history] == [3, 4]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6),
               want, resumed)
  for leaf in jax.tree.leaves(resumed.worker_states[0].lanes):
    assert len(leaf.sharding.device_set) == 2 and not leaf.sharding.is_fully_replicated
  assert resumed.theta["log_lr"].sharding.is_fully_replicated and len(resumed.theta["log_lr"].sharding.device_set) == 2


def test_meta_trainer_refuses_estimators_on_different_devices():
  family, lopt = quadratic_family(), LearnableSGD()
  ests = [make_estimator("pes", family, lopt, num_tasks=2, devices=2),
          make_estimator("tbptt", family, lopt, num_tasks=2)]
  with pytest.raises(ValueError, match=r"same devices.*estimators\[1\] \(TruncatedBPTT\): 1 device"):
    MetaTrainer(lopt, ests, optax.sgd(0.1))
