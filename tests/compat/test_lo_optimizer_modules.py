"""The compat layer's optimizer modules (alias, nadamw, opt_list, opt_to_optax, gradient_accumulator,
optimizer_wrappers, shampoo) and research.general_lopt (hyper_v2, prefab, pretrained_optimizers), checked against
hand-computed steps and the definitions in their docstrings."""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metafam.compat.learned_optimization.optimizers import (alias, gradient_accumulator, learning_rate_schedules,
                                                            nadamw, opt_list, opt_to_optax, optax_opts,
                                                            optimizer_wrappers, shampoo)
from metafam.compat.learned_optimization.research.general_lopt import hyper_v2, prefab, pretrained_optimizers


def _nadamw_by_hand(p, grads, lr, b1, b2, eps, wd, l2, nesterov=True):
  """NAdamW as defined by the reference, in float64 (lr: a function of the step index)."""
  m = v = np.zeros_like(p)
  for i, g in enumerate(grads):
    g = g - l2 * p
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    t = i + 1
    lr_t = lr(i) * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    d = b1 * m + (1 - b1) * g if nesterov else m
    p = p - lr_t * d / (np.sqrt(v) + eps) - lr_t * wd * p
  return p


@pytest.mark.parametrize("nesterov", [True, False])
def test_nadamw_matches_the_definition(nesterov):
  rng = np.random.default_rng(0)
  p0, grads = rng.standard_normal(4), [rng.standard_normal(4) for _ in range(3)]
  opt = nadamw.NAdamW(learning_rate=0.1, beta1=0.8, beta2=0.95, epsilon=1e-3, adamw_weight_decay=0.5,
                      l2_weight_decay=0.2, use_nesterov=nesterov)
  state = opt.init({"p": jnp.asarray(p0, jnp.float32)}, num_steps=3)
  for g in grads:
    state = opt.update(state, {"p": jnp.asarray(g, jnp.float32)})
  want = _nadamw_by_hand(p0, grads, lambda i: 0.1, 0.8, 0.95, 1e-3, 0.5, 0.2, nesterov)
  np.testing.assert_allclose(opt.get_params(state)["p"], want, rtol=1e-5, atol=1e-6)
  assert isinstance(state, nadamw.NAdamWState) and int(state.iteration) == 3


def test_opt_list_entry_is_nadamw_with_a_cosine_schedule(tmp_path, monkeypatch):
  entries = [dict(learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, adamw_weight_decay=0.0,
                  l2_weight_decay=0.0, min_learning_rate_mult=0.1, constant_fraction=0.0, warmup_fraction=0.0),
             dict(learning_rate=0.05, beta1=0.7, beta2=0.9, epsilon=1e-4, adamw_weight_decay=0.1,
                  l2_weight_decay=0.01, min_learning_rate_mult=0.2, constant_fraction=0.25, warmup_fraction=0.0)]
  path = tmp_path / "opt_list.json"
  path.write_text(json.dumps(entries))
  monkeypatch.setenv(opt_list.ENV_VAR, str(path))
  opt = opt_list.OptList(1)
  rng = np.random.default_rng(1)
  p0, grads = rng.standard_normal(3), [rng.standard_normal(3) for _ in range(4)]
  state = opt.init({"p": jnp.asarray(p0, jnp.float32)}, num_steps=4)
  for g in grads:
    state = opt.update(state, {"p": jnp.asarray(g, jnp.float32)})
  # cosine: constant until 25% of 4 steps, then half a cosine from 0.05 to 0.2 * 0.05 at step 4
  lr = lambda i: 0.01 + 0.04 * (math.cos(max(i - 1.0, 0.0) / 3.0 * math.pi) / 2 + 0.5)  # noqa: E731
  want = _nadamw_by_hand(p0, grads, lr, 0.7, 0.9, 1e-4, 0.1, 0.01)
  np.testing.assert_allclose(opt.get_params(state)["p"], want, rtol=1e-5, atol=1e-6)
  def one_run(idx):  # a traced idx: one program sweeps the list
    o = opt_list.OptList(idx)
    st = o.init({"p": jnp.asarray(p0, jnp.float32)}, num_steps=4)
    for g in grads:
      st = o.update(st, {"p": jnp.asarray(g, jnp.float32)})
    return o.get_params(st)["p"]
  swept = jax.jit(jax.vmap(one_run))(jnp.arange(2))
  np.testing.assert_allclose(swept[1], want, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="needs num_steps"):
    opt.init({"p": jnp.zeros(3)})
  with pytest.raises(ValueError, match=r"idx must lie in \[0, 2\)"):
    opt_list.OptList(2)
  monkeypatch.delenv(opt_list.ENV_VAR)
  with pytest.raises(FileNotFoundError, match="METAFAM_OPT_LIST"):
    opt_list.OptList(0)
  path.write_text(json.dumps([dict(entries[0], learning_rat=1.0)]))
  with pytest.raises(ValueError, match="unknown: \\['learning_rat'\\]"):
    opt_list.OptList(0, path=str(path))


def test_alias_schedules():
  sqrt_decay, exp_decay = alias.AdamSqrtDecayLR(0.1), alias.AdamExpDecayLR(0.1)
  assert isinstance(sqrt_decay, optax_opts.Adam) and isinstance(exp_decay, optax_opts.Adam)
  np.testing.assert_allclose(float(sqrt_decay.learning_rate(500)), 0.05, rtol=1e-6)
  np.testing.assert_allclose(float(sqrt_decay.learning_rate(4000)), 0.1 * math.sqrt(1000 / 4000), rtol=1e-6)
  # float32 rounds 1 - 7e-5 by up to 6e-8 relative, compounded 1000 times: rtol 1e-4
  np.testing.assert_allclose(float(exp_decay.learning_rate(1000)), 0.1 * (1 - 7e-5) ** 1000, rtol=1e-4)


def test_gradient_accumulator_averages_then_steps():
  opt = gradient_accumulator.GradientAccumulator(optax_opts.SGD(0.5), num_average=3)
  state = opt.init({"p": jnp.zeros(2)}, num_steps=9)
  update = jax.jit(opt.update)
  grads = [jnp.asarray([1.0, 2.0]), jnp.asarray([3.0, -2.0]), jnp.asarray([2.0, 3.0]), jnp.asarray([6.0, 0.0])]
  params = []
  for g in grads:
    state = update(state, {"p": g}, loss=jnp.float32(1.0))
    params.append(np.asarray(opt.get_params(state)["p"]))
  np.testing.assert_array_equal(params[0], [0.0, 0.0])
  np.testing.assert_array_equal(params[1], [0.0, 0.0])
  np.testing.assert_allclose(params[2], -0.5 * np.asarray([2.0, 1.0]))  # mean of three gradients
  np.testing.assert_allclose(params[3], params[2])  # accumulating again
  np.testing.assert_allclose(np.asarray(state.grad_accum["p"]), [6.0, 0.0])
  with pytest.raises(ValueError, match="num_average must be an int >= 1"):
    gradient_accumulator.GradientAccumulator(optax_opts.SGD(0.5), num_average=0)


def test_weight_decay_and_extend_time_wrappers():
  opt = optimizer_wrappers.WeightDecayWrapper(optax_opts.SGD(0.1), weight_decay=0.5)
  state = opt.update(opt.init({"p": jnp.asarray([2.0, -4.0])}), {"p": jnp.asarray([1.0, 1.0])}, loss=0.0)
  np.testing.assert_allclose(opt.get_params(state)["p"], [2.0 - 0.1 * 2.0, -4.0 - 0.1 * (1.0 - 2.0)])
  seen = []
  sched = learning_rate_schedules.PiecewiseLinear([0, 100], [0.0, 1.0])  # lr = step / 100
  inner = nadamw.NAdamW(learning_rate=lambda step, num_steps: seen.append(num_steps) or sched(step))
  warped = optimizer_wrappers.ExtendTimeWrapper(inner, lambda t: 10 * t)
  state = warped.init({"p": jnp.ones(1)}, num_steps=5)
  state = warped.update(warped.update(state, {"p": jnp.ones(1)}), {"p": jnp.ones(1)})
  assert int(state.iteration) == 2 and int(state.inner_opt_state.iteration) == 11  # warped to 10, then + 1
  assert int(seen[0]) == 50  # the inner optimizer was told 10x the steps


def test_opt_to_optax_equals_the_optimizer():
  opt = nadamw.NAdamW(learning_rate=learning_rate_schedules.CosineLearningRateSchedule(0.1, warmup_fraction=0.0))
  tx = opt_to_optax.opt_to_optax_opt(opt, num_steps=10)
  params = {"p": jnp.asarray([1.0, -1.0])}
  state, ostate, p = opt.init(params, num_steps=10), tx.init(params), params
  for g in ([0.5, 1.0], [-0.2, 0.3]):
    state = opt.update(state, {"p": jnp.asarray(g)})
    updates, ostate = tx.update({"p": jnp.asarray(g)}, ostate, p)
    p = optax.apply_updates(p, updates)
  np.testing.assert_allclose(p["p"], opt.get_params(state)["p"], rtol=1e-6)


def test_shampoo_says_it_is_not_implemented():
  assert shampoo.GraftingType.SGD == 1
  with pytest.raises(NotImplementedError, match="Shampoo .* not available"):
    shampoo.Shampoo(0.1, block_size=128)


def _small_lopt():
  return hyper_v2.HyperV2(lstm_hidden_size=4, param_inits=2)


def test_pretrained_weights_are_read_locally_and_missing_ones_say_where(tmp_path, monkeypatch):
  pytest.importorskip("msgpack")
  from metafam.compat.learned_optimization import checkpoints
  name = "aug12_continue_on_bigger_2xbs_200kstep_bigproblem_v2_5620"
  monkeypatch.delenv(pretrained_optimizers.ENV_VAR, raising=False)
  with pytest.raises(FileNotFoundError, match=f"METAFAM_VELO_WEIGHTS is not set.*{name}/params"):
    getattr(pretrained_optimizers, name)()
  lopt = _small_lopt()
  theta = jax.tree.map(lambda x: x + 0.1, lopt.init(jax.random.key(0)))
  os.makedirs(tmp_path / name)
  checkpoints.save_state(str(tmp_path / name / "params"),
                         checkpoints.ParameterCheckpoint(theta, "gen", 1), format="flax")  # LO's format
  monkeypatch.setenv(pretrained_optimizers.ENV_VAR, str(tmp_path))
  with pytest.raises(Exception, match=r"entry /ff_mod_stack/~/b0 has shape \(2, 4\), the template \(256, 4\)"):
    getattr(pretrained_optimizers, name)()  # VeLO's size does not fit a small file
  opt = getattr(pretrained_optimizers, name)(lopt=lopt)
  for got, want in zip(jax.tree.leaves(opt.opt.theta), jax.tree.leaves(theta)):
    np.testing.assert_array_equal(got, want)
  assert len(pretrained_optimizers.opt_names) == 77 and "sep14_aug20run_prior0" in dir(pretrained_optimizers)

  # prefab: VeLO as an optax transformation, with gradient accumulation past max_training_steps and weight decay
  tx = prefab.optax_lopt(20, weight_decay=1e-3, max_training_steps=10, base_lopt_fn=lambda: opt)
  params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
  ostate, update = tx.init(params), jax.jit(tx.update)
  grads = jax.tree.map(jnp.ones_like, params)
  updates, ostate = update(grads, ostate, params, loss=jnp.float32(1.0))
  assert all(float(jnp.max(jnp.abs(u))) == 0 for u in jax.tree.leaves(updates))  # accumulating (2 per step)
  updates, ostate = update(grads, ostate, params, loss=jnp.float32(1.0))
  assert all(float(jnp.max(jnp.abs(u))) > 0 for u in jax.tree.leaves(updates))
  with pytest.raises(ValueError, match="must match the constructor"):
    prefab.LearnedOptimizer(20, base_lopt_fn=lambda: opt).init(params, num_steps=30)


def test_compat_hyper_v2_rejects_unsupported_ablations():
  with pytest.raises(NotImplementedError, match="with_p=False has no counterpart"):
    hyper_v2.HyperV2(with_p=False)
  assert hyper_v2.factored_dims((3, 7, 5)) == (2, 1) and hyper_v2.factored_dims((4,)) is None
  buf = hyper_v2.BufferLossAccumulators()
  assert buf.features(buf.update(buf.init(10), 1.0)).shape == (9,)
