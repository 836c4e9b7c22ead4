"""`learned_optimizers.common` (LO's accumulators) and the small learned-optimizer helpers, against their
definitions computed by hand in numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.compat.learned_optimization.learned_optimizers import adafac_mlp_lopt
from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.learned_optimizers import common
from metafam.compat.learned_optimization.optimizers import optax_opts

RTOL = 1e-5  # float32 recurrences of a few steps: relative error ~1e-7 per op


def _grads(n, shape, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=shape).astype(np.float32) for _ in range(n)]


def test_vec_rolling_mom_and_rms_are_exponential_averages_per_decay():
  decays = np.asarray([0.5, 0.9], np.float32)
  grads = _grads(4, (3,))
  mom, rms = common.vec_rolling_mom(decays), common.vec_rolling_rms(decays)
  m_state, r_state = mom.init({"w": jnp.zeros(3)}), rms.init({"w": jnp.zeros(3)})
  assert m_state.m["w"].shape == (3, 2) and int(m_state.t[0]) == 0  # decay axis last
  for g in grads:
    m_state, r_state = mom.update(m_state, {"w": g}), rms.update(r_state, {"w": g})
  for k, b in enumerate(decays):
    m, v = np.zeros(3), np.zeros(3)
    for g in grads:
      m, v = b * m + (1 - b) * g, b * v + (1 - b) * g ** 2
    np.testing.assert_allclose(m_state.m["w"][:, k], m, rtol=RTOL)
    np.testing.assert_allclose(r_state.rms["w"][:, k], v, rtol=RTOL)
  np.testing.assert_array_equal(m_state.t, [4, 4])


def test_rolling_rms_clips_the_decay_to_the_unit_interval():
  rms = common.rolling_rms(1.5)  # clipped to 1: the average never moves
  state = rms.update(rms.init(jnp.ones(2)), jnp.full(2, 7.0))
  np.testing.assert_allclose(state.rms, 0.0)


def test_factored_dims_picks_the_two_largest():
  assert common.factored_dims((5,)) is None
  assert common.factored_dims((3, 7)) == (0, 1)
  assert common.factored_dims((7, 2, 3)) == (2, 0)


def test_factored_rolling_matches_adafactor_by_hand():
  b, eps = 0.8, 1e-30
  acc = common.factored_rolling(b, epsilon=eps)
  grads = _grads(3, (4, 6), seed=1)
  vec_grads = _grads(3, (5,), seed=2)
  state = acc.init({"m": jnp.zeros((4, 6)), "v": jnp.zeros(5)})
  assert state.v_row["m"].shape == (4,) and state.v_col["m"].shape == (6,) and state.v_diag["m"].shape == (0,)
  assert state.v_diag["v"].shape == (5,) and state.v_row["v"].shape == (0,)
  row, col, diag = np.zeros(4), np.zeros(6), np.zeros(5)
  for g, gv in zip(grads, vec_grads):
    state, out = acc.update(state, {"m": g, "v": gv})
    g2 = g.astype(np.float64) ** 2 + eps
    row = b * row + (1 - b) * g2.mean(axis=1)  # factored dims (0, 1): d0 = 1 is reduced for the row statistic
    col = b * col + (1 - b) * g2.mean(axis=0)
    diag = b * diag + (1 - b) * (gv.astype(np.float64) ** 2 + eps)
  np.testing.assert_allclose(state.v_row["m"], row, rtol=RTOL)
  np.testing.assert_allclose(state.v_col["m"], col, rtol=RTOL)
  expected = g / np.sqrt(row / (row.mean() + 1e-9))[:, None] / np.sqrt(col)[None, :]
  np.testing.assert_allclose(out["m"], expected, rtol=1e-4)
  np.testing.assert_allclose(out["v"], gv / np.sqrt(diag + 1e-9), rtol=1e-4)


def test_vec_factored_rolling_equals_each_decay_alone():
  decays = jnp.asarray([0.3, 0.95])
  g = {"m": jnp.asarray(_grads(1, (3, 2))[0])}
  vec = common.vec_factored_rolling(decays)
  state, out = vec.update(vec.init(g), g)
  for k, b in enumerate([0.3, 0.95]):
    one = common.factored_rolling(b)
    s1, o1 = one.update(one.init(g), g)
    np.testing.assert_allclose(state.v_row["m"][..., k], s1.v_row["m"], rtol=RTOL)
    np.testing.assert_allclose(out["m"][..., k], o1["m"], rtol=RTOL)


def test_safe_rsqrt_floors_its_input():
  np.testing.assert_allclose(common.safe_rsqrt(jnp.asarray([4.0, 0.0, -1.0])), [0.5, 1e-9 ** -0.5, 1e-9 ** -0.5],
                             rtol=1e-5)
  with pytest.raises(ValueError, match="decays"):
    common.vec_rolling_mom(jnp.ones((2, 2)))


def test_feature_helpers_match_their_definitions():
  x = jnp.asarray([[3.0, 4.0]])
  np.testing.assert_allclose(adafac_mlp_lopt.second_moment_normalizer(x, axis=1, eps=0.0), x / np.sqrt(12.5),
                             rtol=1e-6)
  emb = adafac_mlp_lopt.tanh_embedding(jnp.asarray(30.0))
  assert emb.shape == (11,)
  np.testing.assert_allclose(emb[3], np.tanh(30.0 / 30 - 1.0), atol=1e-7)
  d = jnp.asarray([0.5, 0.99])
  np.testing.assert_allclose(adafac_mlp_lopt.param_to_decay(adafac_mlp_lopt.decay_to_param(d)), d, rtol=1e-6)
  np.testing.assert_allclose(lopt_base.one_minus_log.inverse(lopt_base.one_minus_log.forward(d)), d, rtol=1e-6)


def test_sum_optimizer_adds_the_two_steps():
  lr_a, lr_b = 0.1, 0.01
  opt = lopt_base.SumOptimizer([optax_opts.SGD(lr_a), optax_opts.SGD(lr_b)])
  params = {"w": jnp.asarray([1.0, 2.0])}
  state = opt.init(params)
  grad = {"w": jnp.asarray([0.5, -1.0])}
  state = opt.update(state, grad, loss=jnp.asarray(0.0))
  state = opt.update(state, grad, loss=jnp.asarray(0.0))  # the inner optimizers follow the summed params
  np.testing.assert_allclose(opt.get_params(state)["w"], params["w"] - 2 * (lr_a + lr_b) * grad["w"], rtol=1e-6)
  lopt = lopt_base.SumLearnedOptimizer([lopt_base.LearnableSGD(0.1), lopt_base.LearnableSGD(0.01)])
  theta = lopt.init(jax.random.PRNGKey(0))
  assert sorted(theta) == ["inner_lopt_theta_0", "inner_lopt_theta_1"]
  s = lopt.opt_fn(theta).init(params)
  s = lopt.opt_fn(theta).update(s, grad, loss=jnp.asarray(0.0))
  np.testing.assert_allclose(s.params["w"], params["w"] - 0.11 * grad["w"], rtol=1e-5)
  with pytest.raises(ValueError, match="exactly 2"):
    lopt_base.SumOptimizer([optax_opts.SGD(0.1)])


def test_wrap_learned_opt_wraps_every_optimizer():
  wrapped = lopt_base.wrap_learned_opt(lopt_base.LearnableSGD(0.1), lambda opt: ("wrapped", opt))
  tag, _ = wrapped.opt_fn(wrapped.init(jax.random.PRNGKey(0)))
  assert tag == "wrapped"
