"""`MuonResidualLOpt`: at its initial theta it is `optax.contrib.muon`; its residual, gains and fan-in option do what
the docstring says, computed independently here. (Registry conformance -- meta-gradients against finite differences,
bf16 states, vmap, estimators -- runs in tests/optimizers/test_lopt_zoo.py over both registered variants.)"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from optax_runs import optax_updates

from metafam.optimizers.newton_schulz import orthogonalize  # optax's iteration, its direct form by default
from metafam.optimizers.muon_lopt import (AdamAccumulators, MatrixAccumulators, MuonResidualLOpt, matrix_fans,
                                          muon_dimension_numbers)
from metafam.optimizers.registry import get_learned_optimizer

LR = 0.02


# muon_celo_lopt is MuonResidualLOpt with the residual before the gains: its initial theta is Muon by the same
# construction as muon_residual_lopt's, checked update for update by that entry in the default suite.
SLOW_CASES = {("test_initial_theta_is_optax_muon_update_for_update", f"{kernels}-muon_celo_lopt")
              for kernels in ("adam", "matrix")}


def _params(rng):
  """A matrix wider than tall and one taller than wide (both shape scales), a bias, a conv kernel and a scalar."""
  return {"w_wide": jnp.asarray(rng.standard_normal((6, 10)), jnp.float32),
          "w_tall": jnp.asarray(rng.standard_normal((12, 5)), jnp.float32),
          "b": jnp.asarray(rng.standard_normal(5), jnp.float32),
          "conv": jnp.asarray(rng.standard_normal((3, 3, 2, 4)), jnp.float32),
          "s": jnp.asarray(0.3, jnp.float32)}


def _grads(rng, params, steps):
  return [jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params) for _ in range(steps)]



@pytest.mark.parametrize("name", ["muon_residual_lopt", "muon_celo_lopt"])
@pytest.mark.parametrize("conv_kernels", ["adam", "matrix"])
def test_initial_theta_is_optax_muon_update_for_update(name, conv_kernels):
  rng = np.random.default_rng(0)
  params = _params(rng)
  grads = _grads(rng, params, 8)
  lopt = get_learned_optimizer(name, step_mult=LR, conv_kernels=conv_kernels)
  theta = lopt.init(jax.random.key(1))
  ours = optax_updates(lopt.as_optax(theta), params, grads)
  ref = optax_updates(optax.contrib.muon(LR, muon_weight_dimension_numbers=muon_dimension_numbers(conv_kernels)),
                   params, grads)
  if conv_kernels == "matrix":  # the conv kernel's update is orthogonal as a [3 * 3 * 2, 4] matrix (times LR)
    flat = np.asarray(ref[0]["conv"], np.float64).reshape(18, 4) / -LR
    singular = np.linalg.svd(flat, compute_uv=False)  # optax's quintic iteration leaves them in about [0.7, 1.2];
    assert np.all((singular > 0.5) & (singular < 1.3)), singular  # Adam's near-sign entries would give about 4
  for step, (a, b) in enumerate(zip(ours, ref)):
    for k in params:
      # The same operations, but float32 Newton-Schulz amplifies rounding: a one-ulp change of its input moves
      # optax's own output by 2e-5 (relative), and optax.contrib.muon's update of a matrix differs by 3e-5 between
      # the matrix alone and in a tree with other leaves. Tolerance 1e-4 of each entry and of the update's largest
      # entry (for entries near 0); a wrong rule is off by O(1).
      scale = float(np.max(np.abs(np.asarray(b[k]))))
      np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=1e-4, atol=1e-4 * scale,
                                 err_msg=f"{k} {step}")
  # and the Optimizer (state carrying the params) follows the same trajectory
  opt = lopt.opt_fn(theta)
  state, p = opt.init(params), params
  for g, u in zip(grads, ref):
    state, p = opt.update(state, g), optax.apply_updates(p, u)
  for k in params:
    np.testing.assert_allclose(np.asarray(opt.get_params(state)[k]), np.asarray(p[k]), rtol=1e-5, atol=1e-6)


def _mlp(theta, x):
  """The residual MLP in numpy: x [features + 1 flag, n] -> r [n]."""
  w0, b0, w1, b1 = (np.asarray(theta["mlp"][k], np.float64) for k in ("w0", "b0", "w1", "b1"))
  return (np.maximum(w0.T @ x + b0[:, None], 0).T @ w1 + b1)[:, 0]


def _unit_rms(x):
  return x / np.sqrt(np.mean(np.square(x)) + 1e-12)


def test_accumulators_per_kind_of_tensor_are_plain_dicts_in_checkpoints():
  """`MatrixAccumulators` for the tensors Muon orthogonalizes, `AdamAccumulators` for the others; typed dicts, so a
  worker state in a meta-training checkpoint keeps the format it had as plain dicts (a dict node with these keys)."""
  params = _params(np.random.default_rng(0))
  for conv_kernels, matrices in (("adam", {"w_wide", "w_tall"}), ("matrix", {"w_wide", "w_tall", "conv"})):
    lopt = MuonResidualLOpt(conv_kernels=conv_kernels)
    accs = jax.tree.map(lopt.init_accumulators, params)
    for k, p in params.items():
      assert type(accs[k]) is dict  # what the checkpoint format records as {"kind": "dict", "keys": [...]}
      want = MatrixAccumulators.__annotations__ if k in matrices else AdamAccumulators.__annotations__
      assert list(accs[k]) == list(want) and (matrix_fans(p, conv_kernels) is not None) == (k in matrices)
      new = lopt.leaf_direction(lopt.init(jax.random.key(0)), jnp.asarray(0), p, p, accs[k])[1]
      assert type(new) is dict and list(new) == list(want)
  assert matrix_fans(params["conv"], "matrix") == (18, 4) and matrix_fans(params["conv"]) is None


@pytest.mark.parametrize("residual, center", [("after", True), ("before", True), ("after", False), ("before", False)])
def test_first_step_with_a_residual_matches_its_definition(residual, center):
  """One update from zero state, recomputed from the formulas: momentum after one step ``mu = (1 - b) g``, Nesterov
  ``mu_hat = b mu / (1 - b^2) + (1 - b) g / (1 - b) = g (b(1 - b)/(1 - b^2) + 1)``, Adam's Nesterov direction at
  step 1 ``(b1 m / (1 - b1^2) + (1 - b1) g / (1 - b1)) / (sqrt(v / (1 - b2)) + eps)``; the residual centred over each
  tensor or not."""
  rng = np.random.default_rng(3)
  lopt = MuonResidualLOpt(residual=residual, step_mult=LR, center_residual=center)
  mlp = lambda x: _mlp(theta, x) - (np.mean(_mlp(theta, x)) if center else 0.0)
  theta = lopt.init(jax.random.key(0))
  theta["mlp"]["w1"] = jnp.asarray(rng.standard_normal(theta["mlp"]["w1"].shape), jnp.float32)
  theta["mlp"]["b1"] = jnp.asarray([0.3], jnp.float32)
  theta["log_gain"] = jnp.asarray([np.log(2.0), np.log(0.5)], jnp.float32)
  params = {"w": jnp.asarray(rng.standard_normal((5, 7)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal(7), jnp.float32)}
  g = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), jnp.float32), params)
  tx = lopt.as_optax(theta)
  u = tx.update(g, tx.init(params), params)[0]
  b, b1, b2 = 0.95, 0.9, 0.999
  gw, pw = np.asarray(g["w"], np.float64), np.asarray(params["w"], np.float64)
  m = gw * (b * (1 - b) / (1 - b * b) + 1)
  feats = lambda fs, flag: np.concatenate([np.stack([_unit_rms(f).ravel() for f in fs]),
                                           np.full((1, fs[0].size), flag)])
  rms = lambda x: np.sqrt(np.mean(np.square(x)) + 1e-12)
  scale = np.sqrt(7 / 5)
  if residual == "after":
    d = np.asarray(orthogonalize(jnp.asarray(m, jnp.float32)), np.float64) * scale
    r = mlp(feats([gw, pw, m, d], 1.0)).reshape(m.shape)
    want_w = 2.0 * (d + rms(d) * r)
  else:
    r = mlp(feats([gw, pw, m], 1.0)).reshape(m.shape)
    want_w = 2.0 * np.asarray(orthogonalize(jnp.asarray(m + rms(m) * r, jnp.float32)), np.float64) * scale
  np.testing.assert_allclose(-np.asarray(u["w"]) / LR, want_w, rtol=2e-4, atol=1e-5)  # float32 NS vs float64 rest
  gb, pb = np.asarray(g["b"], np.float64), np.asarray(params["b"], np.float64)
  mom, v = (1 - b1) * gb, (1 - b2) * gb ** 2
  a = (b1 * mom / (1 - b1 ** 2) + (1 - b1) * gb / (1 - b1)) / (np.sqrt(v / (1 - b2)) + 1e-8)
  fs = [gb, pb, mom] + ([a] if residual == "after" else [])
  want_b = 0.5 * (a + rms(a) * mlp(feats(fs, -1.0)))
  np.testing.assert_allclose(-np.asarray(u["b"]) / LR, want_b, rtol=1e-4, atol=1e-6)
  assert np.max(np.abs(r)) > 0.1  # the residual was not negligible
  assert abs(np.mean(r)) < 1e-9 if center else abs(np.mean(r)) > 0.1  # b1 = 0.3 shifts an uncentred residual


def test_gains_scale_each_kind_exactly():
  rng = np.random.default_rng(5)
  params = _params(rng)
  grads = _grads(rng, params, 3)
  lopt = MuonResidualLOpt(step_mult=LR)
  theta = lopt.init(jax.random.key(0))
  base = optax_updates(lopt.as_optax(theta), params, grads)
  gained = optax_updates(lopt.as_optax(dict(theta, log_gain=jnp.log(jnp.asarray([4.0, 0.25])))), params, grads)
  for k in params:
    factor = 4.0 if params[k].ndim == 2 else 0.25
    # step 1 starts from the same params; exp(log 4) and exp(log 0.25) are 4 and 0.25 to float32 rounding
    np.testing.assert_allclose(np.asarray(gained[0][k]), factor * np.asarray(base[0][k]), rtol=1e-6)


def test_fan_in_power_scales_matrices_by_their_fan_in():
  rng = np.random.default_rng(6)
  params = _params(rng)
  grads = _grads(rng, params, 1)
  plain = optax_updates(MuonResidualLOpt(step_mult=LR).as_optax(MuonResidualLOpt().init(jax.random.key(0))), params,
                     grads)[0]
  lopt = MuonResidualLOpt(step_mult=LR, fan_in_power=0.5, base_fan_in=24)
  scaled = optax_updates(lopt.as_optax(lopt.init(jax.random.key(0))), params, grads)[0]
  for k, fan_in in (("w_wide", 6), ("w_tall", 12), ("b", None), ("conv", None), ("s", None)):
    factor = (24 / fan_in) ** 0.5 if fan_in else 1.0
    np.testing.assert_allclose(np.asarray(scaled[k]), factor * np.asarray(plain[k]), rtol=1e-6)


@pytest.mark.parametrize("center", [True, False])
def test_meta_gradient_reaches_the_zero_output_layer_and_the_gains_at_init(center):
  """At init only the output layer and the gains (per kind, per layer shape) can move the steps (the hidden layers'
  effect passes through a zero output layer), so exactly those get nonzero meta-gradients: meta-training can leave
  Muon wherever it pays. A centred residual cannot use the output bias (a uniform shift, removed): its gradient is 0."""
  rng = np.random.default_rng(7)
  target = jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)
  loss = lambda p: jnp.mean(jnp.square(p["w"] - target)) + jnp.mean(jnp.square(p["b"] - 1.0))
  params = {"w": jnp.zeros((8, 6), jnp.float32), "b": jnp.zeros((6,), jnp.float32)}
  for name in ("muon_residual_lopt", "muon_celo_lopt"):
    lopt = get_learned_optimizer(name, step_mult=0.05, center_residual=center)

    def meta_loss(theta):
      opt = lopt.opt_fn(theta)
      state = jax.lax.fori_loop(0, 5, lambda i, s: opt.update(s, jax.grad(loss)(opt.get_params(s))),
                                opt.init(params))
      return loss(opt.get_params(state))

    grad = jax.grad(meta_loss)(lopt.init(jax.random.key(0)))
    for k in ("log_gain", "shape_power"):
      assert np.all(np.isfinite(np.asarray(grad[k]))) and np.all(np.asarray(grad[k]) != 0), (name, k)
    assert float(jnp.sum(jnp.abs(grad["mlp"]["w1"]))) > 0, name
    b1, w1 = float(jnp.abs(grad["mlp"]["b1"][0])), float(jnp.max(jnp.abs(grad["mlp"]["w1"])))
    # Centred, the bias's gradient is 1 - n * (1/n) per entry: zero up to float32 rounding of the mean.
    assert (b1 < 1e-5 * w1) if center else b1 > 1e-3 * w1, (name, b1, w1)
    assert float(jnp.sum(jnp.abs(grad["mlp"]["w0"]))) == 0.0, name


@pytest.mark.parametrize("kwargs, message", [
    (dict(residual="middle"), r"residual must be one of \('after', 'before', 'none'\), got 'middle'"),
    (dict(schedule_knots=1), "schedule_knots must be 0 .no schedule. or >= 2"),
    (dict(schedule_knots=2.5), "schedule_knots must be"),
    (dict(step_mult=-1.0), "step_mult must be a finite number > 0"),
    (dict(beta=1.0), r"beta must be a finite number in \(0, 1\)"),
    (dict(hidden_sizes=()), "hidden_sizes must be a non-empty sequence of ints"),
    (dict(fan_in_power=float("inf")), "fan_in_power must be a finite number >= 0"),
    (dict(lr_spread=0.5), "lr_spread must be a finite number >= 1"),
    (dict(lr_spread=float("nan")), "lr_spread must be a finite number >= 1"),
    (dict(center_residual="yes"), "center_residual must be True or False, got 'yes'"),
    (dict(conv_kernels="orthogonal"), "conv_kernels must be one of"),
])
def test_bad_arguments_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    MuonResidualLOpt(**kwargs)


def test_optax_update_without_params_is_refused():
  lopt = MuonResidualLOpt()
  tx = lopt.as_optax(lopt.init(jax.random.key(0)))
  p = {"w": jnp.ones((3, 4))}
  with pytest.raises(ValueError, match="needs the current params"):
    tx.update(p, tx.init(p))


# -- lr_spread: meta-training at the learning rates around step_mult ---------------------------------------------
SPREAD = 4.0


def _spread_run(lopt, theta, is_training, key, params, grads):
  opt = lopt.opt_fn(theta, is_training=is_training)
  state = opt.init(params, key=key)
  for g in grads:
    state = opt.update(state, g)
  return state


def test_lr_spread_multiplies_a_trajectory_s_steps_by_its_drawn_factor_and_only_while_training():
  rng = np.random.default_rng(3)
  params = _params(rng)
  grads = _grads(rng, params, 3)
  spread, plain = MuonResidualLOpt(lr_spread=SPREAD), MuonResidualLOpt()
  theta = spread.init(jax.random.key(0))
  theta = {**theta, "mlp": jax.tree.map(lambda w: w + 0.1, theta["mlp"])}  # a nonzero residual too
  key = jax.random.key(5)
  reference = _spread_run(plain, theta, True, key, params, grads)
  # Evaluation (is_training=False) and the optax face never see the spread.
  evaluated = _spread_run(spread, theta, False, key, params, grads)
  jax.tree.map(np.testing.assert_array_equal, evaluated.params, reference.params)
  # The step is scaled by exp(u): on the first update the parameters move exp(u) times as far, and the accumulators
  # (which read the gradients, not the steps) are the same. (Later steps also see the moved parameters through the
  # residual's parameter feature, so only the first is a pure rescaling.)
  reference = _spread_run(plain, theta, True, key, params, grads[:1])
  trained = _spread_run(spread, theta, True, key, params, grads[:1])
  u = float(trained.opt_state["log_lr_scale"])
  assert abs(u) <= np.log(SPREAD) and u != 0.0
  jax.tree.map(np.testing.assert_array_equal, trained.opt_state["accumulators"], reference.opt_state)
  for name in params:
    moved = np.asarray(trained.params[name]) - np.asarray(params[name])
    expected = np.exp(u) * (np.asarray(reference.params[name]) - np.asarray(params[name]))
    np.testing.assert_allclose(moved, expected, rtol=2e-5, atol=1e-6, err_msg=name)  # float32 p - s roundings
  with pytest.raises(ValueError, match="draws its step multiplier from init's key"):
    spread.opt_fn(theta, is_training=True).init(params)


def test_lr_spread_factors_are_log_uniform_over_the_range():
  lopt = MuonResidualLOpt(lr_spread=SPREAD)
  opt = lopt.opt_fn(lopt.init(jax.random.key(0)), is_training=True)
  params = {"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)}
  draws = jax.vmap(lambda k: opt.init(params, key=k).opt_state["log_lr_scale"])(
      jax.random.split(jax.random.key(1), 4000))
  half, n = np.log(SPREAD), 4000
  draws = np.asarray(draws, np.float64)
  assert draws.min() >= -half and draws.max() <= half
  # Uniform on [-h, h]: mean 0 (sd h / sqrt(3 n)), variance h^2 / 3; 5 standard errors.
  assert abs(draws.mean()) < 5 * half / np.sqrt(3 * n)
  assert abs(draws.var() - half ** 2 / 3) < 5 * half ** 2 * np.sqrt(4 / 45 / n)
  assert np.mean(np.abs(draws) > half / 2) == pytest.approx(0.5, abs=5 * np.sqrt(0.25 / n))


def test_truncated_step_meta_trains_with_the_spread_and_the_evaluator_without_it():
  """TruncatedStep calls opt_fn(theta, is_training=True): each lane draws its factor at its trajectory's start, the
  two lanes of an antithetic pair the same one (they draw the same keys); the evaluator's step calls opt_fn(theta)."""
  from metafam.evaluation.family_eval import FamilyEvaluator
  from metafam.inner.schedules import ConstantSchedule
  from metafam.inner.truncated_step import TruncatedStep
  from metafam.taskfamilies.image_mlp import ImageMLPFamily
  family = ImageMLPFamily((4,), image_size=8, batch_size=8)
  lopt = MuonResidualLOpt(lr_spread=SPREAD)
  theta = lopt.init(jax.random.key(0))
  step = TruncatedStep(family, lopt, 8, ConstantSchedule(3), antithetic=True, donate=False)
  scales = np.asarray(step.init_step_state(theta, jax.random.key(1)).opt_state.opt_state["log_lr_scale"])
  assert scales.shape == (8,)
  np.testing.assert_array_equal(scales[0::2], scales[1::2])  # pairs share their factor
  assert len(set(scales[0::2].tolist())) == 4  # pairs differ
  evaluator = FamilyEvaluator(family, num_tasks=2, num_steps=3)
  assert np.all(np.isfinite(evaluator.evaluate(lopt, theta, jax.random.key(2))))  # no key-less init, no spread
  with pytest.raises(ValueError, match="is_training must be a bool"):
    TruncatedStep(family, lopt, 2, is_training=1)


# -- the learned schedule (schedule_knots) and the residual-free rule ------------------------------------------------
def test_schedule_multiplies_each_step_by_its_knots_interpolated_at_the_fraction_done():
  """With ``residual="none"`` the direction reads only the gradients, so a scheduled run's update t is the plain
  run's times exp(s(t / T)) exactly (up to float32 rounding of the product): s interpolated between the knots."""
  rng = np.random.default_rng(11)
  params = _params(rng)
  grads = _grads(rng, params, 4)
  plain, scheduled = MuonResidualLOpt(step_mult=LR, residual="none"), MuonResidualLOpt(
      step_mult=LR, residual="none", schedule_knots=3)
  theta = scheduled.init(jax.random.key(0))
  assert set(theta) == {"log_gain", "shape_power", "log_schedule"}  # no residual MLP
  knots = np.log([2.0, 0.5, 0.25])  # at fractions 0, 0.5, 1
  theta = dict(theta, log_schedule=jnp.asarray(knots, jnp.float32))
  base = optax_updates(plain.as_optax(plain.init(jax.random.key(0))), params, grads)
  ours = optax_updates(scheduled.as_optax(theta, num_steps=4), params, grads)
  # updates 0..3 of 4 are at fractions 0, 0.25, 0.5, 0.75: log multipliers log 2, 0, log 0.5, (log 0.5 + log 0.25) / 2
  expected = np.exp([knots[0], 0.5 * (knots[0] + knots[1]), knots[1], 0.5 * (knots[1] + knots[2])])
  for t in range(4):
    for k in params:
      np.testing.assert_allclose(np.asarray(ours[t][k]), expected[t] * np.asarray(base[t][k]), rtol=2e-6,
                                 atol=1e-7, err_msg=f"{k} {t}")
  # The Optimizer face reads the horizon from init's num_steps and agrees with the optax face.
  opt = scheduled.opt_fn(theta)
  state, p = opt.init(params, num_steps=4), params
  for g, u in zip(grads, ours):
    state, p = opt.update(state, g), optax.apply_updates(p, u)
  for k in params:
    np.testing.assert_allclose(np.asarray(opt.get_params(state)[k]), np.asarray(p[k]), rtol=1e-6, atol=1e-7)
  # Past the horizon the last knot holds.
  assert float(scheduled.log_schedule(theta, jnp.asarray(9), jnp.asarray(4.0))) == pytest.approx(knots[2])


def test_zero_schedule_and_no_residual_are_muon_exactly():
  """At its initial theta the scheduled, residual-free rule is the same program as the plain rule: exp(0) = 1."""
  rng = np.random.default_rng(12)
  params = _params(rng)
  grads = _grads(rng, params, 3)
  plain = MuonResidualLOpt(step_mult=LR)
  lopt = MuonResidualLOpt(step_mult=LR, residual="none", schedule_knots=5)
  ref = optax_updates(plain.as_optax(plain.init(jax.random.key(0))), params, grads)
  ours = optax_updates(lopt.as_optax(lopt.init(jax.random.key(0)), num_steps=100), params, grads)
  for a, b in zip(ours, ref):
    jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.parametrize("horizon", [16, 137, 200, 320, 512, 1000, 2000])
def test_warmup_cosine_is_the_baselines_schedule(horizon):
  """`warmup_cosine` with a traced horizon is the shipped baselines' multiplier (optax's schedule, Python-number
  horizon) at every update of a run and past it, to 2 ulps of 1 (XLA compiles optax's division by a constant
  differently); a wrong warmup length or decay is off by more than 1e-3 at some update."""
  from metafam.benchmark import baselines
  from metafam.optimizers import muon_lopt
  assert muon_lopt.WARMUP_FRACTION == baselines.WARMUP_FRACTION
  counts = jnp.arange(0, 2 * horizon + 1, dtype=jnp.int32)
  ref = np.asarray(jax.jit(lambda c: baselines.unit_schedule(c, 1.0, horizon))(counts))
  ours = np.asarray(jax.jit(muon_lopt.warmup_cosine)(counts, jnp.float32(horizon)))
  np.testing.assert_allclose(ours, ref, rtol=0, atol=2.5e-7)
  assert ours[0] == 0.0 and np.all(ours[horizon:] < 1e-6) and ours.max() == pytest.approx(1.0)


def test_warmup_cosine_base_at_the_initial_theta_is_muon_with_the_baselines_schedule():
  """``base_schedule="warmup_cosine"`` with a zero learned schedule is ``optax.contrib.muon`` at the shipped
  baselines' warmup+cosine rate, update for update (the tolerance of the Muon test above); the knots then multiply
  it exactly as they multiply the constant rule."""
  from metafam.benchmark import baselines
  rng = np.random.default_rng(14)
  params = _params(rng)
  horizon = 20
  grads = _grads(rng, params, horizon)
  lopt = MuonResidualLOpt(step_mult=LR, residual="none", schedule_knots=5, base_schedule="warmup_cosine",
                          learn_fan_exponents=False, conv_kernels="matrix")
  assert lopt.uses_horizon and "warmup+cosine base" in lopt.name
  theta = lopt.init(jax.random.key(0))
  ours = optax_updates(lopt.as_optax(theta, num_steps=horizon), params, grads)
  ref = optax_updates(optax.contrib.muon(lambda c: LR * baselines.unit_schedule(c, 1.0, horizon),
                                      muon_weight_dimension_numbers=muon_dimension_numbers("matrix")), params, grads)
  for step, (a, b) in enumerate(zip(ours, ref)):
    for k in params:
      scale = float(np.max(np.abs(np.asarray(b[k]))))
      np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=1e-4, atol=1e-4 * scale,
                                 err_msg=f"{k} {step}")
  assert all(float(jnp.max(jnp.abs(u))) == 0.0 for u in jax.tree.leaves(ours[0]))  # warmup starts at 0
  # knots on top: the same runs, each update times exp(s(t / T))
  knots = jnp.asarray(np.log([2.0, 1.0, 0.5, 0.5, 0.25]), jnp.float32)
  scaled = optax_updates(lopt.as_optax(dict(theta, log_schedule=knots), num_steps=horizon), params, grads)
  for t in (3, 10, 17):
    factor = np.exp(np.interp(t / horizon, np.linspace(0, 1, 5), np.asarray(knots, np.float64)))
    for k in params:
      np.testing.assert_allclose(np.asarray(scaled[t][k]), factor * np.asarray(ours[t][k]), rtol=2e-6, atol=1e-8)
  with pytest.raises(ValueError, match="base_schedule must be one of"):
    MuonResidualLOpt(base_schedule="cosine")
  with pytest.raises(ValueError, match="pass num_steps="):
    MuonResidualLOpt(base_schedule="warmup_cosine").as_optax(MuonResidualLOpt().init(jax.random.key(0)))


def test_a_schedule_without_the_run_length_is_refused():
  lopt = MuonResidualLOpt(schedule_knots=2)
  theta = lopt.init(jax.random.key(0))
  params = {"w": jnp.ones((3, 4))}
  with pytest.raises(ValueError, match="learned schedule over the fraction of training done: pass num_steps="):
    lopt.as_optax(theta)
  with pytest.raises(ValueError, match="pass num_steps="):
    lopt.opt_fn(theta).init(params)
  with pytest.raises(ValueError, match="num_steps must be"):
    lopt.opt_fn(theta).init(params, num_steps=0)
  assert not MuonResidualLOpt().uses_horizon and lopt.uses_horizon
  MuonResidualLOpt().as_optax(MuonResidualLOpt().init(jax.random.key(0)))  # no schedule: no num_steps needed


def test_truncated_step_tells_each_lane_the_updates_it_will_make():
  """Each lane's optimizer gets its trajectory's length; a lane started at a random offset, the rest of it."""
  from metafam.inner.schedules import LogUniformSchedule
  from metafam.inner.truncated_step import TruncatedStep
  from metafam.taskfamilies.image_mlp import ImageMLPFamily
  family = ImageMLPFamily((4,), image_size=8, batch_size=8)
  lopt = MuonResidualLOpt(residual="none", schedule_knots=3, lr_spread=SPREAD)
  theta = lopt.init(jax.random.key(0))
  for offset in (False, True):
    step = TruncatedStep(family, lopt, 8, LogUniformSchedule(10, 1000), antithetic=True, donate=False,
                         random_initial_iteration=offset)
    lanes = step.init_step_state(theta, jax.random.key(1))
    horizon = np.asarray(lanes.opt_state.opt_state["horizon"])
    np.testing.assert_array_equal(horizon, np.asarray(lanes.length - lanes.iteration, np.float32))
    assert np.all(horizon >= 1) and (np.any(np.asarray(lanes.iteration) > 0) == offset)


def test_full_es_tells_each_particle_its_trajectory_length():
  """FullES trains complete trajectories of ``trajectory_length`` steps, and a schedule over the run reads that
  length (it once read the never-ending schedule's 2**31 - 1, which froze the schedule at its first knot)."""
  from metafam.outer_trainers.registry import make_estimator
  from metafam.inner import pairs
  from metafam.taskfamilies.image_mlp import ImageMLPFamily
  family = ImageMLPFamily((4,), image_size=8, batch_size=8)
  lopt = MuonResidualLOpt(residual="none", schedule_knots=3, base_schedule="warmup_cosine")
  theta = lopt.init(jax.random.key(0))
  est = make_estimator("full_es", family, lopt, num_tasks=2, trajectory_length=7)
  thetas = pairs.antithetic_thetas(theta, est._sample_eps(theta, jax.random.key(1)))
  lanes = est.step.init_fn(thetas, jax.random.key(2), theta_is_batched=True)
  np.testing.assert_array_equal(np.asarray(lanes.opt_state.opt_state["horizon"]), 7.0)
  _, out = est.step.unroll_fn(thetas, lanes, jax.random.split(jax.random.key(3), 7), theta_is_batched=True)
  assert np.all(np.asarray(out.mask) > 0)  # every step of the trajectory counts, the last one included
  e, _ = est.estimate(theta, {}, jax.random.key(4))
  assert np.isfinite(float(e.meta_loss))


@pytest.mark.parametrize("fan_in_power", [0.0, 0.5])
def test_fixed_fan_exponents_are_the_learned_ones_at_init_and_not_meta_parameters(fan_in_power):
  rng = np.random.default_rng(13)
  params = _params(rng)
  grads = _grads(rng, params, 3)
  learned = MuonResidualLOpt(step_mult=LR, residual="none", fan_in_power=fan_in_power, base_fan_in=8)
  fixed = MuonResidualLOpt(step_mult=LR, residual="none", fan_in_power=fan_in_power, base_fan_in=8,
                           learn_fan_exponents=False)
  theta = fixed.init(jax.random.key(0))
  assert set(theta) == {"log_gain"} and "fixed fan exponents" in fixed.name
  ref = optax_updates(learned.as_optax(learned.init(jax.random.key(0))), params, grads)
  ours = optax_updates(fixed.as_optax(theta), params, grads)
  for a, b in zip(ours, ref):
    jax.tree.map(np.testing.assert_array_equal, a, b)
  with pytest.raises(ValueError, match="learn_fan_exponents must be True or False"):
    MuonResidualLOpt(learn_fan_exponents=0)
