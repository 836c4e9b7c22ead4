"""`learned_optimization.optimizers.optimizer_wrappers`: `WeightDecayWrapper` and `ExtendTimeWrapper`.

* `WeightDecayWrapper(opt, weight_decay, add_to_loss=True)`: ``opt`` on ``g + weight_decay * p``; with
  ``add_to_loss`` the loss it is given grows by ``weight_decay * sum(p^2)``, as in the reference (which adds the
  penalty's full value, not half, to the loss while adding its half-gradient to the gradient).
* `ExtendTimeWrapper(opt, warp_fn)`: ``opt`` run on a warped clock: it is initialized with
  ``num_steps = warp_fn(num_steps)`` and each update sees ``iteration = warp_fn(own iteration)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.optimizers import base

__all__ = ["WeightDecayWrapper", "ExtendTimeWrapper", "ExtendTimeState"]


class WeightDecayWrapper(base.WrappedOptimizer):

  def __init__(self, opt: base.Optimizer, weight_decay: float = 0.0, add_to_loss: bool = True):
    self.opt = base._check_optimizer(opt, "opt")
    self.weight_decay, self.add_to_loss = weight_decay, add_to_loss

  @property
  def name(self) -> str:
    return f"WeightDecay{self.weight_decay}_{self.opt.name}"

  def init(self, params, model_state=None, **kwargs):
    return self.opt.init(params, model_state=model_state, **kwargs)

  def update(self, opt_state, grads, model_state=None, loss=None, **kwargs):
    params = self.opt.get_params(opt_state)
    if self.add_to_loss and loss is not None:
      loss = loss + self.weight_decay * sum(jnp.sum(jnp.square(p)) for p in jax.tree.leaves(params))
    grads = jax.tree.map(lambda g, p: g + self.weight_decay * p, grads, params)
    return self.opt.update(opt_state, grads, model_state=model_state, loss=loss, **kwargs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ExtendTimeState:
  iteration: jax.Array
  inner_opt_state: Any


class ExtendTimeWrapper(base.Optimizer):

  def __init__(self, opt: base.Optimizer, warp_fn: Callable[[Any], Any]):
    self._opt = base._check_optimizer(opt, "opt")
    self._warp_fn = warp_fn

  @property
  def name(self) -> str:
    return f"ExtendTime_{self._opt.name}"

  def init(self, params, model_state=None, *, num_steps, **kwargs):
    inner = self._opt.init(params, model_state, num_steps=jnp.asarray(self._warp_fn(num_steps), jnp.int32))
    return ExtendTimeState(jnp.asarray(0, jnp.int32), inner)

  def update(self, opt_state, grad, loss=None, **kwargs):
    inner = opt_state.inner_opt_state
    inner = dataclasses.replace(inner, iteration=jnp.asarray(self._warp_fn(opt_state.iteration),
                                                             inner.iteration.dtype))
    return ExtendTimeState(opt_state.iteration + 1, self._opt.update(inner, grad, loss=loss, **kwargs))

  def get_params(self, state):
    return self._opt.get_params(state.inner_opt_state)

  def get_state(self, state):
    return self._opt.get_state(state.inner_opt_state)

  def set_params(self, state, params):
    return dataclasses.replace(state, inner_opt_state=self._opt.set_params(state.inner_opt_state, params))
