"""`learned_optimization.optimizers.opt_to_optax`: any optimizer of this interface as an optax transformation.

`opt_to_optax_opt(opt, num_steps)` is metafam's `optimizer_as_optax` with ``num_steps`` passed to ``opt.init`` and
``opt.set_params`` putting the params into its state (as the reference does): the
updates are ``new_params - params``; ``loss``, ``model_state`` and ``key`` given to ``update`` as extra arguments
reach ``opt.update`` (so learned optimizers see the loss), others are ignored.
"""

from __future__ import annotations

from typing import Optional

import optax

from metafam.compat.learned_optimization.optimizers import base
from metafam.optimizers import optax_adapter

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


def opt_to_optax_opt(opt: base.Optimizer, num_steps: Optional[int] = None) -> optax.GradientTransformationExtraArgs:
  """``opt`` as an optax transformation (module docstring)."""
  wrapped = _WithSteps(opt, num_steps)
  return optax_adapter.optimizer_as_optax(wrapped, set_params=wrapped.set_params)
