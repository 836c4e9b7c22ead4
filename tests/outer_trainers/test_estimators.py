"""Outer-gradient estimators checked against known answers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from influence import OPTIMUM, InfluenceDynamics, influence_family
from metafam.inner import ConstantSchedule, NeverEndingSchedule
from metafam.optimizers.base import Optimizer, OptimizerState
from metafam.outer_trainers import make_estimator
from metafam.inner.pairs import antithetic_thetas
from metafam.outer_trainers.base import sample_perturbations
from metafam.taskfamilies.base import single_task_to_family
from metafam.tasks.base import Task

# -- a quadratic with per-coordinate curvature, trained by per-coordinate SGD with theta = log learning rates ----
CURV = jnp.asarray([0.5, 1.0, 2.0, 4.0], jnp.float32)
X0 = jnp.asarray([1.0, -1.0, 0.5, 2.0], jnp.float32)


class FixedQuadratic(Task):
  def init(self, key):
    return X0

  def loss(self, params, key, batch):
    return 0.5 * jnp.sum(CURV * params ** 2)


class _PerCoordSGD(Optimizer):
  def __init__(self, theta):
    self.lr = jnp.exp(theta["log_lr"])

  def init(self, params, model_state=None, num_steps=None, key=None):
    return OptimizerState(params, model_state, jnp.asarray(0, jnp.int32), ())

  def update(self, state, grad, loss=None, model_state=None, key=None):
    return OptimizerState(state.params - self.lr * grad, state.state, state.iteration + 1, ())


class PerCoordSGD:
  def init(self, key):
    return {"log_lr": jnp.log(jnp.asarray([0.2, 0.1, 0.3, 0.05], jnp.float32))}

  def opt_fn(self, theta, is_training=False):
    return _PerCoordSGD(theta)


def true_meta_loss(theta, steps):
  """The meta-objective written out by hand: mean over steps of the loss after each update."""
  x, total = X0, 0.0
  for _ in range(steps):
    x = x - jnp.exp(theta["log_lr"]) * CURV * x
    total += 0.5 * jnp.sum(CURV * x ** 2)
  return total / steps


def cosine(a, b):
  a, b = np.ravel(a), np.ravel(b)
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


COMMON = dict(loss_kind="meta_loss", meta_loss_split="same_batch")


def test_full_es_matches_the_true_gradient():
  lopt, fam = PerCoordSGD(), single_task_to_family(FixedQuadratic())
  theta = lopt.init(None)
  true = jax.grad(true_meta_loss)(theta, 10)["log_lr"]
  est = make_estimator("full_es", fam, lopt, num_tasks=2000, trajectory_length=10, sigma=0.01, loss_type="avg",
                       **COMMON)
  e, _ = est.estimate(theta, est.init_worker_state(theta, None), jax.random.key(0))
  assert cosine(e.grad["log_lr"], true) > 0.99
  # Unbiased: the mean magnitude matches too (relative error ~ 1/sqrt(2000 * 4) per coordinate -> 10%).
  assert np.linalg.norm(e.grad["log_lr"]) == pytest.approx(np.linalg.norm(true), rel=0.1)
  assert float(e.meta_loss) == pytest.approx(float(true_meta_loss(theta, 10)), rel=1e-3)
  # "last" and "min" loss types estimate their own objectives.
  last = jax.grad(lambda t: _last_loss(t, 10))(theta)["log_lr"]
  est = make_estimator("full_es", fam, lopt, num_tasks=2000, trajectory_length=10, sigma=0.01, loss_type="last",
                       **COMMON)
  e, _ = est.estimate(theta, {}, jax.random.key(1))
  assert cosine(e.grad["log_lr"], last) > 0.99


def test_full_es_tail_estimates_the_gradient_of_the_mean_over_the_last_steps():
  """``loss_type="tail"``: the objective is the mean loss over the last ``round(tail_fraction * T)`` steps (3 of 10
  here), whose exact gradient through the unroll is written out by hand; the estimate matches it in direction and
  size (relative error ~ 1/sqrt(2000 * 4) per coordinate), and not the "avg" objective's gradient as closely."""
  lopt, fam = PerCoordSGD(), single_task_to_family(FixedQuadratic())
  theta = lopt.init(None)

  def tail_loss(theta, steps, tail):
    x, losses = X0, []
    for _ in range(steps):
      x = x - jnp.exp(theta["log_lr"]) * CURV * x
      losses.append(0.5 * jnp.sum(CURV * x ** 2))
    return sum(losses[-tail:]) / tail

  true = jax.grad(tail_loss)(theta, 10, 3)["log_lr"]
  est = make_estimator("full_es", fam, lopt, num_tasks=2000, trajectory_length=10, sigma=0.01, loss_type="tail",
                       tail_fraction=0.3, **COMMON)
  assert est.tail_steps == 3
  e, _ = est.estimate(theta, {}, jax.random.key(2))
  assert cosine(e.grad["log_lr"], true) > 0.99
  assert np.linalg.norm(e.grad["log_lr"]) == pytest.approx(np.linalg.norm(true), rel=0.1)
  assert float(e.meta_loss) == pytest.approx(float(tail_loss(theta, 10, 3)), rel=1e-3)
  avg = jax.grad(true_meta_loss)(theta, 10)["log_lr"]
  assert cosine(e.grad["log_lr"], true) > cosine(e.grad["log_lr"], avg)
  # at least one step, and the fraction must be in (0, 1]
  assert make_estimator("full_es", fam, lopt, trajectory_length=10, loss_type="tail", tail_fraction=0.01).tail_steps == 1
  for bad in (0.0, 1.5, float("nan")):
    with pytest.raises(ValueError, match="tail_fraction must be"):
      make_estimator("full_es", fam, lopt, loss_type="tail", tail_fraction=bad)


def _last_loss(theta, steps):
  x = X0
  for _ in range(steps):
    x = x - jnp.exp(theta["log_lr"]) * CURV * x
  return 0.5 * jnp.sum(CURV * x ** 2)


def test_truncated_es_and_tbptt_match_the_gradient_of_a_first_truncation():
  lopt, fam = PerCoordSGD(), single_task_to_family(FixedQuadratic())
  theta = lopt.init(None)
  true = jax.grad(true_meta_loss)(theta, 6)["log_lr"]
  kw = dict(unroll_length=6, schedule=ConstantSchedule(100), random_initial_iteration=False, **COMMON)
  tes = make_estimator("truncated_es", fam, lopt, num_tasks=2000, sigma=0.01, **kw)
  e, _ = tes.estimate(theta, tes.init_worker_state(theta, jax.random.key(0)), jax.random.key(1))
  assert cosine(e.grad["log_lr"], true) > 0.99
  tbptt = make_estimator("tbptt", fam, lopt, num_tasks=2, **kw)
  e, _ = tbptt.estimate(theta, tbptt.init_worker_state(theta, jax.random.key(0)), jax.random.key(1))
  np.testing.assert_allclose(e.grad["log_lr"], true, rtol=1e-4)


def test_pes_equals_truncated_es_on_a_fresh_state():
  lopt, fam = PerCoordSGD(), single_task_to_family(FixedQuadratic())
  theta = lopt.init(None)
  kw = dict(num_tasks=16, unroll_length=4, schedule=ConstantSchedule(7), sigma=0.05, random_initial_iteration=True,
            **COMMON)
  pes, tes = make_estimator("pes", fam, lopt, **kw), make_estimator("truncated_es", fam, lopt, **kw)
  k_init, k_est = jax.random.key(3), jax.random.key(4)
  e_pes, _ = pes.estimate(theta, pes.init_worker_state(theta, k_init), k_est)
  e_tes, _ = tes.estimate(theta, tes.init_worker_state(theta, k_init), k_est)
  np.testing.assert_allclose(e_pes.grad["log_lr"], e_tes.grad["log_lr"], rtol=1e-5, atol=1e-6)
  assert float(e_pes.meta_loss) == pytest.approx(float(e_tes.meta_loss), rel=1e-6)


def _expected_pes_grad(pes, theta, ws, key):
  """PES written as an explicit per-step loop over the unroll's outputs (independent of the vectorized code)."""
  n, sigma = pes.num_tasks, pes.sigma
  k_eps, k_unroll = jax.random.split(key)
  fresh = sample_perturbations(theta, k_eps, n, sigma)["log_lr"]
  age, acc, old_eps = np.asarray(ws.age), np.asarray(ws.accumulator["log_lr"]), np.asarray(ws.eps["log_lr"])
  resample = (age == 0) | (age >= (pes.resample_every or 2 ** 30))
  eps = np.where(resample[:, None], np.asarray(fresh), old_eps)
  thetas = antithetic_thetas(theta, {"log_lr": jnp.asarray(eps)})
  _, out = pes.step.unroll_fn(thetas, ws.lanes, jax.random.split(k_unroll, pes.unroll_length),
                              theta_is_batched=True)
  loss, mask, new = (np.asarray(x) for x in (out.meta_loss, out.mask, out.is_new_trajectory))
  grad, pairs = np.zeros_like(eps[0]), 0
  for i in range(n):
    weight = acc[i] + eps[i] if resample[i] else acc[i]
    total, count = np.zeros_like(eps[0]), 0
    plus, minus = 2 * i, 2 * i + 1  # the pair's lanes (metafam.inner.pairs: interleaved)
    for t in range(pes.unroll_length):
      if new[t, plus]:
        weight = eps[i]  # from this step on the pair runs a new trajectory that only saw eps
      if mask[t, plus] and mask[t, minus]:
        total += weight * (loss[t, plus] - loss[t, minus])
        count += 1
    if count:
      grad += total / count
      pairs += 1
  return grad / (max(pairs, 1) * 2 * sigma ** 2)


@pytest.mark.parametrize("resample_every", [1, 3, None])
def test_pes_accumulator_and_crediting_across_resets(resample_every):
  lopt, fam = PerCoordSGD(), single_task_to_family(FixedQuadratic())
  theta = lopt.init(None)
  L, K, n = 5, 3, 4  # trajectories of 5 steps, truncations of 3: resets land inside truncations
  pes = make_estimator("pes", fam, lopt, num_tasks=n, unroll_length=K, schedule=ConstantSchedule(L), sigma=0.05,
                       resample_every=resample_every, random_initial_iteration=False, **COMMON)
  ws = pes.init_worker_state(theta, jax.random.key(0))
  eps_history, starts = [], []
  for j in range(8):
    key = jax.random.fold_in(jax.random.key(1), j)
    expected = _expected_pes_grad(pes, theta, ws, key)
    e, ws = pes.estimate(theta, ws, key)
    np.testing.assert_allclose(e.grad["log_lr"], expected, rtol=2e-4, atol=1e-6)
    eps_history.append(np.asarray(ws.eps["log_lr"]))
    # The trajectory running at the end of truncation j began at global step L * floor((3j + 2) / L), i.e. in
    # truncation k0; the accumulator must hold the sum of the distinct perturbations of truncations k0..j.
    k0 = (L * ((K * j + K - 1) // L)) // K
    distinct = []
    for k in range(k0, j + 1):
      if not distinct or not np.array_equal(eps_history[k], distinct[-1]):
        distinct.append(eps_history[k])
    np.testing.assert_allclose(np.asarray(ws.accumulator["log_lr"]), np.sum(distinct, axis=0), rtol=1e-6)
    starts.append(k0)
  assert len(set(starts)) >= 3  # several resets were crossed
  if resample_every is None:  # noise reuse: one eps per trajectory, so at most 2 distinct within one
    assert len(distinct) <= 2


def test_stacked_and_separate_antithetic_evaluation_agree():
  lopt, fam = PerCoordSGD(), single_task_to_family(FixedQuadratic())
  theta = lopt.init(None)
  results = []
  for stack in (True, False):
    pes = make_estimator("pes", fam, lopt, num_tasks=8, unroll_length=4, schedule=ConstantSchedule(6), sigma=0.05,
                         stack_antithetic=stack, **COMMON)
    ws = pes.init_worker_state(theta, jax.random.key(0))
    grads = []
    for j in range(3):
      e, ws = pes.estimate(theta, ws, jax.random.key(j))
      grads.append(e.grad["log_lr"])
    results.append(np.stack(grads))
  np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-7)


def _ib_run(est, lopt, steps, lr):
  theta = lopt.init(None)
  ws = est.init_worker_state(theta, jax.random.key(0))

  @jax.jit
  def run(theta, ws, key):
    def body(carry, k):
      th, ws = carry
      e, ws = est.estimate_fn(th, ws, k)
      th = jax.tree.map(lambda t, g: t - lr * g, th, e.grad)
      return (th, ws), th["theta"]
    return jax.lax.scan(body, (theta, ws), jax.random.split(key, steps))

  return np.asarray(run(theta, ws, jax.random.key(1))[1])


IB = dict(unroll_length=1, schedule=NeverEndingSchedule(), loss_kind="meta_loss", meta_loss_split="same_batch",
          random_initial_iteration=False)


def test_influence_balancing_tbptt_has_the_wrong_sign():
  lopt = InfluenceDynamics(0.5)
  traj = _ib_run(make_estimator("tbptt", influence_family(), lopt, num_tasks=1, **IB), lopt, 500, 1e-4)
  # K = 1 TBPTT sees only the direct effect (+1 per unit theta): once the state has left s0 = ones (a transient of
  # a few dozen steps), theta moves *up*, away from the optimum -1/6, at every step.
  assert np.all(np.diff(traj[100:]) > 0)
  assert traj[-1] > traj[0] + 0.1


def test_influence_balancing_pes_finds_the_optimum():
  lopt = InfluenceDynamics(0.5)
  pes = make_estimator("pes", influence_family(), lopt, num_tasks=500, sigma=0.1, **IB)  # 1000 particles, as in PES
  traj = _ib_run(pes, lopt, 3000, 1e-4)
  assert abs(traj[-500:].mean() - OPTIMUM) < 0.01
  assert abs(traj[-1] - OPTIMUM) < 0.02


def test_non_finite_pairs_are_masked_and_counted():
  lopt, fam = PerCoordSGD(), single_task_to_family(FixedQuadratic())
  theta = {"log_lr": jnp.log(jnp.asarray([0.2, 0.1, 0.3, 0.4999], jnp.float32))}  # curvature 4: lr > 0.5 diverges
  est = make_estimator("full_es", fam, lopt, num_tasks=64, trajectory_length=200, sigma=0.3, **COMMON)
  e, _ = est.estimate(theta, {}, jax.random.key(0))
  assert np.all(np.isfinite(e.grad["log_lr"])) and np.isfinite(float(e.meta_loss))
  assert 0 < float(e.metrics["num_nonfinite"]) < 64


def test_bad_arguments():
  lopt, fam = PerCoordSGD(), single_task_to_family(FixedQuadratic())
  with pytest.raises(ValueError, match="sigma must be a positive number"):
    make_estimator("pes", fam, lopt, sigma=0.0)
  with pytest.raises(ValueError, match="loss_type must be one of"):
    make_estimator("full_es", fam, lopt, loss_type="mean")
  with pytest.raises(ValueError, match="loss_kind must be one of"):
    make_estimator("pes", fam, lopt, loss_kind="accuracy")
  with pytest.raises(ValueError, match="resample_every"):
    make_estimator("pes", fam, lopt, resample_every=0)
  with pytest.raises(TypeError, match="resample_every"):  # NRES fixes it (None)
    make_estimator("nres", fam, lopt, resample_every=2)


def test_the_es_estimators_take_the_shared_arguments_declared_once():
  """The ES arguments are declared once (`estimators._AntitheticES`); each estimator's signature lists its own
  arguments (the length positionally, the rest by keyword) and then those, with the same defaults."""
  import inspect
  from metafam.outer_trainers import estimators, pes
  shared = {"sigma": 0.01, "loss_kind": "normalized_meta_loss", "clip_loss_diff": None, "stack_antithetic": True,
            "perturbation": "full", "rank": 1}
  own = {estimators.FullES: {"trajectory_length": 200, "loss_type": "avg", "tail_fraction": 0.1},
         estimators.TruncatedES: {"unroll_length": 20}, pes.PES: {"unroll_length": 20, "resample_every": 1},
         pes.NoiseReuseES: {"unroll_length": 20}}
  for cls, arguments in own.items():
    params = list(inspect.signature(cls).parameters.values())[1:]
    assert {p.name: p.default for p in params} == {**arguments, **shared}, cls
    assert [p.kind for p in params][1:] == [inspect.Parameter.KEYWORD_ONLY] * (len(params) - 1), cls
  lopt, fam = PerCoordSGD(), single_task_to_family(FixedQuadratic())
  est = make_estimator("nres", fam, lopt, num_tasks=2, unroll_length=3, sigma=0.2, clip_loss_diff=1.0,
                       perturbation="low_rank", rank=2, stack_antithetic=False)
  assert (est.resample_every, est.num_tasks, est.unroll_length, est.sigma, est.clip_loss_diff, est.rank) == (
      None, 2, 3, 0.2, 1.0, 2)
  with pytest.raises(TypeError):
    make_estimator("pes", fam, lopt, sigmaa=0.1)
