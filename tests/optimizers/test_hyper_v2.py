"""`HyperV2` (VeLO's architecture) against what can be derived by hand: theta's layout at VeLO's size, closed forms
for constant theta, the dependence of the step on each per-element feature, the loss features. Parity with the
reference's own code is `tools/hyperv2_parity.py` (it needs a checkout of learned_optimization); the registry entry
runs the zoo's conformance suite (tests/optimizers/test_lopt_zoo.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.optimizers import num_meta_params
from metafam.optimizers.hyper_v2 import (HyperV2, TIME_FRACTIONS, _shared_features, _tensor_features,
                                         loss_buffer_features, loss_buffer_init, loss_buffer_update)

WIDTHS = (1, 1, 1, 3, 1, 3, 1, 3, 1, 3, 3, 3, 3, 3)  # the 14 per-element input groups at the default decays


def test_velo_sized_theta_has_the_reference_layout():
  lopt = HyperV2(lstm_hidden_size=512, param_inits=256, use_bugged_loss_features=False)
  theta = jax.eval_shape(lopt.init, jax.random.key(0))
  shapes = jax.tree.map(lambda x: x.shape, theta)
  rnn = {name: {"w": w, "b": (w[1],)} for name, w in (("linear", (30, 512)), ("linear_1", (30, 512)),
                                                       ("linear_2", (30, 512)), ("rnn/linear", (1024, 2048)),
                                                       ("rnn_to_controls", (512, 256)), ("step_size", (512, 1)))}
  bank = {f"w0__{i}": (256, w, 4) for i, w in enumerate(WIDTHS)}
  bank.update({"b0": (256, 4), "w1": (256, 4, 4), "b1": (256, 4), "w2": (256, 4, 3), "b2": (256, 3)})
  assert shapes == {"lstm_init_state": {"hidden": (1, 512), "cell": (1, 512)}, "rnn_params": rnn,
                    "ff_mod_stack": {"~": bank}}
  assert num_meta_params(theta) == 2_320_385 and lopt.num_lstm_inputs == 30 and sum(lopt.input_widths) == 30


def _constant_theta(lopt, control, step_size, b0=None, out=(0.0, 0.0, 0.0), pathway=None):
  """theta with zero weights except: controls ``control`` and step multiplier ``step_size`` (biases), every bank
  member equal, and optionally the two-unit pathway carrying input column ``pathway`` to the direction."""
  theta = jax.tree.map(jnp.zeros_like, lopt.init(jax.random.key(0)))
  theta["rnn_params"]["rnn_to_controls"]["b"] = jnp.full((lopt.param_inits,), control)
  theta["rnn_params"]["step_size"]["b"] = jnp.full((1,), step_size)
  bank = theta["ff_mod_stack"]["~"]
  bank["b2"] = jnp.broadcast_to(jnp.asarray(out, jnp.float32), bank["b2"].shape)
  if pathway is not None:
    group = int(np.searchsorted(np.cumsum(lopt.input_widths), pathway, side="right"))
    column = pathway - int(np.sum(lopt.input_widths[:group]))
    bank[f"w0__{group}"] = bank[f"w0__{group}"].at[:, column, 0].set(1.0).at[:, column, 1].set(-1.0)
    bank["w1"] = bank["w1"].at[:, 0, 0].set(1.0).at[:, 1, 1].set(1.0)
    bank["w2"] = bank["w2"].at[:, 0, 0].set(1.0).at[:, 1, 0].set(-1.0)
  return theta


PARAMS = {"m": jnp.asarray(np.random.default_rng(0).standard_normal((5, 3)), jnp.float32),
          "s": jnp.asarray(-0.7, jnp.float32), "z": jnp.zeros((3,), jnp.float32)}  # factored, scalar, all-zero


@pytest.mark.parametrize("param_scale_mult", [True, False])
def test_constant_theta_steps_have_a_closed_form(param_scale_mult):
  """Zero weights: the mixed MLP outputs ``100 * c * b2`` (every bank member equal), so each tensor moves by
  ``s * 100 c d * rms(p) * exp(exp_mult * 100 c m) * step_mult`` whatever the gradients."""
  lopt = HyperV2(lstm_hidden_size=4, param_inits=3, param_scale_mult=param_scale_mult)
  c, s, d, m = 0.02, 1.5, 0.8, -30.0
  opt = lopt.opt_fn(_constant_theta(lopt, c, s, out=(d, m, 5.0)))
  state, update = opt.init(PARAMS, num_steps=10), jax.jit(opt.update)
  params = {k: np.asarray(v, np.float64) for k, v in PARAMS.items()}
  rng = np.random.default_rng(2)
  for _ in range(2):
    grad = {k: jnp.asarray(rng.standard_normal(np.shape(v)), jnp.float32) for k, v in PARAMS.items()}
    state = update(state, grad, loss=jnp.float32(rng.uniform()))
    for k, p in params.items():
      scale = np.sqrt(np.mean(p ** 2) + 1e-9) if param_scale_mult else 1.0
      params[k] = p - s * (100 * c * d) * scale * np.exp(1e-3 * 100 * c * m) * 1e-3
      np.testing.assert_allclose(state.params[k], params[k], rtol=1e-6, atol=1e-9)


def _first_step_features(g, p):
  """The 30 per-element inputs after one update from the zero state (decays 0.9/0.99/0.999, rms 0.999), for a
  tensor of rank <= 1 (not factored); each ``[n]``, in the input order."""
  b = np.asarray([0.9, 0.99, 0.999])
  m = (1 - b) * g[:, None]
  rms = (1 - 0.999) * g[:, None] ** 2
  rsqrt = 1 / np.sqrt(rms + 1e-6)
  v = (1 - b) * (g[:, None] ** 2 + 1e-30)
  fac_g = g[:, None] / np.sqrt(np.maximum(v + 1e-9, 1e-9))
  cols = [g[:, None], np.clip(g, -0.1, 0.1)[:, None], p[:, None], m, rms, m * rsqrt, rsqrt, fac_g, g[:, None] * rsqrt,
          v, v, 1 / np.sqrt(v + 1e-8), 1 / np.sqrt(v + 1e-8), m / np.sqrt(v)]
  return np.concatenate(cols, axis=1).T


@pytest.fixture(scope="module")
def first_step():
  """``(lopt, jitted f(theta, p, g) -> params after one update)``: one program for every column's theta."""
  lopt = HyperV2(lstm_hidden_size=4, param_inits=2)

  @jax.jit
  def run(theta, p, g):
    opt = lopt.opt_fn(theta)
    return opt.update(opt.init({"v": p}, num_steps=10), {"v": g}, loss=1.0).params["v"]

  return lopt, run


@pytest.mark.parametrize("column", range(30))
def test_the_step_follows_each_per_element_feature(first_step, column):
  """A pathway from input ``column`` to the direction: the step is that feature normalized over the tensor,
  ``f / sqrt(mean(f^2) + 1e-5)``, times ``rms(p) * step_mult``."""
  lopt, run = first_step
  theta = _constant_theta(lopt, 0.01, 1.0, pathway=column)  # 100 * mean_k(0.01 * bank_k) = bank
  g = np.asarray([0.05, -0.3, 2.0, -1e-3, 0.0, 0.7])
  p = np.asarray([1.0, -2.0, 0.5, 0.25, 3.0, -1.0])
  new_p = run(theta, jnp.asarray(p, jnp.float32), jnp.asarray(g, jnp.float32))
  f = _first_step_features(g, p)[column]
  x = f / np.sqrt(np.mean(f ** 2) + 1e-5)  # the direction: relu(x) - relu(-x) = x
  step = x * np.sqrt(np.mean(p ** 2) + 1e-9) * 1e-3
  # Steps are ~1e-3 of |p| <= 3: float32 rounding of p - step is <= 1.2e-7 (half an ulp at 2-4) per operation.
  np.testing.assert_allclose(p - np.asarray(new_p, np.float64), step, rtol=1e-4, atol=3e-7)


def test_tensor_features_time_rank_and_moment_statistics():
  lopt = HyperV2(lstm_hidden_size=4, param_inits=2)
  p = jnp.full((4, 1, 3), 2.0)  # rank 2 (axes longer than 1), rms(p) = 2
  m = jnp.stack([jnp.zeros((4, 1, 3)), jnp.ones((4, 1, 3)), jnp.arange(12.0).reshape(4, 1, 3)], -1)
  rms = jnp.full((4, 1, 3, 1), 0.5)
  loss_feats = jnp.linspace(-1, 1, 9)
  x = np.asarray(_tensor_features(lopt, p, m, rms, _shared_features(lopt, jnp.float32(0.25), loss_feats)))
  clip_log = lambda v: np.clip(np.log(1e-8 + np.abs(10 * v)), -5, 5) / 2  # noqa: E731
  var_m = np.var(np.arange(12.0) / 2)  # m scaled by 1 / rms(p)
  spread = (0.25 - np.asarray([0.0, 0.5, np.mean(np.arange(12.0) / 2)])) ** 2  # v around the momenta's means
  want = np.concatenate([np.tanh((0.25 - np.asarray(TIME_FRACTIONS)) * 10), np.linspace(-1, 1, 9),
                         clip_log(np.asarray([0.25])), [0, 0, 1, 0, 0], clip_log(np.asarray([0, 0, var_m])),
                         clip_log(np.asarray(spread))])
  np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6)


def _loss_features_by_definition(losses, num_steps):
  """The module docstring's loss features, in float64: running means at 10 half-lives log-spaced over
  [10, num_steps], each loss first capped at twice the largest bias-corrected mean; features compare each of the 9
  shorter-lived means with the running minimum and the next longer mean."""
  d = np.exp(-1 / np.logspace(1, np.log10(num_steps), 10))
  means, low, out = np.zeros(10), np.full(10, 1e12), []
  for t, loss in enumerate(losses):
    if t > 0:
      loss = min(2 * abs(np.max(means / (1 - d ** (t + 1)))), loss)
    means = means * d + loss * (1 - d)
    corrected = means / (1 - d ** (t + 1))
    low = np.minimum(low, corrected)
    feat = np.clip((corrected[:-1] - low[:-1]) / np.maximum(1e-8, corrected[1:] - low[:-1]) - 1, -1, 1)
    out.append(feat * 0 if t + 1 <= 2 else feat)
  return np.asarray(out)


def test_loss_features_follow_their_definition():
  losses = [5.0, 50.0, 4.0, 3.5, 3.0, 3.2, 2.0, 1.0]  # a spike (capped), a fall, a bump
  buf, got = loss_buffer_init(200), []
  for loss in losses:
    buf = loss_buffer_update(buf, jnp.float32(loss))
    got.append(np.asarray(loss_buffer_features(buf)))
  np.testing.assert_allclose(np.asarray(got), _loss_features_by_definition(losses, 200), rtol=1e-4, atol=1e-5)


def test_no_loss_and_no_num_steps_use_the_documented_defaults():
  lopt = HyperV2(lstm_hidden_size=4, param_inits=2, default_num_steps=40)
  opt = lopt.opt_fn(lopt.init(jax.random.key(0)))
  state = opt.init({"v": jnp.ones(3)})
  assert int(state.opt_state["num_steps"]) == 40
  a, b = jax.jit(lambda st: (opt.update(st, {"v": jnp.ones(3)}), opt.update(st, {"v": jnp.ones(3)}, loss=1.0)))(
      state)
  np.testing.assert_array_equal(a.params["v"], b.params["v"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(lstm_hidden_size=0), r"lstm_hidden_size must be an int >= 1 \(not a bool\), got 0"),
    (dict(initial_rms_decays=(0.9, 0.99)), "initial_rms_decays must have 1 or 3 entries"),
    (dict(initial_adafactor_decays=(0.9,)), "initial_adafactor_decays 3"),
    (dict(initial_momentum_decays=(0.9, 1.0, 0.5)),
     r"initial_momentum_decays\[1\] must be a finite number in \(0, 1\)"),
    (dict(step_mult=float("nan")), "step_mult must be a finite number > 0"),
    (dict(ff_hidden_size=1, descent_init=True), "ff_hidden_size must be an int >= 2"),
])
def test_bad_arguments_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    HyperV2(**kwargs)


def test_an_eager_update_does_not_keep_the_optimizer_alive():
  """The shared update program is keyed by the instance's identity, held weakly (metafam._identity): once the caller
  drops the optimizer, jit's cache does not keep it (and its theta) alive."""
  import gc
  import weakref
  lopt = HyperV2(lstm_hidden_size=4, param_inits=2)
  opt = lopt.opt_fn(lopt.init(jax.random.key(0)))
  state = opt.update(opt.init({"v": jnp.ones(3)}), {"v": jnp.full(3, 0.5)}, loss=1.0)
  again = opt.update(opt.init({"v": jnp.ones(3)}), {"v": jnp.full(3, 0.5)}, loss=1.0)  # the same program
  np.testing.assert_array_equal(state.params["v"], again.params["v"])
  assert not np.array_equal(np.asarray(state.params["v"]), np.ones(3))
  alive = weakref.ref(lopt)
  del lopt, opt, state, again
  gc.collect()
  assert alive() is None
