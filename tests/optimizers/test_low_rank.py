"""Low-rank ES perturbations (``perturbation="low_rank"``): the factored weights, the noise's covariance, the unroll
with shared weights plus per-lane factors, and the estimators against exact gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from influence import InfluenceDynamics, influence_family
from metafam.inner import ConstantSchedule, NeverEndingSchedule, pairs
from metafam.optimizers import low_rank
from metafam.optimizers.base import Optimizer, OptimizerState
from metafam.optimizers.mlp_lopt import MLPLOpt
from metafam.optimizers.registry import get_learned_optimizer
from metafam.outer_trainers import make_estimator
from metafam.outer_trainers.base import (dense_perturbations, sample_perturbations, weighted_noise_sum,
                                         zero_perturbations)
from metafam.taskfamilies.base import single_task_to_family
from metafam.taskfamilies.quadratic import QuadraticFamily
from metafam.tasks.base import Task

LOW_RANK = dict(perturbation="low_rank")


def _factors(key, m, n, r, lead=()):
  k_w, k_a, k_b = jax.random.split(key, 3)
  return (jax.random.normal(k_w, (m, n)), jax.random.normal(k_a, lead + (m, r)), jax.random.normal(k_b, lead + (n, r)))


def test_perturbed_weights_apply_like_their_dense_matrix():
  w, a, b = _factors(jax.random.key(0), 5, 3, 2)
  pw = low_rank.Perturbed(w, low_rank.LowRank(a, b))
  dense = w + a @ b.T
  np.testing.assert_allclose(low_rank.dense(pw), dense, rtol=1e-6)
  x = jax.random.normal(jax.random.key(1), (7, 5))
  # float32 products of O(1) numbers over <= 5 terms: rounding ~1e-6 relative.
  np.testing.assert_allclose(low_rank.matmul(x, pw), x @ dense, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(low_rank.dense(low_rank.rows(pw, 1, 4)), dense[1:4], rtol=1e-6)
  # Plain arrays pass through unchanged.
  assert low_rank.matmul(x, dense) is not None and low_rank.rows(dense, None, 2).shape == (2, 3)


def test_low_rank_noise_has_the_covariance_of_full_noise():
  """``sigma A B^T / sqrt(r)``: every entry has variance sigma^2 and distinct entries are uncorrelated."""
  sigma, num = 0.5, 200_000
  theta = {"w": jnp.zeros((3, 4)), "b": jnp.zeros((4,))}
  for rank in (1, 3):
    eps = sample_perturbations(theta, jax.random.key(rank), num, sigma, rank)
    assert isinstance(eps["w"], low_rank.LowRank) and eps["w"].a.shape == (num, 3, rank)
    assert eps["b"].shape == (num, 4)  # vectors keep full noise
    z = np.asarray(dense_perturbations(eps)["w"]).reshape(num, 12) / sigma
    cov = z.T @ z / num
    # Entries of E[z z^T]: standard error sqrt(Var(z_i z_j) / num) <= sqrt(9 / num) ~ 0.007 (z_i^2 of a rank-1
    # product of normals has variance 8; with the mean 1, E z^4 = 9); 6 standard errors: no false failure.
    np.testing.assert_allclose(cov, np.eye(12), atol=6 * 3 / np.sqrt(num))
    np.testing.assert_allclose(z.mean(0), 0.0, atol=6 / np.sqrt(num))


def test_factor_sums_and_zeros_match_their_dense_forms():
  theta = {"w": jnp.zeros((6, 5)), "v": jnp.zeros((3,))}
  eps = sample_perturbations(theta, jax.random.key(0), 7, 0.1, 2)
  coef = jax.random.normal(jax.random.key(1), (7,))
  got, want = weighted_noise_sum(coef, eps), weighted_noise_sum(coef, dense_perturbations(eps))
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
  zeros = zero_perturbations(theta, 7, 2)
  assert jax.tree.structure(zeros) == jax.tree.structure(eps)
  assert all(z.shape == e.shape and not np.any(z) for z, e in zip(jax.tree.leaves(zeros), jax.tree.leaves(eps)))
  # Full noise is unchanged by the option's existence: the same numbers as before for rank None.
  full = sample_perturbations(theta, jax.random.key(0), 7, 0.1)
  assert full["w"].shape == (7, 6, 5)


def test_unroll_with_factored_thetas_equals_the_dense_unroll():
  """Shared weights plus per-lane factors (one large product for all lanes) give the numbers of per-lane dense
  weights. MLPLOpt reads its weights through `F.mlp_columns` / `F.mlp_bias0`, the code every per-parameter MLP
  optimizer shares; the antithetic halves run as two vmaps of 20 lanes, each in blocks of 16 (`jax.lax.map`, the
  shared weights closed over). Optimizers that do not read factored weights get them dense from the step
  (`test_low_rank_es_is_unbiased_on_a_quadratic` runs one); the stacked layout is the default of every other test."""
  lopt = get_learned_optimizer("mlp_lopt")
  family = QuadraticFamily(6, scale_range=(0.5, 2.0))
  est = make_estimator("pes", family, lopt, num_tasks=20, unroll_length=4, schedule=ConstantSchedule(6),
                       sigma=0.1, stack_antithetic=False, **LOW_RANK, rank=2)
  assert est.step.lane_chunk == 16 < 20
  theta = lopt.init(jax.random.key(0))
  thetas = pairs.antithetic_thetas(theta, sample_perturbations(theta, jax.random.key(1), 20, 0.1, 2))
  assert any(isinstance(x, low_rank.Perturbed) for x in jax.tree.leaves(
      thetas, is_leaf=lambda x: isinstance(x, low_rank.Perturbed)))
  lanes = est.step.init_fn(thetas, jax.random.key(2), theta_is_batched=True)
  keys = jax.random.split(jax.random.key(3), 5)
  unroll = jax.jit(lambda th, ln: est.step.unroll_fn(th, ln, keys, theta_is_batched=True))
  (_, factored), (_, dense) = unroll(thetas, lanes), unroll(low_rank.dense_tree(thetas), lanes)
  # Only the order of float32 additions differs (x @ w + (x @ a) @ b^T against x @ (w + a b^T)).
  np.testing.assert_allclose(factored.meta_loss, dense.meta_loss, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(factored.mask, dense.mask)


# -- a quadratic meta-objective over a matrix: L(W) = 0.5 sum(C * (X0 + W)^2), gradient C * (X0 + W) -------------
C = jnp.asarray(np.linspace(0.5, 2.0, 12).reshape(3, 4), jnp.float32)
X0 = jnp.asarray(np.linspace(-1.0, 1.0, 12).reshape(3, 4), jnp.float32)


class _Quadratic(Task):
  def init(self, key):
    return jnp.zeros((3, 4))

  def loss(self, params, key, batch):
    return 0.5 * jnp.sum(C * params ** 2)


class _SetParams(Optimizer):
  """One update sets the params to ``X0 + W``, whatever the gradient: the meta-loss after it is ``L(W)``."""

  def __init__(self, theta):
    self.w = theta["w"]

  def init(self, params, model_state=None, num_steps=None, key=None):
    return OptimizerState(params, model_state, jnp.asarray(0, jnp.int32), ())

  def update(self, state, grad, loss=None, model_state=None, key=None):
    return OptimizerState(X0 + self.w, state.state, state.iteration + 1, ())


class SetParams:
  def init(self, key):
    return {"w": jnp.full((3, 4), 0.3, jnp.float32)}

  def opt_fn(self, theta, is_training=False):
    return _SetParams(theta)


def _quadratic_estimates(rank, calls, num_tasks, sigma=0.2):
  lopt = SetParams()
  theta = lopt.init(None)
  noise = {} if rank is None else dict(LOW_RANK, rank=rank)
  est = make_estimator("full_es", single_task_to_family(_Quadratic()), lopt, num_tasks=num_tasks,
                       trajectory_length=1, sigma=sigma, loss_kind="meta_loss", meta_loss_split="same_batch", **noise)
  run = jax.jit(jax.vmap(lambda k: est.estimate_fn(theta, {}, k)[0].grad["w"]))
  return np.asarray(run(jax.random.split(jax.random.key(0 if rank is None else rank), calls)), np.float64), theta


@pytest.mark.parametrize("rank", [1, 4])
def test_low_rank_es_is_unbiased_on_a_quadratic(rank):
  """On a quadratic ``L+ - L- = 2 g . eps`` exactly, so the mean estimate is ``E[eps eps^T] g / sigma^2 = g``."""
  estimates, theta = _quadratic_estimates(rank, calls=400, num_tasks=64)
  exact = np.asarray(C * (X0 + theta["w"]))
  mean = estimates.mean(0)
  stderr = estimates.std(0, ddof=1) / np.sqrt(len(estimates))
  z = (mean - exact) / stderr
  assert np.all(np.abs(z) < 5), z  # 12 coordinates, 5 standard errors: a false failure has odds ~1e-5
  # The per-estimate variance is finite and of the order of full noise's (see README: the measured ratios).
  full, _ = _quadratic_estimates(None, calls=400, num_tasks=64)
  ratio = estimates.var(0).sum() / full.var(0).sum()
  assert 0.5 < ratio < 5, ratio


def test_influence_balancing_is_unchanged_without_matrices():
  """Vectors and scalars keep full Gaussian noise: on the influence-balancing problem (theta a scalar) low-rank PES
  draws the same numbers as PES, so it converges to theta* = -1/6 exactly as PES does (test_estimators)."""
  lopt = InfluenceDynamics(0.5)
  kw = dict(num_tasks=50, sigma=0.1, unroll_length=1, schedule=NeverEndingSchedule(), loss_kind="meta_loss",
            meta_loss_split="same_batch", random_initial_iteration=False)
  theta = lopt.init(None)
  results = []
  for noise in ({}, dict(LOW_RANK, rank=2)):
    est = make_estimator("pes", influence_family(), lopt, **kw, **noise)
    ws = est.init_worker_state(theta, jax.random.key(0))
    grads = []
    for j in range(3):
      e, ws = est.estimate(theta, ws, jax.random.key(j + 1))
      grads.append(np.asarray(e.grad["theta"]))
    results.append(grads)
  np.testing.assert_array_equal(results[0], results[1])


def _lopt_unroll_setup(num_tasks, rank, perturbation="low_rank"):
  """A small MLPLOpt on a fixed quadratic task (deterministic: every lane runs the same problem) and FullES."""
  lopt = MLPLOpt(hidden_sizes=(8,), decays=(0.5, 0.9), time_scales=(3.0, 10.0))
  theta = lopt.init(jax.random.key(0))
  family = single_task_to_family(_FixedQuadratic())
  common = dict(loss_kind="meta_loss", meta_loss_split="same_batch", random_initial_iteration=False)
  est = make_estimator("full_es", family, lopt, num_tasks=num_tasks, trajectory_length=4, sigma=0.01,
                       perturbation=perturbation, rank=rank, **common)
  tbptt = make_estimator("tbptt", family, lopt, num_tasks=1, unroll_length=4, schedule=ConstantSchedule(4), **common)
  exact = tbptt.estimate(theta, tbptt.init_worker_state(theta, jax.random.key(1)), jax.random.key(2))[0].grad
  return est, theta, exact


class _FixedQuadratic(Task):
  def init(self, key):
    return jnp.asarray([[1.0, -2.0, 0.5], [0.3, 1.5, -1.0]], jnp.float32)

  def loss(self, params, key, batch):
    return 0.5 * jnp.sum(jnp.asarray([[0.5], [2.0]]) * params ** 2)


def _flat(tree):
  return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _lopt_unroll_check(rank, calls, num_tasks):
  est, theta, exact = _lopt_unroll_setup(num_tasks, rank)
  run = jax.jit(lambda k: _flat_grad(est.estimate_fn(theta, {}, k)[0].grad))
  g = _flat(exact)
  projections, total = [], 0.0
  for k in jax.random.split(jax.random.key(rank), calls):
    e = np.asarray(run(k), np.float64)
    projections.append(e @ g / (g @ g))
    total = total + e
  mean = total / calls
  cosine = mean @ g / (np.linalg.norm(mean) * np.linalg.norm(g))
  return np.asarray(projections), cosine


def _flat_grad(tree):
  return jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(tree)])


@pytest.mark.parametrize("rank", [1])  # rank 1: the largest variance; ranks 1 and 4 to 1% in the slow version
def test_low_rank_es_matches_the_exact_gradient_of_a_learned_optimizer_unroll(rank):
  """FullES with low-rank noise on an MLPLOpt unroll, against ``jax.grad`` through the same unroll (TBPTT on one
  lane of the deterministic problem). The mean over calls estimates the gradient of the smoothed loss, which
  differs from the exact gradient by O(sigma^2); the projection's error is judged by its own standard error."""
  projections, cosine = _lopt_unroll_check(rank, calls=8, num_tasks=2048)
  mean, stderr = projections.mean(), projections.std(ddof=1) / np.sqrt(len(projections))
  assert abs(mean - 1.0) < 5 * stderr + 0.01, (mean, stderr)
  # 16k pairs over 74 meta-parameters: the mean is mostly signal (cosine ~ 1 / sqrt(1 + 74 k / 16k), k ~ 3).
  assert cosine > 0.98, cosine


@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 4])
def test_low_rank_es_matches_the_exact_gradient_of_a_learned_optimizer_unroll_closely(rank):
  """The issue's criterion: over ~1M pairs the projection is within 1% of 1 and the cosine at least 0.999."""
  projections, cosine = _lopt_unroll_check(rank, calls=128, num_tasks=8192)
  assert abs(projections.mean() - 1.0) < 0.01, projections.mean()
  assert cosine >= 0.999, cosine


def test_low_rank_pes_checkpoints_and_resumes_bit_identically(tmp_path):
  """The worker state holds the factors of the current perturbations (and the dense accumulator): a run resumed
  from its checkpoint ends bit-identical to an uninterrupted one."""
  import optax
  from metafam.outer_trainers import MetaTrainer
  from metafam.runs import train
  lopt = MLPLOpt(hidden_sizes=(8,), decays=(0.5, 0.9), time_scales=(3.0, 10.0))
  family = QuadraticFamily(4, scale_range=(0.5, 2.0))

  def trainer():
    est = make_estimator("pes", family, lopt, num_tasks=2, unroll_length=3, schedule=ConstantSchedule(5),
                         **LOW_RANK, rank=2)
    return MetaTrainer(lopt, [est], optax.adam(0.01))

  run = trainer()  # one trainer (one compilation); the resumed run starts from what the checkpoint holds
  full, _ = train(run, 4, key=jax.random.key(1), progress=False)
  train(run, 2, key=jax.random.key(1), output_dir=str(tmp_path), progress=False)
  resumed, history = train(run, 4, key=jax.random.key(1), output_dir=str(tmp_path), progress=False)
  assert [r["step"] for r in history] == [3, 4]
  eps = resumed.worker_states[0].eps["w0"]
  assert isinstance(eps, low_rank.LowRank) and eps.a.shape == (2, 6, 2)
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not np.array_equal(np.asarray(full.theta["w0"]), np.asarray(lopt.init(jax.random.key(0))["w0"]))


def test_bad_perturbation_arguments():
  lopt, family = MLPLOpt(), QuadraticFamily(4)
  with pytest.raises(ValueError, match=r"perturbation must be one of \('full', 'low_rank'\), got 'lowrank'"):
    make_estimator("pes", family, lopt, num_tasks=2, perturbation="lowrank")
  for bad in (0, 1.5, True):
    with pytest.raises(ValueError, match="rank must be a positive int"):
      make_estimator("full_es", family, lopt, num_tasks=2, **LOW_RANK, rank=bad)


@pytest.mark.slow
def test_low_rank_pes_on_two_devices_equals_one():
  """Lanes split over 2 devices (shared weights replicated, factors split by lane): the numbers of one device."""
  lopt = MLPLOpt(hidden_sizes=(8,), decays=(0.5, 0.9), time_scales=(3.0, 10.0))
  family = QuadraticFamily(4, scale_range=(0.5, 2.0))
  theta = lopt.init(jax.random.key(0))
  grads = []
  for devices in (None, 2):
    est = make_estimator("pes", family, lopt, num_tasks=4, unroll_length=3, schedule=ConstantSchedule(5),
                         devices=devices, **LOW_RANK, rank=2)
    ws = est.init_worker_state(theta, jax.random.key(1))
    for j in range(3):
      e, ws = est.estimate(theta, ws, jax.random.key(2 + j))
    grads.append(_flat(e.grad))
  np.testing.assert_allclose(grads[0], grads[1], rtol=1e-4, atol=1e-6)  # float rounding of another program
