"""Test helpers shared by the optimizer tests: run an optax transformation over a gradient sequence, compare trees."""

import jax
import numpy as np
import optax


def _apply_in_turn(tx, params, grads):
  state, updates = tx.init(params), []
  for g in grads:
    u, state = tx.update(g, state, params)
    params = optax.apply_updates(params, u)
    updates.append(u)
  return params, updates


def run_optax(tx, params, grads):
  """The params after ``tx`` has applied each gradient of ``grads`` in turn."""
  return _apply_in_turn(tx, params, grads)[0]


def optax_updates(tx, params, grads):
  """The updates of ``tx`` for each gradient of ``grads`` in turn (params moving by them), as a list."""
  return _apply_in_turn(tx, params, grads)[1]


def assert_trees_close(a, b, rtol=1e-6, atol=1e-6):
  """Same tree structure, and every pair of leaves close (compared in float64)."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=rtol, atol=atol)
