"""The one single-lane inner step: batch, loss and gradient, optimizer update, meta-loss, finiteness.

Every inner-training engine composes these pure pieces: `metafam.inner.TruncatedStep` maps them over lanes (with
NaN-safe masking around `loss_and_grad` and `meta_loss`), and `metafam.evaluation.Runner` (fixed-length training
with evaluation points, used by `train_and_evaluate`, the learning-rate sweeps and the benchmark) runs `train_step`
in its scans. A step with key ``k`` draws its randomness from `split_step_key`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp


class StepKeys(NamedTuple):
  """The keys of one inner step: the train batch, the loss, the meta-loss batch and the meta-loss, the update."""
  batch: jax.Array
  loss: jax.Array
  meta_batch: Optional[jax.Array]
  meta: Optional[jax.Array]
  opt: jax.Array


def split_step_key(key: jax.Array, with_meta_loss: bool) -> StepKeys:
  """`StepKeys` from one step key: ``split(key, 5)`` with a meta-loss, else ``split(key, 3)`` (no meta keys)."""
  if with_meta_loss:
    return StepKeys(*jax.random.split(key, 5))
  k_batch, k_loss, k_opt = jax.random.split(key, 3)
  return StepKeys(k_batch, k_loss, None, None, k_opt)


def sample_batch(split_data: Any, key: jax.Array) -> Any:
  """A batch from a split's `DeviceData` (None for data-free tasks)."""
  return None if split_data is None else split_data.sample(key)


def all_finite(tree: Any) -> jax.Array:
  """True when every floating entry of ``tree`` is finite (True for a tree without floating leaves)."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def loss_and_grad(task: Any, params: Any, model_state: Any, key: jax.Array, batch: Any):
  """``(loss, new model state, gradient w.r.t. params)`` of ``task.loss_with_state``."""
  (loss, new_state), grad = jax.value_and_grad(
      lambda p: task.loss_with_state(p, model_state, key, batch), has_aux=True)(params)
  return loss, new_state, grad


def apply_update(opt: Any, opt_state: Any, grad: Any, loss: jax.Array, model_state: Any, key: jax.Array) -> Any:
  """The optimizer's update of ``opt_state`` (which carries the params) with ``grad``; the new model state rides
  along."""
  return opt.update(opt_state, grad, loss=loss, model_state=model_state, key=key)


def meta_loss(task: Any, params: Any, model_state: Any, key: jax.Array, batch: Any) -> jax.Array:
  """The loss of the (updated) ``params`` on ``batch``, through ``task.loss_with_state_and_aux``."""
  return task.loss_with_state_and_aux(params, model_state, key, batch)[0]


def train_step(task: Any, opt: Any, opt_state: Any, key: jax.Array, split_data: Any = None, batch: Any = None):
  """One update of one lane without a meta-loss: ``(new opt_state, loss before the update)``.

  The batch is drawn from ``split_data`` (a `DeviceData`) when given, else ``batch`` is used as is.
  """
  keys = split_step_key(key, with_meta_loss=False)
  if split_data is not None:
    batch = sample_batch(split_data, keys.batch)
  loss, model_state, grad = loss_and_grad(task, opt.get_params(opt_state), opt.get_state(opt_state), keys.loss, batch)
  return apply_update(opt, opt_state, grad, loss, model_state, keys.opt), loss
