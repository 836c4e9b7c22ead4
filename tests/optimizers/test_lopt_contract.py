"""The one learned-optimizer contract (issue 63): golden numbers and conformance of every registered optimizer.

Goldens (tests/lopt_goldens.py, recorded on e012da3 before the refactor): every registered learned optimizer, every
shipped pretrained optimizer and the compat layer's learned optimizers give bit for bit the recorded params through
``opt_fn(theta)`` (also with ``is_training=True``), and the recorded optax updates. The optax faces of the
optimizers that had none of their own (``lopt_goldens.FORMERLY_ADAPTED``: the reverse adapter's updates were
``(p - step) - p``, now they are ``-step``) agree with the recorded ones on the first update through that identity.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt_goldens as G
from production_run import run_production
from metafam.optimizers import contract
from metafam.optimizers.base import OptimizerState
from metafam.optimizers.registry import LEARNED_OPTIMIZERS


def test_goldens_are_small_and_cover_every_case():
  goldens = np.load(G.GOLDENS)
  assert os.path.getsize(G.GOLDENS) < 200_000
  names = {case for case, _, _ in G.cases()}
  assert {f"registry/{n}" for n in LEARNED_OPTIMIZERS} <= names
  assert {"pretrained/generalist_v1", "pretrained/generalist_v2"} <= names
  for name in names:
    assert f"{name}/params" in goldens.files and f"{name}/training" in goldens.files


@pytest.mark.slow  # about 3 minutes: every optimizer compiled as in production (the conformance below is quick)
def test_bit_identical_to_the_goldens():
  """In a child process with JAX's default config and production XLA flags (the goldens' conditions)."""
  run_production("lopt_goldens.py", "--check", timeout=1200)


# -- conformance over every registry entry, through the contract --------------------------------------------------
REGISTRY = sorted(LEARNED_OPTIMIZERS)


def _setup(name):
  lopt = LEARNED_OPTIMIZERS[name]()
  theta = lopt.init(jax.random.key(0))
  params = jax.tree.map(jnp.asarray, G.PARAMS)
  return lopt, theta, params, jax.tree.map(jnp.asarray, G.grads(0))


@pytest.mark.parametrize("name", REGISTRY)
def test_contract_shapes_dtypes_and_faces_agree(name):
  lopt, theta, params, grads = _setup(name)
  opt = lopt.opt_fn(theta)
  assert isinstance(opt, contract.ThetaOptimizer)
  tx = lopt.as_optax(theta, num_steps=G.HORIZON)
  state, ostate = opt.init(params, num_steps=G.HORIZON), tx.init(params)
  assert isinstance(state, OptimizerState) and isinstance(ostate, contract.LearnedOptState)
  assert state.iteration.dtype == jnp.int32 and ostate.count.dtype == jnp.int32
  p = params
  for step in range(2):  # eager: no fusion, so p - step and p + (-step) round alike
    g = jax.tree.map(jnp.asarray, G.grads(step))
    new = opt.update(state, g, loss=G.loss(step))
    updates, new_ostate = tx.update(g, ostate, p, loss=G.loss(step))
    jax.tree.map(lambda a, b: (a.shape, a.dtype) == (b.shape, b.dtype) or pytest.fail(name), updates, p)
    jax.tree.map(lambda a, b: (a.shape, a.dtype) == (b.shape, b.dtype) or pytest.fail(name), new, state)
    p = optax.apply_updates(p, updates)
    jax.tree.map(np.testing.assert_array_equal, opt.get_params(new), p)
    jax.tree.map(np.testing.assert_array_equal, new_ostate.accumulators, new.opt_state["accumulators"]
                 if opt.packed else new.opt_state)
    assert int(new.iteration) == int(new_ostate.count) == step + 1
    state, ostate = new, new_ostate


@pytest.mark.parametrize("name", REGISTRY)
def test_contract_jits_and_vmaps_over_theta(name):
  lopt, theta, params, grads = _setup(name)
  thetas = jax.tree.map(lambda *xs: jnp.stack(xs), theta, lopt.init(jax.random.key(1)))

  def one(th):
    tx = lopt.as_optax(th, num_steps=G.HORIZON)
    updates, state = tx.update(grads, tx.init(params), params, loss=jnp.float32(1.0))
    return updates, state

  batched, _ = jax.jit(jax.vmap(one))(thetas)
  single, _ = jax.jit(one)(theta)
  jax.tree.map(lambda b, s: np.testing.assert_allclose(b[0], s, rtol=1e-4, atol=1e-6), batched, single)
  jax.tree.map(lambda b, p: b.shape == (2,) + p.shape or pytest.fail(name), batched, params)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(batched))


def test_optax_update_needs_params_and_empty_params_work():
  lopt = LEARNED_OPTIMIZERS["rnn_mlp_lopt"]()
  tx = lopt.as_optax(lopt.init(jax.random.key(0)))
  state = tx.init({"w": jnp.ones(3)})
  with pytest.raises(ValueError, match="needs the current params"):
    tx.update({"w": jnp.ones(3)}, state)
  opt = lopt.opt_fn(lopt.init(jax.random.key(0)))
  empty = opt.update(opt.init({}), {})
  assert int(empty.iteration) == 1 and empty.params == {}
