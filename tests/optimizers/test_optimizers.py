"""Optimizers match hand computations and work under jit and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metafam.optimizers.base import SGD, SGDM, Adam, OptaxOptimizer

PARAMS = {"a": jnp.array([1.0, -2.0]), "b": jnp.array(0.5)}
G1 = {"a": jnp.array([0.5, 1.0]), "b": jnp.array(-2.0)}
G2 = {"a": jnp.array([-1.0, 0.25]), "b": jnp.array(1.0)}


def _close(tree, expected):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), tree, expected)


def test_sgd_two_steps_by_hand():
  opt = SGD(0.1)
  s = opt.update(opt.update(opt.init(PARAMS), G1), G2)
  _close(opt.get_params(s), {"a": [1.0 - 0.1 * (0.5 - 1.0), -2.0 - 0.1 * (1.0 + 0.25)], "b": 0.5 - 0.1 * (-1.0)})
  assert int(s.iteration) == 2


def test_sgdm_two_steps_by_hand():
  opt = SGDM(0.1, momentum=0.9)
  s = opt.update(opt.update(opt.init(PARAMS), G1), G2)
  m1 = jax.tree.map(lambda g: g, G1)
  m2 = jax.tree.map(lambda m, g: 0.9 * m + g, m1, G2)
  _close(opt.get_params(s), jax.tree.map(lambda p, a, b: p - 0.1 * a - 0.1 * b, PARAMS, m1, m2))


def test_adam_two_steps_by_hand():
  lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-8
  opt = Adam(lr, b1, b2, eps)
  s = opt.update(opt.update(opt.init(PARAMS), G1, loss=1.0), G2, loss=0.5)
  p = {k: np.asarray(v, np.float64) for k, v in PARAMS.items()}
  m = {k: 0.0 for k in p}
  v = {k: 0.0 for k in p}
  for t, g in enumerate([G1, G2], start=1):
    for k in p:
      gk = np.asarray(g[k], np.float64)
      m[k] = b1 * m[k] + (1 - b1) * gk
      v[k] = b2 * v[k] + (1 - b2) * gk ** 2
      p[k] = p[k] - lr * (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
  _close(opt.get_params(s), p)
  assert Adam().learning_rate == 1e-3  # a default learning rate, as in learned_optimization


def test_model_state_is_carried_and_replaced():
  opt = SGD(0.1)
  s = opt.init(PARAMS, model_state={"count": jnp.asarray(0)})
  assert int(opt.get_state(s)["count"]) == 0
  s = opt.update(s, G1)  # no new model state: keep the old one
  assert int(opt.get_state(s)["count"]) == 0
  s = opt.update(s, G1, model_state={"count": jnp.asarray(5)})
  assert int(opt.get_state(s)["count"]) == 5


def test_jit_and_vmap():
  opt = Adam(0.05)
  stacked = jax.tree.map(lambda x: jnp.stack([x, 2 * x, -x]), PARAMS)
  states = jax.vmap(opt.init)(stacked)
  grads = jax.tree.map(lambda x: jnp.stack([x, x, x]), G1)
  states = jax.jit(jax.vmap(opt.update))(states, grads)
  for i, scale in enumerate([1.0, 2.0, -1.0]):
    single = opt.update(opt.init(jax.tree.map(lambda x: scale * x, PARAMS)), G1)
    _close(jax.tree.map(lambda x: x[i], opt.get_params(states)), opt.get_params(single))
  assert states.iteration.tolist() == [1, 1, 1]


def test_any_optax_transformation_and_bad_input():
  opt = OptaxOptimizer(optax.chain(optax.clip(0.1), optax.sgd(1.0)), name="clipped")
  s = opt.update(opt.init(PARAMS), G1)
  _close(opt.get_params(s), {"a": [0.9, -2.1], "b": 0.6})
  assert opt.name == "clipped"
  with pytest.raises(TypeError, match="optax.GradientTransformation"):
    OptaxOptimizer(lambda g: g)
  with pytest.raises(ValueError, match=r"grad leaf \['a'\] has shape \(3,\).*\(2,\)"):
    opt.update(opt.init(PARAMS), {"a": jnp.zeros(3), "b": jnp.zeros(())})
  with pytest.raises(ValueError, match="grad structure"):
    opt.update(opt.init(PARAMS), {"a": jnp.zeros(2)})
