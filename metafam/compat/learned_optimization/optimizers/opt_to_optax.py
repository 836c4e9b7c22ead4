"""`learned_optimization.optimizers.opt_to_optax`: any optimizer of this interface as an optax transformation.

`opt_to_optax_opt(opt, num_steps)` wraps an optimizer whose states carry the params, as the reference does:
``num_steps`` is passed to ``opt.init``, ``opt.set_params`` puts the params given to ``update`` into its state (so
the optimizer sees the real current params, also inside `optax.chain`; with ``params=None`` the state's are used), the
updates are ``new_params - params``; ``loss``, ``model_state`` and ``key`` given to ``update`` as extra arguments
reach ``opt.update`` (so learned optimizers see the loss), others are ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import optax

from metafam.compat.learned_optimization.optimizers import base

__all__ = ["opt_to_optax_opt"]


class _WithSteps(base.WrappedOptimizer):
  """``opt`` whose ``init`` is given ``num_steps``."""

  def __init__(self, opt: base.Optimizer, num_steps: Optional[int]):
    self.opt, self.num_steps = base.as_lo_optimizer(opt), num_steps

  @property
  def name(self) -> str:
    return self.opt.name

  def init(self, params, model_state=None, num_steps=None, key=None, **kwargs):
    return self.opt.init(params, model_state, num_steps=self.num_steps if num_steps is None else num_steps,
                         key=key)

  def update(self, opt_state, grad, loss=None, model_state=None, key=None, **kwargs):
    return self.opt.update(opt_state, grad, loss=loss, model_state=model_state, key=key)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OptaxAdapterState:
  """The optax state of `opt_to_optax_opt`: ``inner``, the wrapped optimizer's state (it carries the params)."""
  inner: Any


def opt_to_optax_opt(opt: base.Optimizer, num_steps: Optional[int] = None) -> optax.GradientTransformationExtraArgs:
  """``opt`` as an optax transformation (module docstring)."""
  wrapped = _WithSteps(opt, num_steps)

  def init_fn(params):
    return OptaxAdapterState(inner=wrapped.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    inner = state.inner if params is None else wrapped.set_params(state.inner, params)
    old = wrapped.get_params(inner)
    inner = wrapped.update(inner, updates, loss=extra_args.get("loss"), model_state=extra_args.get("model_state"),
                           key=extra_args.get("key"))
    new = wrapped.get_params(inner)
    return jax.tree.map(lambda n, o: (n - o).astype(o.dtype), new, old), OptaxAdapterState(inner=inner)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
