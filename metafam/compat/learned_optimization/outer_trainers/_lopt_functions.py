"""The reference's per-lane functional API of `lopt_truncated_step`, for code that drives inner training itself.

`VectorizedLOptTruncatedStep` (metafam's engine) is what the estimators use; these functions are the pieces LO
code calls directly, written over metafam's single-lane step (`metafam.inner.step`: loss and gradient, update):

* ``init_truncation_state(task_family, learned_opt, trunc_sched, theta, outer_state, keys, num_steps_override)``:
  one `TruncatedUnrollState` per key (vmapped over ``keys``; ``_vec_theta``: theta has the same leading axis).
  Per lane, ``key`` splits in four: the task config, its params, the truncation state, the optimizer init.
* ``progress_or_reset_inner_opt_state(...)``: one training step, or a fresh task when ``is_done`` (then the step
  and the returned meta-loss are 0); ``meta_loss_with_aux_key`` scores that aux value instead of the loss.
* ``truncated_unroll_one_step(task_family, learned_opt, trunc_sched, theta, keys, states, datas, outer_state,
  meta_loss_with_aux_key, override_num_steps)`` (and ``_vec_theta``): that step for every lane, then the truncation
  schedule's ``next_state``; returns the new states and a `TruncatedUnrollOut` (``mask`` is 0 on a reset step).
* ``vectorized_loss_and_aux(task_family, learned_opt, theta, inner_opt_states, task_params, keys, datas)``: each
  lane's ``(loss, aux)`` at its current params.
The task family, learned optimizer and schedule are static arguments of the jitted functions (hashable objects).

Why these are not the engine's truncated step: LO's reset timeline differs. Here a reset is a step of its own (the
lane gets a fresh task, takes no training step and reports meta-loss 0 with iteration 0), while metafam's
`TruncatedStep` trains the new instance in the same step; LO code that drives these functions reads that timeline.
The gradient and the update inside a step are the engine's (`metafam.inner.step.loss_and_grad` / `apply_update`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.compat.learned_optimization.outer_trainers.truncated_step import TruncatedUnrollOut
from metafam.inner import step as _step

__all__ = ["TruncatedUnrollState", "init_truncation_state", "init_truncation_state_vec_theta",
           "progress_or_reset_inner_opt_state", "truncated_unroll_one_step", "truncated_unroll_one_step_vec_theta",
           "vectorized_loss_and_aux"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TruncatedUnrollState:
  """One lane: its optimizer state (carrying the params), step within the trajectory, truncation state, task
  config and whether its trajectory just ended."""
  inner_opt_state: Any
  inner_step: Any
  truncation_state: Any
  task_param: Any
  is_done: Any

  def replace(self, **changes: Any) -> "TruncatedUnrollState":
    return dataclasses.replace(self, **changes)


def _lo_opt(learned_opt: Any, theta: Any) -> Any:
  return opt_base.as_lo_optimizer(learned_opt.opt_fn(theta, is_training=True))


def _init_truncation_state(task_family, learned_opt, trunc_sched, theta, outer_state, key, num_steps_override=None):
  k_cfg, k_params, k_trunc, k_opt = jax.random.split(key, 4)
  task_param = task_family.sample(k_cfg)
  params, model_state = task_family.task_fn(task_param).init_with_state(k_params)
  trunc_state = trunc_sched.init(k_trunc, outer_state)
  num_steps = trunc_state.length if num_steps_override is None else num_steps_override
  opt_state = _lo_opt(learned_opt, theta).init(params, model_state, num_steps=num_steps, key=k_opt)
  return TruncatedUnrollState(inner_opt_state=opt_state, inner_step=jnp.asarray(0, jnp.int32),
                              truncation_state=trunc_state, task_param=task_param, is_done=jnp.asarray(False))


_STATIC_INIT = ("task_family", "learned_opt", "trunc_sched", "num_steps_override")


@functools.partial(jax.jit, static_argnames=_STATIC_INIT)
def init_truncation_state(task_family: Any, learned_opt: Any, trunc_sched: Any, theta: Any, outer_state: Any,
                          key: jax.Array, num_steps_override: Optional[int] = None) -> TruncatedUnrollState:
  """One lane state per key of ``key`` (a stack of keys), all with the same ``theta``."""
  return jax.vmap(lambda k: _init_truncation_state(task_family, learned_opt, trunc_sched, theta, outer_state, k,
                                      num_steps_override))(key)


@functools.partial(jax.jit, static_argnames=_STATIC_INIT)
def init_truncation_state_vec_theta(task_family: Any, learned_opt: Any, trunc_sched: Any, theta: Any,
                                    outer_state: Any, key: jax.Array,
                                    num_steps_override: Optional[int] = None) -> TruncatedUnrollState:
  """`init_truncation_state` with one theta per lane (leading axis)."""
  return jax.vmap(lambda th, k: _init_truncation_state(task_family, learned_opt, trunc_sched, th, outer_state, k,
                                          num_steps_override))(theta, key)


def progress_or_reset_inner_opt_state(task_family: Any, opt: Any, num_steps: Any, key: jax.Array,
                                      inner_opt_state: Any, task_param: Any, inner_step: Any, is_done: Any,
                                      data: Any, cond_fn: Callable = jax.lax.cond, axis_name: Optional[str] = None,
                                      meta_loss_with_aux_key: Optional[str] = None):
  """``(opt_state, task_param, inner_step, meta_loss)`` after one step of one lane, or after its reset when
  ``is_done`` (see the module docstring). ``axis_name``: gradients and losses are averaged over that mapped axis
  (and a reset uses the first member's key)."""
  opt = opt_base.as_lo_optimizer(opt)

  def reset(key):
    if axis_name:
      key = jax.lax.all_gather(key, axis_name)[0]
    k_cfg, k_params, k_opt = jax.random.split(key, 3)
    new_param = task_family.sample(k_cfg)
    params, model_state = task_family.task_fn(new_param).init_with_state(k_params)
    return (opt.init(params, model_state, num_steps=num_steps, key=k_opt), new_param, jnp.asarray(0, jnp.int32),
            jnp.asarray(0.0, jnp.float32))

  def train(key):
    k_loss, k_opt = jax.random.split(key)
    task = task_family.task_fn(task_param)
    params, model_state = opt.get_params(inner_opt_state), opt.get_state(inner_opt_state)
    if meta_loss_with_aux_key:
      def loss_fn(p):
        loss, new_state, aux = task.loss_with_state_and_aux(p, model_state, k_loss, data)
        return loss, (new_state, aux)
      (loss, (new_state, aux)), grad = jax.value_and_grad(loss_fn, has_aux=True)(params)
      if meta_loss_with_aux_key not in aux:
        raise ValueError(f"meta_loss_with_aux_key={meta_loss_with_aux_key!r} is not an aux key of the task "
                         f"(its keys: {sorted(aux)}).")
      meta_loss = aux[meta_loss_with_aux_key]
    else:
      loss, new_state, grad = _step.loss_and_grad(task, params, model_state, k_loss, data)
      meta_loss = loss
    if axis_name:
      grad, loss = jax.lax.pmean((grad, loss), axis_name)
    new_opt_state = _step.apply_update(opt, inner_opt_state, grad, loss, new_state, k_opt)
    return (new_opt_state, task_param, jnp.asarray(inner_step + 1, jnp.int32),
            jnp.asarray(meta_loss, jnp.float32))

  return cond_fn(jnp.logical_not(is_done), train, reset, key)


def _truncated_unroll_one_step(task_family, learned_opt, trunc_sched, theta, key, state, data, outer_state,
                               meta_loss_with_aux_key, override_num_steps=None):
  k_step, k_trunc = jax.random.split(key)
  num_steps = state.truncation_state.length if override_num_steps is None else override_num_steps
  opt_state, task_param, inner_step, loss = progress_or_reset_inner_opt_state(
      task_family, _lo_opt(learned_opt, theta), num_steps, k_step, state.inner_opt_state, state.task_param,
      state.inner_step, state.is_done, data, meta_loss_with_aux_key=meta_loss_with_aux_key)
  trunc_state, is_done = trunc_sched.next_state(state.truncation_state, inner_step, k_trunc, outer_state)
  new_state = TruncatedUnrollState(inner_opt_state=opt_state, inner_step=inner_step, truncation_state=trunc_state,
                                   task_param=task_param, is_done=is_done)
  out = TruncatedUnrollOut(loss=loss, is_done=is_done, task_param=state.task_param, iteration=inner_step,
                           mask=inner_step != 0)
  return new_state, out


_STATIC_UNROLL = ("task_family", "learned_opt", "trunc_sched", "meta_loss_with_aux_key", "override_num_steps")


@functools.partial(jax.jit, static_argnames=_STATIC_UNROLL)
def truncated_unroll_one_step(task_family: Any, learned_opt: Any, trunc_sched: Any, theta: Any, key: jax.Array,
                              state: TruncatedUnrollState, data: Any, outer_state: Any,
                              meta_loss_with_aux_key: Optional[str] = None,
                              override_num_steps: Optional[int] = None):
  """One step of every lane (keys, states and data have a leading lane axis; theta is shared)."""
  return jax.vmap(lambda k, s, d: _truncated_unroll_one_step(
      task_family, learned_opt, trunc_sched, theta, k, s, d, outer_state, meta_loss_with_aux_key,
      override_num_steps))(key, state, data)


@functools.partial(jax.jit, static_argnames=_STATIC_UNROLL)
def truncated_unroll_one_step_vec_theta(task_family: Any, learned_opt: Any, trunc_sched: Any, theta: Any,
                                        key: jax.Array, state: TruncatedUnrollState, data: Any, outer_state: Any,
                                        meta_loss_with_aux_key: Optional[str] = None,
                                        override_num_steps: Optional[int] = None):
  """`truncated_unroll_one_step` with one theta per lane (leading axis)."""
  return jax.vmap(lambda th, k, s, d: _truncated_unroll_one_step(task_family, learned_opt, trunc_sched, th, k, s, d, outer_state,
                                                  meta_loss_with_aux_key, override_num_steps))(theta, key, state,
                                                                                               data)


def vectorized_loss_and_aux(task_family: Any, learned_opt: Any, theta: Any, inner_opt_state: Any, task_param: Any,
                            key: jax.Array, data: Any):
  """``(loss, aux)`` of every lane at its current params (lane axis on all but the family, optimizer, theta)."""

  def one(opt_state, cfg, k, d):
    opt = _lo_opt(learned_opt, theta)
    task = task_family.task_fn(cfg)
    loss, _, aux = task.loss_with_state_and_aux(opt.get_params(opt_state), opt.get_state(opt_state), k, d)
    return loss, aux

  return jax.vmap(one)(inner_opt_state, task_param, key, data)
