"""`learned_optimization.research.general_lopt.prefab`: VeLO, ready to use, as an optimizer or an optax
transformation.

`LearnedOptimizer(num_training_steps, weight_decay=0.0, max_training_steps=150_000, base_lopt_fn=...)` wraps a
pretrained learned optimizer (default: VeLO's weights through ``pretrained_optimizers.
aug12_continue_on_bigger_2xbs_200kstep_bigproblem_v2_5620``, read from ``$METAFAM_VELO_WEIGHTS`` or failing with an
error that says where to put them): runs longer than ``max_training_steps`` average
``ceil(num_training_steps / max_training_steps)`` gradients per step (`GradientAccumulator`), ``weight_decay > 0``
adds that decay (`WeightDecayWrapper`), and ``init`` always gives the optimizer ``num_training_steps``.
`optax_lopt(num_steps, ...)` is the same as an optax transformation; pass the loss to its ``update`` as the extra
argument ``loss=``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import jax
import optax

from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.compat.learned_optimization.optimizers import gradient_accumulator, opt_to_optax, optimizer_wrappers
from metafam.compat.learned_optimization.research.general_lopt import pretrained_optimizers

__all__ = ["LearnedOptimizer", "optax_lopt"]

_DEFAULT = "aug12_continue_on_bigger_2xbs_200kstep_bigproblem_v2_5620"


def _default_lopt_fn() -> opt_base.Optimizer:
  return pretrained_optimizers.load_pretrained(_DEFAULT)


class LearnedOptimizer(opt_base.Optimizer):

  def __init__(self, num_training_steps: int, weight_decay: float = 0.0, max_training_steps: int = 150_000,
               base_lopt_fn: Callable[[], Any] = _default_lopt_fn):
    for name, value in (("num_training_steps", num_training_steps), ("max_training_steps", max_training_steps)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
      raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}.")
    self.opt = opt_base.as_lo_optimizer(base_lopt_fn())
    if num_training_steps > max_training_steps:
      self.opt = gradient_accumulator.GradientAccumulator(self.opt,
                                                          math.ceil(num_training_steps / max_training_steps))
    if weight_decay > 0.0:
      self.opt = optimizer_wrappers.WeightDecayWrapper(self.opt, weight_decay)
    self.num_training_steps = num_training_steps

  @property
  def name(self) -> str:
    return "LearnedOptimizer"

  def init(self, params, model_state=None, num_steps: Optional[int] = None, key=None, **kwargs):
    if num_steps and num_steps != self.num_training_steps:
      raise ValueError(f"num_steps={num_steps} given to init must match the constructor's num_training_steps="
                       f"{self.num_training_steps}.")
    key = jax.random.PRNGKey(0) if key is None else key
    return self.opt.init(params, model_state=model_state, num_steps=self.num_training_steps, key=key, **kwargs)

  def update(self, opt_state, grad, model_state=None, key=None, **kwargs):
    key = jax.random.PRNGKey(0) if key is None else key
    return self.opt.update(opt_state, grad, model_state=model_state, key=key, **kwargs)

  def get_params(self, opt_state):
    return self.opt.get_params(opt_state)

  def get_state(self, opt_state):
    return self.opt.get_state(opt_state)

  def set_params(self, opt_state, params):
    return self.opt.set_params(opt_state, params)


def optax_lopt(num_steps: int, weight_decay: float = 0.0, max_training_steps: int = 150_000,
               base_lopt_fn: Callable[[], Any] = _default_lopt_fn) -> optax.GradientTransformationExtraArgs:
  """`LearnedOptimizer` as an optax transformation (``update(grads, state, params, loss=...)``)."""
  opt = LearnedOptimizer(num_steps, weight_decay=weight_decay, max_training_steps=max_training_steps,
                         base_lopt_fn=base_lopt_fn)
  return opt_to_optax.opt_to_optax_opt(opt, num_steps=num_steps)
