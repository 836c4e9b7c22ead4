"""`learned_optimization.optimizers.test_utils`: `smoketest_optimizer`, as LO's tests call it.

Runs ``optimizer`` on a two-leaf quadratic in float32 and (with ``strict_types``) float16: init, two updates, then
with a model state (a counter the loss increments); checks that an update keeps the state's tree structure and
shapes (and dtypes with ``strict_types``), that ``is_valid=`` is accepted, and that the model state is threaded.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["smoketest_optimizer"]


def _abstract(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.asarray(x).dtype), tree)


def smoketest_optimizer(optimizer: Any, strict_types: bool = True) -> None:
  """Raises AssertionError if ``optimizer`` changes its state's structure, shapes or (strict) dtypes."""

  def loss_fn(p):
    return jnp.mean(p["a"] ** 2 + p["b"] ** 2)

  def loss_and_count(p, count):
    return loss_fn(p), count + 1

  key = jax.random.PRNGKey(0)
  for dtype in [jnp.float32] + ([jnp.float16] if strict_types else []):
    start = {"a": jnp.asarray(1.0, dtype), "b": jnp.asarray(1.0, dtype)}
    state = optimizer.init(start, num_steps=100)
    for _ in range(2):
      value, grads = jax.value_and_grad(loss_fn)(optimizer.get_params(state))
      state = optimizer.update(state, grads, loss=value, key=key)

    state = optimizer.init(start, model_state=jnp.asarray(0), num_steps=100)
    before = _abstract(state)
    (value, count), grads = jax.value_and_grad(loss_and_count, has_aux=True)(
        optimizer.get_params(state), optimizer.get_state(state))
    state = optimizer.update(state, grads, loss=value, model_state=count, key=key)
    after = _abstract(state)
    assert jax.tree.structure(before) == jax.tree.structure(after), "an update changed the state's structure"
    same_shapes = jax.tree.map(lambda x, y: x.shape == y.shape, before, after)
    assert all(jax.tree.leaves(same_shapes)), "an update changed the state's shapes"
    if strict_types:
      same_dtypes = jax.tree.map(lambda x, y: x.dtype == y.dtype, before, after)
      assert all(jax.tree.leaves(same_dtypes)), "an update changed the state's dtypes"
    state = optimizer.update(state, grads, loss=value, model_state=count, is_valid=True, key=key)
    assert optimizer.get_state(state) == 1, "the model state was not threaded through update"
