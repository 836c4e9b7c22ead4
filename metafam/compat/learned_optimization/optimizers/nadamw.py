"""`learned_optimization.optimizers.nadamw`: metafam's `NAdamW` (`metafam.optimizers.nadamw`) with the reference's
interface: ``learning_rate`` a float or a `learning_rate_schedules.ScalarSchedule` called with ``(iteration,
num_steps)``; ``init(params, model_state=None, num_steps=None)``. As in the reference, ``update`` always applies the
bias correction (its ``use_bias_correction`` argument is stored and not used)."""

from __future__ import annotations

from typing import Any

from metafam.compat.learned_optimization.optimizers._interface import ModelState, Optimizer, Params
from metafam.optimizers import nadamw as _nadamw
from metafam.optimizers.nadamw import NAdamWState

__all__ = ["NAdamW", "NAdamWState", "Params", "ModelState"]


class NAdamW(Optimizer, _nadamw.NAdamW):

  def __init__(self, learning_rate: Any = 1e-4, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
               adamw_weight_decay: float = 0.0, l2_weight_decay: float = 0.0, use_nesterov: bool = True,
               use_bias_correction: bool = True):
    _nadamw.NAdamW.__init__(self, learning_rate, beta1, beta2, epsilon, adamw_weight_decay, l2_weight_decay,
                            use_nesterov, use_bias_correction=True)
    self.config = dict(learning_rate=learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon,
                       adamw_weight_decay=adamw_weight_decay, l2_weight_decay=l2_weight_decay,
                       use_nesterov=use_nesterov, use_bias_correction=use_bias_correction)

  def init(self, params, model_state=None, num_steps=None, key=None, **kwargs):
    return _nadamw.NAdamW.init(self, params, kwargs.pop("state", model_state), num_steps=num_steps, key=key)

  def update(self, opt_state, grads, model_state=None, loss=None, key=None, **kwargs):
    return _nadamw.NAdamW.update(self, opt_state, grads, loss=loss, model_state=model_state, key=key)
