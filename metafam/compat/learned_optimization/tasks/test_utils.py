"""`learned_optimization.tasks.test_utils`: smoke checks for a task or a family, as LO's tests call them.

`smoketest_task(task)` initializes the task, evaluates every loss variant and its gradient on one batch (zeros shaped
like ``datasets.abstract_batch`` by default, a real ``train`` batch with ``abstract_data=False``; ``()`` for a task
without data) and calls ``normalizer``. `smoketest_task_family(family)` does that for two sampled tasks. Both raise
(AssertionError or the task's own error) when something is wrong and return what they computed, for inspection.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["smoketest_task", "smoketest_task_family"]


def _batch(task: Any, abstract_data: bool) -> Any:
  datasets = task.datasets
  if not datasets:
    return ()
  abstract = getattr(datasets, "abstract_batch", None)
  if abstract_data and abstract is not None:
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract)
  return next(datasets.train)


def smoketest_task(task: Any, abstract_data: bool = True) -> dict:
  """Runs ``task`` once through init, the loss variants, their gradient and ``normalizer``."""
  key = jax.random.PRNGKey(0)
  params, state = task.init_with_state(key)
  batch = _batch(task, abstract_data)
  loss, new_state = task.loss_with_state(params, state, key, batch)
  grads, _ = jax.grad(task.loss_with_state, has_aux=True)(params, state, key, batch)
  assert jax.tree.structure(grads) == jax.tree.structure(params), "gradient and params differ in structure"
  normalized = task.normalizer(jnp.asarray(1.0))
  loss_aux, _, aux = task.loss_with_state_and_aux(params, state, key, batch)
  assert jnp.shape(loss) == () and jnp.shape(loss_aux) == (), "the loss must be a scalar"
  return {"params": params, "state": new_state, "loss": loss, "grads": grads, "aux": aux, "normalized": normalized}


def smoketest_task_family(task_family: Any) -> list:
  """`smoketest_task` on the tasks of two different samples of ``task_family``."""
  key = jax.random.PRNGKey(0)
  results = []
  for k in (key, jax.random.split(key)[1]):
    task = task_family.task_fn(task_family.sample(k))
    results.append(smoketest_task(task))
  if task.datasets is not None:
    assert task_family.datasets is not None, "the family's tasks have datasets but the family has none"
  return results
