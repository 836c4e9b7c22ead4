"""`learned_optimization.outer_trainers.truncated_step`: the reference's truncated-step interface.

* `TruncatedUnrollOut(loss, is_done, task_param, iteration, mask)`: what ``unroll_step`` returns beside the state.
* `TruncatedStep`: the base class of user-written inner problems (``outer_init``, ``init_step_state(theta,
  outer_state, key)``, ``unroll_step(theta, state, key, data, outer_state)``, ``meta_loss_batch``, ``get_batch``,
  ``get_outer_batch``, ``task_name``, ``cfg_name``).
* `VectorizedTruncatedStep(truncated_step, num_tasks)`: ``num_tasks`` copies of a user step in one ``jax.vmap``
  (keys split per task, batches stacked by task), with ``theta_is_vector`` for per-task theta.

metafam's own inner training is `metafam.inner.TruncatedStep`; `lopt_truncated_step.VectorizedLOptTruncatedStep` is
one, with these lower-level calls added. The compat estimators need that one (a user step written on this base
class runs through these calls, not through metafam's estimators).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization import tree_utils

__all__ = ["TruncatedUnrollOut", "TruncatedStep", "VectorizedTruncatedStep"]

# The reference's type aliases.
MetaParams = Any
OuterState = Any
InnerState = Any
OuterBatch = Any
InnerBatch = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TruncatedUnrollOut:
  loss: Any
  is_done: Any
  task_param: Any
  iteration: Any
  mask: Any

  def replace(self, **changes: Any) -> "TruncatedUnrollOut":
    return dataclasses.replace(self, **changes)


class TruncatedStep:
  """Base class of an inner problem for the reference's gradient estimators; subclasses implement the methods."""

  def outer_init(self, key: jax.Array) -> Any:
    raise NotImplementedError

  def init_step_state(self, theta: Any, outer_state: Any, key: jax.Array) -> Any:
    raise NotImplementedError

  def get_batch(self, steps: Optional[int] = None) -> Any:
    raise NotImplementedError

  def get_outer_batch(self, steps: Optional[int] = None) -> Any:
    raise NotImplementedError

  def unroll_step(self, theta: Any, unroll_state: Any, key: jax.Array, data: Any, outer_state: Any):
    raise NotImplementedError

  def meta_loss_batch(self, theta: Any, unroll_state: Any, key: jax.Array, data: Any, outer_state: Any) -> Any:
    raise NotImplementedError

  def task_name(self) -> str:
    return "unnamed_task"

  def cfg_name(self) -> str:
    return "default"


class VectorizedTruncatedStep(TruncatedStep):
  """``num_tasks`` copies of ``truncated_step`` vmapped: task ``i`` gets ``jax.random.split(key, num_tasks)[i]`` and
  ``data[i]``; a state holding ``2 * num_tasks`` tasks (stacked antithetic samples) reuses the keys for both
  halves."""

  def __init__(self, truncated_step: TruncatedStep, num_tasks: int):
    self.truncated_step, self.num_tasks = truncated_step, num_tasks

  def outer_init(self, key):
    return self.truncated_step.outer_init(key)

  @functools.partial(jax.jit, static_argnames=("self", "theta_is_vector"))
  def init_step_state(self, theta, outer_state, key, theta_is_vector=False, **kwargs):
    keys = jax.random.split(key, self.num_tasks)
    init = functools.partial(self.truncated_step.init_step_state, **kwargs)
    return jax.vmap(init, in_axes=(0 if theta_is_vector else None, None, 0))(theta, outer_state, keys)

  @functools.partial(jax.jit, static_argnames=("self", "theta_is_vector"))
  def unroll_step(self, theta, unroll_state, key, data, outer_state, theta_is_vector=False, **kwargs):
    keys = jax.random.split(key, self.num_tasks)
    if tree_utils.first_dim(unroll_state) == 2 * self.num_tasks:
      keys = jnp.concatenate([keys, keys], axis=0)
    step = functools.partial(self.truncated_step.unroll_step, **kwargs)
    return jax.vmap(step, in_axes=(0 if theta_is_vector else None, 0, 0, 0, None))(
        theta, unroll_state, keys, data, outer_state)

  def meta_loss_batch(self, theta, unroll_state, key, data, outer_state, theta_is_vector=False):
    keys = jax.random.split(key, self.num_tasks)
    return jax.vmap(self.truncated_step.meta_loss_batch, in_axes=(0 if theta_is_vector else None, 0, 0, 0, None))(
        theta, unroll_state, keys, data, outer_state)

  def _batches(self, fetch, steps):
    if steps is None:
      return fetch(self.num_tasks)
    return tree_utils.tree_zip_onp([fetch(self.num_tasks) for _ in range(steps)])

  def get_batch(self, steps=None):
    return self._batches(self.truncated_step.get_batch, steps)

  def get_outer_batch(self, steps=None):
    return self._batches(self.truncated_step.get_outer_batch, steps)

  def task_name(self):
    return self.truncated_step.task_name()

  def cfg_name(self):
    return self.truncated_step.cfg_name()
