"""`learned_optimization.optimizers.gradient_accumulator`: `GradientAccumulator(opt, num_average)`.

Sums gradients and losses over ``num_average`` calls of ``update``; every ``num_average``-th call hands their means
to ``opt`` (one inner step) and resets the sums, otherwise the params stay. ``init`` gives ``opt`` ``num_steps //
num_average`` steps. The branch is a `jax.lax.cond`, so the wrapper works under `jit` and `vmap`. As in the
reference, the wrapper's model state is whatever the last ``update`` was given.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.optimizers import base

__all__ = ["GradientAccumulator", "GradientAccumulatorState"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GradientAccumulatorState:
  grad_accum: Any
  loss_accum: jax.Array
  inner_opt_state: Any
  iteration: jax.Array
  model_state: Any


class GradientAccumulator(base.Optimizer):

  def __init__(self, opt: base.Optimizer, num_average: int = 1):
    if isinstance(num_average, bool) or not isinstance(num_average, int) or num_average < 1:
      raise ValueError(f"num_average must be an int >= 1, got {num_average!r}.")
    self.opt, self.num_average = base._check_optimizer(opt, "opt"), num_average

  @property
  def name(self) -> str:
    return f"GradientAccumulator{self.num_average}_{self.opt.name}"

  def init(self, p, model_state=None, num_steps=None, **kwargs):
    steps = None if num_steps is None else num_steps // self.num_average
    inner = self.opt.init(p, model_state=model_state, num_steps=steps, **kwargs)
    return GradientAccumulatorState(jax.tree.map(jnp.zeros_like, p), jnp.asarray(0.0, jnp.float32), inner,
                                    jnp.asarray(0, jnp.int32), model_state)

  def update(self, opt_state, grad, model_state=None, loss: Optional[jax.Array] = None, **kwargs):
    grads = jax.tree.map(jnp.add, opt_state.grad_accum, grad)
    losses = opt_state.loss_accum + (0.0 if loss is None else loss)
    iteration = opt_state.iteration + 1

    def apply(args):
      inner, losses, grads = args
      mean = jax.tree.map(lambda g: (g / self.num_average).astype(g.dtype), grads)
      inner = self.opt.update(inner, mean, loss=None if loss is None else losses / self.num_average,
                              model_state=model_state, **kwargs)
      return inner, jnp.zeros_like(losses), jax.tree.map(jnp.zeros_like, grads)

    inner, losses, grads = jax.lax.cond(iteration % self.num_average == 0, apply, lambda args: args,
                                        (opt_state.inner_opt_state, jnp.asarray(losses, jnp.float32), grads))
    return GradientAccumulatorState(grads, losses, inner, iteration, model_state)

  def get_params(self, state):
    return self.opt.get_params(state.inner_opt_state)

  def get_state(self, state):
    return state.model_state

  def set_params(self, state, params):
    return dataclasses.replace(state, inner_opt_state=self.opt.set_params(state.inner_opt_state, params))
