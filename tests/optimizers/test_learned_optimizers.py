"""Learned optimizers: LearnableSGD / LearnableAdam against optax, MLPLOpt's features and update, vmap over theta,
the optax adapter and meta-gradients through short unrolls."""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from optax_runs import assert_trees_close, run_optax

from metafam.optimizers import (SGD, Adam, HandDesigned, LearnableAdam, LearnableSGD, LearnedOptimizer, MLPLOpt,
                                Optimizer, OptimizerState, as_optax, num_meta_params)
from metafam.optimizers.mlp_lopt import DEFAULT_DECAYS, DEFAULT_TIME_SCALES, rms_normalize, time_features
from metafam.tasks.quadratic import QuadraticTask

SHAPES = {"w": (6, 4), "b": (4,), "s": ()}


def _params(seed=0, scale=1.0):  # numpy draws: cheap, and no random kernels to compile
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray(scale * rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}


def _grads(num_steps, seed=1):
  return [_params(seed=seed * 1000 + i, scale=0.5) for i in range(num_steps)]




def _run_optimizer(opt, params, grads):
  state = opt.init(params)
  update = jax.jit(opt.update)
  for g in grads:
    state = update(state, g)
  return opt.get_params(state), state


def _quadratic_unroll(lopt, num_steps, task=None):
  """``theta -> loss after num_steps`` of training a fixed quadratic."""
  task = task or QuadraticTask(dim=8, scale=2.0)
  x0 = jnp.asarray(np.random.default_rng(3).standard_normal(8), jnp.float32)

  def meta_loss(theta):
    opt = lopt.opt_fn(theta, is_training=True)

    def step(state, _):
      loss, grad = jax.value_and_grad(task.loss)(opt.get_params(state), None, None)
      return opt.update(state, grad, loss=loss), loss

    state, _ = jax.lax.scan(step, opt.init(x0), None, length=num_steps)
    return task.loss(opt.get_params(state), None, None)

  return meta_loss, task, x0


# -- LearnableSGD / LearnableAdam ----------------------------------------------------------------------------------
@pytest.mark.parametrize("lr", [1e-2, 0.3])
def test_learnable_sgd_matches_optax_and_metafam_sgd(lr):
  lopt = LearnableSGD(initial_lr=lr)
  theta = lopt.init(jax.random.key(0))
  assert set(theta) == {"log_lr"} and theta["log_lr"].dtype == jnp.float32
  np.testing.assert_allclose(float(theta["log_lr"]), np.log(lr), rtol=1e-6)
  opt = lopt.opt_fn(theta)
  assert isinstance(opt, Optimizer)
  params, grads = _params(), _grads(6)
  got, state = _run_optimizer(opt, params, grads)
  assert isinstance(state, OptimizerState) and int(state.iteration) == 6
  assert_trees_close(got, run_optax(optax.sgd(lr), params, grads))
  assert_trees_close(got, _run_optimizer(SGD(lr), params, grads)[0])  # interchangeable with the hand-designed one
  want = jax.tree.map(lambda p, *gs: p - lr * sum(gs), params, *grads)
  assert_trees_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hp", [dict(initial_lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8),
                                dict(initial_lr=3e-2, beta1=0.5, beta2=0.95, epsilon=1e-3)])
def test_learnable_adam_matches_optax_adam(hp):
  lopt = LearnableAdam(**hp)
  theta = lopt.init(jax.random.key(0))
  assert set(theta) == {"log_lr", "logit_one_minus_beta1", "logit_one_minus_beta2", "log_epsilon"}
  recovered = LearnableAdam.hyperparameters(theta)
  for name, want in [("lr", hp["initial_lr"]), ("beta1", hp["beta1"]), ("beta2", hp["beta2"]),
                     ("epsilon", hp["epsilon"])]:
    np.testing.assert_allclose(float(recovered[name]), want, rtol=1e-6)
  params, grads = _params(), _grads(8)
  got, state = _run_optimizer(lopt.opt_fn(theta), params, grads)
  tx = optax.adam(hp["initial_lr"], b1=hp["beta1"], b2=hp["beta2"], eps=hp["epsilon"])
  want = run_optax(tx, params, grads)
  assert_trees_close(got, want, rtol=1e-5, atol=1e-6)
  assert_trees_close(got, _run_optimizer(Adam(hp["initial_lr"], hp["beta1"], hp["beta2"], hp["epsilon"]),
                                          params, grads)[0], rtol=1e-5, atol=1e-6)
  assert not np.allclose(np.asarray(got["w"]), np.asarray(params["w"]))  # it moved


def test_learnable_adam_parametrization_is_unconstrained():
  extreme = {"log_lr": jnp.float32(0.0), "logit_one_minus_beta1": jnp.float32(40.0),
             "logit_one_minus_beta2": jnp.float32(-40.0), "log_epsilon": jnp.float32(-30.0)}
  hp = LearnableAdam.hyperparameters(extreme)
  assert 0.0 <= float(hp["beta1"]) < 1e-6 and 0.0 < float(hp["one_minus_beta2"]) < 1e-16
  got, _ = _run_optimizer(LearnableAdam().opt_fn(extreme), _params(), _grads(3))
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(got))


# -- MLPLOpt: meta-parameters, features, update ---------------------------------------------------------------------
def test_mlp_lopt_meta_parameters():
  lopt = MLPLOpt()
  assert isinstance(lopt, LearnedOptimizer) and lopt.num_features == 19
  theta = lopt.init(jax.random.key(0))
  shapes = {k: v.shape for k, v in theta.items()}
  assert shapes == {"w0": (19, 32), "b0": (32,), "w1": (32, 32), "b1": (32,), "w2": (32, 2), "b2": (2,)}
  assert all(v.dtype == jnp.float32 for v in theta.values())
  assert num_meta_params(theta) == 19 * 32 + 32 + 32 * 32 + 32 + 32 * 2 + 2 == 1762


def test_time_features_equal_formula():
  for t in [0, 1, 7, 250, 123456]:
    want = np.tanh(t / np.asarray(DEFAULT_TIME_SCALES, np.float64) - 1.0)
    np.testing.assert_allclose(np.asarray(time_features(jnp.int32(t))), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(time_features(0)), np.full(11, np.tanh(-1.0)), rtol=1e-6)


def test_mlp_lopt_features_are_rms_normalized_per_tensor():
  lopt = MLPLOpt()
  rng = np.random.default_rng(0)
  p = jnp.asarray(300.0 * rng.standard_normal((7, 5)), jnp.float32)
  g = jnp.asarray(1e-2 * rng.standard_normal((7, 5)), jnp.float32)
  m = jnp.asarray(rng.standard_normal((6, 7, 5)) * np.asarray([1e-2, 1e-1, 1.0, 10.0, 1e2, 1e3])[:, None, None],
                  jnp.float32)
  feats = jax.jit(lopt.features)(p, g, m, jnp.int32(42))
  assert feats.shape == (7, 5, 19) and feats.dtype == jnp.float32
  rms = np.sqrt(np.mean(np.square(np.asarray(feats[..., :8], np.float64)), axis=(0, 1)))
  np.testing.assert_allclose(rms, np.ones(8), rtol=1e-5)
  unit = lambda x: np.asarray(x, np.float64) / np.sqrt(np.mean(np.square(np.asarray(x, np.float64))) + 1e-12)
  np.testing.assert_allclose(np.asarray(feats[..., 0]), unit(g), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(feats[..., 1]), unit(p), rtol=1e-5, atol=1e-6)
  for k in range(6):
    np.testing.assert_allclose(np.asarray(feats[..., 2 + k]), unit(m[k]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(feats[..., 8:]),
                             np.broadcast_to(np.tanh(42.0 / np.asarray(DEFAULT_TIME_SCALES) - 1.0), (7, 5, 11)),
                             rtol=1e-5, atol=1e-6)
  # Scale invariance of the per-element features while mean(x^2) >> 1e-12, and the eps once it is not.
  scaled = jax.jit(lopt.features)(1e3 * p, 1e3 * g, 1e3 * m, jnp.int32(42))
  np.testing.assert_allclose(np.asarray(scaled), np.asarray(feats), rtol=1e-5, atol=1e-6)
  tiny = 1e-6 * jnp.ones((4,))
  np.testing.assert_allclose(np.asarray(rms_normalize(tiny, (0,))), np.full(4, 1e-6 / np.sqrt(2e-12)), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(rms_normalize(jnp.float32(-3.5), ())), -1.0, rtol=1e-6)


def _perturbed_theta(lopt, seed):
  """An initial theta plus N(0, 0.3^2) noise, so every unit and both outputs matter."""
  rng = np.random.default_rng(seed)
  return {k: v + jnp.asarray(0.3 * rng.standard_normal(v.shape), jnp.float32)
          for k, v in lopt.init(jax.random.key(seed)).items()}


def test_mlp_lopt_update_equals_reference_mlp_on_features():
  lopt = MLPLOpt(exp_mult=0.5, step_mult=1e-2)
  theta = _perturbed_theta(lopt, 0)
  opt = lopt.opt_fn(theta)
  params, grads = _params(), _grads(4)
  state = opt.init(params)
  assert isinstance(state, OptimizerState) and state.opt_state["w"].shape == (6, 6, 4) and state.opt_state["s"].shape == (6,)
  update = jax.jit(opt.update)

  @jax.jit
  def reference_steps(state, g, new):  # the MLP applied to the [*shape, 19] feature arrays, leaf by leaf
    return {k: lopt.step_from_outputs(lopt.apply_mlp(theta, lopt.features(
        state.params[k], g[k], new.opt_state[k], state.iteration))) for k in SHAPES}

  decays = np.asarray(DEFAULT_DECAYS, np.float64)
  momenta = jax.tree.map(lambda p: np.zeros((6,) + np.shape(p)), params)
  for t, g in enumerate(grads):
    new = update(state, g)
    assert int(new.iteration) == t + 1
    momenta = jax.tree.map(lambda m, gg: decays.reshape((6,) + (1,) * np.ndim(gg)) * m
                           + (1 - decays).reshape((6,) + (1,) * np.ndim(gg)) * np.asarray(gg), momenta, g)
    assert_trees_close(new.opt_state, momenta, rtol=1e-5, atol=1e-7)
    steps = reference_steps(state, g, new)
    assert_trees_close(new.params, jax.tree.map(lambda p, st: p - st, state.params, steps), rtol=1e-5, atol=1e-6)
    assert all(float(jnp.max(jnp.abs(st))) > 1e-4 for st in steps.values())  # real steps, not no-ops
    state = new


def test_mlp_lopt_initial_step_is_normalized_momentum_descent():
  lopt = MLPLOpt()
  opt = lopt.opt_fn(lopt.init(jax.random.key(0)))
  params, (g,) = _params(), _grads(1)
  new = jax.jit(opt.update)(opt.init(params), g)
  for k in ("w", "b"):
    step = np.asarray(params[k] - new.params[k])
    want = 1e-3 * np.asarray(g[k]) / np.sqrt(np.mean(np.square(np.asarray(g[k]))))
    assert np.all(np.isfinite(step))
    np.testing.assert_allclose(step, want, rtol=0.1, atol=5e-5)  # random units add ~1% noise
    assert np.corrcoef(step.ravel(), want.ravel())[0, 1] > 0.99


def test_initial_mlp_lopt_decreases_quadratic_loss():
  lopt = MLPLOpt()
  opt = lopt.opt_fn(lopt.init(jax.random.key(0)))
  task = QuadraticTask(dim=10)

  @jax.jit
  def train(x0):
    def step(state, _):
      loss, grad = jax.value_and_grad(task.loss)(opt.get_params(state), None, None)
      return opt.update(state, grad, loss=loss), loss
    return jax.lax.scan(step, opt.init(x0), None, length=50)[1]

  losses = np.asarray(train(jnp.asarray(np.random.default_rng(1).standard_normal(10), jnp.float32)))
  assert np.all(np.isfinite(losses))
  assert losses[-1] < 0.95 * losses[0]
  assert np.all(np.diff(losses) < 1e-6)  # steps of ~1e-3 per element on a quadratic: monotone


def test_mlp_lopt_vmap_over_lanes_shared_and_batched_theta():
  lopt, lanes, num_steps = MLPLOpt(), 3, 4
  params = jax.tree.map(lambda *xs: jnp.stack(xs), *[_params(seed=i) for i in range(lanes)])
  grads = jax.tree.map(lambda *xs: jnp.stack(xs).reshape((lanes, num_steps) + xs[0].shape),
                       *[g for i in range(lanes) for g in _grads(num_steps, seed=i + 10)])

  def train(th, p, gs):
    opt = lopt.opt_fn(th)
    step = lambda i, s: opt.update(s, jax.tree.map(lambda x: x[i], gs))
    return opt.get_params(jax.lax.fori_loop(0, num_steps, step, opt.init(p)))

  thetas = jax.tree.map(lambda *xs: jnp.stack(xs), *[_perturbed_theta(lopt, 5 + i) for i in range(lanes)])
  theta = jax.tree.map(lambda x: x[0], thetas)
  shared = jax.jit(jax.vmap(train, in_axes=(None, 0, 0)))(theta, params, grads)
  batched = jax.jit(jax.vmap(train))(thetas, params, grads)
  single = jax.jit(train)
  lane = lambda tree, i: jax.tree.map(lambda x: x[i], tree)
  for i in range(lanes):
    assert_trees_close(lane(shared, i), single(theta, lane(params, i), lane(grads, i)), rtol=1e-5, atol=1e-6)
    assert_trees_close(lane(batched, i), single(lane(thetas, i), lane(params, i), lane(grads, i)),
                        rtol=1e-5, atol=1e-6)
  assert_trees_close(lane(batched, 0), lane(shared, 0), rtol=1e-5, atol=1e-6)  # same theta in lane 0
  assert not np.allclose(np.asarray(batched["w"][1]), np.asarray(shared["w"][1]), atol=1e-6)


# -- optax adapter ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lopt", [LearnableSGD(0.1), LearnableAdam(1e-2), MLPLOpt(), HandDesigned(Adam(1e-2))],
                         ids=lambda l: l.name)
def test_optax_adapter_matches_optimizer_api(lopt):
  theta = lopt.init(jax.random.key(0))
  task = QuadraticTask(dim=5, scale=3.0, target=jnp.arange(5.0))
  x0 = jnp.asarray(np.random.default_rng(1).standard_normal(5), jnp.float32)
  grad_fn = jax.jit(jax.grad(task.loss))

  opt = lopt.opt_fn(theta)
  state, update = opt.init(x0), jax.jit(opt.update)
  for _ in range(6):
    state = update(state, grad_fn(opt.get_params(state), None, None))
  want = opt.get_params(state)

  tx = lopt.as_optax(theta)
  assert isinstance(tx, optax.GradientTransformationExtraArgs)
  params, ostate = x0, tx.init(x0)
  update = jax.jit(tx.update)
  for _ in range(6):
    updates, ostate = update(grad_fn(params, None, None), ostate, params)
    params = optax.apply_updates(params, updates)
  np.testing.assert_allclose(np.asarray(params), np.asarray(want), rtol=1e-6, atol=1e-6)
  assert not np.allclose(np.asarray(params), np.asarray(x0))
  if isinstance(lopt, LearnableSGD):  # the functional spelling agrees (extra arguments such as loss= are accepted)
    updates, _ = as_optax(lopt, theta).update(grad_fn(params, None, None), ostate, params, loss=jnp.float32(1.0))
    updates2, _ = tx.update(grad_fn(params, None, None), ostate, params)
    np.testing.assert_allclose(np.asarray(updates), np.asarray(updates2), rtol=1e-6, atol=1e-7)


def test_optax_adapter_in_chain_sees_real_params():
  lopt = LearnableSGD(0.1)
  tx = optax.chain(lopt.as_optax(lopt.init(jax.random.key(0))), optax.scale(0.5))
  params = jnp.asarray([1.0, -2.0])
  state = tx.init(params)
  for _ in range(3):
    updates, state = tx.update(2.0 * params, state, params)  # grad of ||x||^2
    params = optax.apply_updates(params, updates)
  np.testing.assert_allclose(np.asarray(params), np.asarray([1.0, -2.0]) * 0.9 ** 3, rtol=1e-6)


# -- meta-gradients -----------------------------------------------------------------------------------------------
def test_meta_grad_learnable_sgd_matches_closed_form():
  lr, k = 0.05, 5
  meta_loss, task, x0 = _quadratic_unroll(LearnableSGD(lr), k)
  theta = LearnableSGD(lr).init(jax.random.key(0))
  g = jax.jit(jax.grad(meta_loss))(theta)["log_lr"]
  s, r = task.scale, 1.0 - lr * task.scale
  want = lr * 0.5 * s * float(jnp.sum(x0 ** 2)) * 2 * k * r ** (2 * k - 1) * (-s)  # d/dlog_lr of 0.5 s r^2k |x0|^2
  np.testing.assert_allclose(float(g), want, rtol=1e-4)


@pytest.mark.parametrize("lopt", [LearnableAdam(1e-2), MLPLOpt()], ids=lambda l: l.name)
def test_meta_grad_through_unroll_is_finite_and_nonzero(lopt):
  meta_loss, _, _ = _quadratic_unroll(lopt, 6)
  theta = lopt.init(jax.random.key(0))
  value, grads = jax.jit(jax.value_and_grad(meta_loss))(theta)
  assert np.isfinite(float(value))
  for name, leaf in grads.items():
    assert np.all(np.isfinite(np.asarray(leaf))), name
    assert float(jnp.max(jnp.abs(leaf))) > 0.0, name
  if isinstance(lopt, LearnableAdam):  # the learning-rate gradient matches a central difference
    h, loss_fn = 1e-2, jax.jit(meta_loss)
    fd = loss_fn(dict(theta, log_lr=theta["log_lr"] + h)) - loss_fn(dict(theta, log_lr=theta["log_lr"] - h))
    np.testing.assert_allclose(float(grads["log_lr"]), float(fd) / (2 * h), rtol=2e-2)
    assert float(grads["log_lr"]) < 0  # a larger step helps this early in training
