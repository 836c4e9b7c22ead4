"""Vectorized truncated inner training: the reset timeline, fused unrolls, per-lane theta, non-finite isolation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.inner import ConstantSchedule, LogUniformSchedule, NeverEndingSchedule, TruncatedStep
from metafam.optimizers.base import SGD, OptaxOptimizer
from metafam.taskfamilies.base import TaskFamily
from metafam.taskfamilies.quadratic import QuadraticFamily
from metafam.tasks.base import Task
import optax


class _LogLRSGD:
  """A minimal learned optimizer: theta = {"log_lr"}; SGD with lr = exp(log_lr)."""

  def init(self, key):
    return {"log_lr": jnp.log(jnp.asarray(0.1, jnp.float32))}

  def opt_fn(self, theta, is_training=False):
    return OptaxOptimizer(optax.sgd(jnp.exp(theta["log_lr"])))


def _copy(tree):
  return jax.tree.map(jnp.array, tree)


def test_constant_schedule_timeline_with_staggered_offsets():
  L, n, steps = 4, 5, 14
  ts = TruncatedStep(QuadraticFamily(3), SGD(0.1), n, ConstantSchedule(L), random_initial_iteration=True)
  state = ts.init_step_state({}, jax.random.key(0))
  offsets = np.asarray(state.iteration)
  assert np.all((offsets >= 0) & (offsets < L)) and len(set(offsets.tolist())) > 1  # staggered
  first_cfg = np.asarray(state.cfg["target"])
  state, out = ts.unroll({}, state, jax.random.key(1), steps)
  it, new, done = np.asarray(out.iteration), np.asarray(out.is_new_trajectory), np.asarray(out.is_done)
  for lane in range(n):
    expected = (offsets[lane] + np.arange(steps)) % L
    np.testing.assert_array_equal(it[:, lane], expected)
    np.testing.assert_array_equal(new[:, lane], expected == 0)
    np.testing.assert_array_equal(done[:, lane], expected == L - 1)
    # is_new follows is_done exactly one step later: the reset happens at the end of the done step.
    np.testing.assert_array_equal(new[1:, lane], done[:-1, lane])
  assert np.all(np.asarray(out.mask) == 1.0)
  # Every lane reset at least twice in 14 steps; its config was re-sampled.
  assert not np.any(np.all(np.isclose(np.asarray(state.cfg["target"]), first_cfg), axis=-1))
  np.testing.assert_array_equal(np.asarray(state.iteration), (offsets + steps) % L)


def test_losses_belong_to_their_trajectory():
  # SGD with lr 0.5 on 0.5 * ||x - t||^2 halves the error each step, so within a trajectory loss_{t+1} = loss_t / 4;
  # a new trajectory starts from fresh params (a jump up), and meta_loss (after the update) = next step's loss.
  ts = TruncatedStep(QuadraticFamily(3), SGD(0.5), 2, ConstantSchedule(3), meta_loss_split="same_batch")
  state = ts.init_step_state({}, jax.random.key(0))
  _, out = ts.unroll({}, state, jax.random.key(1), 9)
  loss, meta, new = map(np.asarray, (out.loss, out.meta_loss, out.is_new_trajectory))
  np.testing.assert_allclose(meta, loss / 4, rtol=1e-5)
  for t in range(1, 9):
    for lane in range(2):
      if not new[t, lane]:
        np.testing.assert_allclose(loss[t, lane], meta[t - 1, lane], rtol=1e-5)


def _check_one_call_equals_calls(ts, state0, keys, num_calls):
  """One `unroll_with_keys` over ``keys`` equals ``num_calls`` consecutive calls over parts of them; returns the
  single call's outputs."""
  fused_state, fused = ts.unroll_with_keys({}, _copy(state0), keys)
  state, outs = state0, []
  for part in np.array_split(np.arange(len(keys)), num_calls):
    state, out = ts.unroll_with_keys({}, state, keys[part[0]:part[-1] + 1])
    outs.append(out)
  parts = jax.tree.map(lambda *xs: jnp.concatenate(xs), *outs)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), fused, parts)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), fused_state, state)
  return fused


def test_k_steps_in_one_call_equal_k_calls_of_one_step():
  ts = TruncatedStep(QuadraticFamily(3, scale_range=(0.5, 2.0)), SGD(0.3), 4, ConstantSchedule(3),
                     random_initial_iteration=True, donate=False)
  _check_one_call_equals_calls(ts, ts.init_step_state({}, jax.random.key(0)), jax.random.split(jax.random.key(1), 7),
                               7)


def test_draws_made_before_the_loop_match_a_call_per_step_with_data_and_a_meta_split():
  """The unroll draws its steps' batch indices before its loop, in blocks of DRAW_BLOCK steps; with a dataset, a
  separate meta-loss split and resets, one 7-step call equals 7 one-step calls with the same keys, and one call of
  2 blocks + 7 steps equals 5 calls short enough to draw all at once."""
  from metafam.inner.step import DRAW_BLOCK
  from metafam.optimizers.base import Adam
  from metafam.taskfamilies.image_mlp import ImageMLPFamily
  family = ImageMLPFamily((4,), image_size=8, batch_size=8)
  ts = TruncatedStep(family, Adam(1e-2), 4, ConstantSchedule(3), meta_loss_split="outer_valid",
                     random_initial_iteration=True, donate=False)
  state0 = ts.init_step_state({}, jax.random.key(0))
  fused = _check_one_call_equals_calls(ts, state0, jax.random.split(jax.random.key(1), 7), 7)
  assert np.asarray(fused.is_new_trajectory).any()  # resets happened inside the call
  _check_one_call_equals_calls(ts, state0, jax.random.split(jax.random.key(2), 2 * DRAW_BLOCK + 7), 5)


@pytest.mark.parametrize("num_steps", [0, 7, 50, 107])
def test_scan_with_draws_equals_drawing_inside_the_loop(num_steps):
  """`scan_with_draws` (draws made before the loop, 50 steps at a time) gives the same carry and outputs as a scan
  that draws inside its body, for lengths below, at and above a block."""
  from metafam.inner.step import scan_with_draws
  keys = jax.random.split(jax.random.key(7), num_steps)
  draw = lambda k: jax.random.normal(k, (3,))

  def body(c, d):
    return 0.9 * c + d, jnp.sum(c * d)

  expected = jax.lax.scan(lambda c, k: body(c, draw(k)), jnp.zeros(3), keys)
  got = scan_with_draws(lambda c, kd: body(c, kd[1]), jnp.zeros(3), keys, draw)
  jax.tree.map(np.testing.assert_array_equal, got, expected)


def test_per_lane_theta_equals_shared_theta():
  lopt = _LogLRSGD()
  ts = TruncatedStep(QuadraticFamily(3), lopt, 3, ConstantSchedule(4), donate=False)
  theta = {"log_lr": jnp.log(jnp.asarray(0.2, jnp.float32))}
  batched = jax.tree.map(lambda x: jnp.broadcast_to(x, (3,) + x.shape), theta)
  s_shared = ts.init_step_state(theta, jax.random.key(0))
  s_batched = ts.init_step_state(batched, jax.random.key(0), theta_is_batched=True)
  a_state, a = ts.unroll(theta, s_shared, jax.random.key(1), 6)
  b_state, b = ts.unroll(batched, s_batched, jax.random.key(1), 6, theta_is_batched=True)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a, b)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a_state, b_state)
  # ...and different per-lane values really act per lane: lane 0 with lr 0 never changes its loss.
  mixed = {"log_lr": jnp.log(jnp.asarray([1e-30, 0.2, 0.2], jnp.float32))}
  _, c = ts.unroll(mixed, ts.init_step_state(mixed, jax.random.key(0), theta_is_batched=True), jax.random.key(1), 3,
                   theta_is_batched=True)
  np.testing.assert_allclose(c.loss[:, 0], c.loss[0, 0], rtol=1e-6)
  np.testing.assert_allclose(c.loss[:, 1:], a.loss[:3, 1:], rtol=1e-6)


class _Poisonable(TaskFamily):
  """Quadratic instances; those whose config says `bad` produce a NaN loss (unless `ignore_bad`)."""

  def __init__(self, ignore_bad):
    super().__init__()
    self.ignore_bad = ignore_bad

  def sample(self, key):
    k1, k2 = jax.random.split(key)
    return {"bad": jax.random.bernoulli(k1, 0.4), "target": jax.random.normal(k2, (3,))}

  def task_fn(self, cfg):
    family = self

    class T(Task):
      def init(self, key):
        return jax.random.normal(key, (3,))

      def loss(self, params, key, batch):
        loss = 0.5 * jnp.sum((params - cfg["target"]) ** 2)
        return loss if family.ignore_bad else jnp.where(cfg["bad"], jnp.nan, loss)
    return T()


def test_nan_lane_is_isolated_and_reset():
  n, steps = 8, 6
  runs = {}
  for ignore in (True, False):
    ts = TruncatedStep(_Poisonable(ignore), SGD(0.1), n, ConstantSchedule(100))
    state = ts.init_step_state({}, jax.random.key(0))
    runs[ignore] = ts.unroll({}, state, jax.random.key(1), steps)
  (clean_state, clean), (state, out) = runs[True], runs[False]
  mask, done = np.asarray(out.mask), np.asarray(out.is_done)
  bad_lanes = np.where(mask[0] == 0)[0]
  good_lanes = np.where(mask[0] == 1)[0]
  assert len(bad_lanes) >= 1 and len(good_lanes) >= 1, "the test needs both kinds of lanes"
  assert np.all(np.isfinite(np.asarray(out.loss))) and np.all(np.asarray(out.loss)[mask == 0] == 0)
  assert np.all(done[0, bad_lanes]) and np.all(np.asarray(out.is_new_trajectory)[1, bad_lanes])
  # Lanes that never went bad are bit-for-bit the lanes of the run where nothing is ever NaN.
  never_bad = [i for i in range(n) if mask[:, i].all()]
  assert never_bad
  for field in ("loss", "meta_loss", "iteration", "is_done"):
    np.testing.assert_array_equal(np.asarray(getattr(out, field))[:, never_bad],
                                  np.asarray(getattr(clean, field))[:, never_bad])
  np.testing.assert_array_equal(np.asarray(state.opt_state.params)[never_bad],
                                np.asarray(clean_state.opt_state.params)[never_bad])
  # Each bad step ends its trajectory; all params stay finite.
  np.testing.assert_array_equal(done[mask == 0], True)
  assert np.all(np.isfinite(np.asarray(state.opt_state.params)))


def test_schedules():
  keys = jax.random.split(jax.random.key(0), 2000)
  lengths = np.asarray(jax.vmap(LogUniformSchedule(10, 1000).sample)(keys))
  assert lengths.min() >= 10 and lengths.max() <= 1000
  # log-uniform: about a third of the mass in each decade-ish third of [log 10, log 1000].
  assert abs(np.mean(lengths < 100) - 0.5) < 0.05
  assert int(NeverEndingSchedule().sample(keys[0])) == 2 ** 31 - 1
  assert int(ConstantSchedule(7).sample(keys[0])) == 7
  with pytest.raises(ValueError, match="positive int"):
    ConstantSchedule(0)
  with pytest.raises(ValueError, match="low <= high"):
    LogUniformSchedule(10, 5)


def test_never_ending_schedule_does_not_reset_and_bad_arguments():
  ts = TruncatedStep(QuadraticFamily(3), SGD(0.1), 2, NeverEndingSchedule(), random_initial_iteration=True)
  state = ts.init_step_state({}, jax.random.key(0))
  state, out = ts.unroll({}, state, jax.random.key(1), 20)
  assert not np.any(np.asarray(out.is_done))
  with pytest.raises(TypeError, match="TaskFamily"):
    TruncatedStep("quadratic", SGD(0.1), 2)
  with pytest.raises(ValueError, match="num_tasks"):
    TruncatedStep(QuadraticFamily(3), SGD(0.1), 0)
  with pytest.raises(ValueError, match="meta_loss_split"):
    TruncatedStep(QuadraticFamily(3), SGD(0.1), 2, meta_loss_split="valid")
  with pytest.raises(ValueError, match="num_steps"):
    ts.unroll({}, state, jax.random.key(1), 0)


def test_select_reset_equals_cond_reset_in_values_and_meta_gradient():
  """`reset="select"` (fresh lanes computed every step, chosen per lane; the accelerator default) and `"cond"` (fresh
  lanes computed only in steps where a lane finishes; the CPU default) compute the same numbers: the same selects
  run in both, only gated differently. Staggered lanes, trajectories of 3-6 steps (several resets in 9 steps), lanes
  that go non-finite, and the TBPTT meta-gradient through the unroll: bit-identical, since both programs do the same
  floating-point operations on the same values."""
  n = 8
  results = {}
  for reset in ("cond", "select"):
    ts = TruncatedStep(_Poisonable(False), _LogLRSGD(), n, LogUniformSchedule(3, 6), random_initial_iteration=True,
                       donate=False, reset=reset)
    assert ts.reset == reset
    theta = _LogLRSGD().init(None)
    state = ts.init_step_state(theta, jax.random.key(0))
    keys = jax.random.split(jax.random.key(1), 9)

    def mean_loss(theta):
      lanes, out = ts.unroll_fn(theta, state, keys)
      return jnp.sum(out.loss * out.mask) / jnp.maximum(jnp.sum(out.mask), 1.0), (lanes, out)

    results[reset] = jax.jit(jax.value_and_grad(mean_loss, has_aux=True))(theta)
  (_, (_, out)), _ = results["select"]
  assert 0 < np.asarray(out.mask).mean() < 1 and np.asarray(out.is_new_trajectory)[1:].sum() >= n
  for a, b in zip(jax.tree.leaves(results["cond"]), jax.tree.leaves(results["select"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert np.isfinite(float(results["select"][1]["log_lr"])) and float(results["select"][1]["log_lr"]) != 0.0


def test_reset_strategy_auto_and_bad_values():
  family = QuadraticFamily(3)
  assert TruncatedStep(family, SGD(0.1), 2).reset == ("cond" if jax.default_backend() == "cpu" else "select")
  assert TruncatedStep(family, SGD(0.1), 2, devices=jax.devices("cpu")[:1]).reset == "cond"
  for bad in ("never", None, True):
    with pytest.raises(ValueError, match="reset must be one of"):
      TruncatedStep(family, SGD(0.1), 2, reset=bad)
