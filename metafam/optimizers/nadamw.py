"""`NAdamW`: Nesterov Adam with decoupled (AdamW) weight decay, L2 decay and a scheduled learning rate, as defined
in learned_optimization (the baseline of Metz et al. 2020, "Using a thousand optimization tasks to learn
hyperparameter search strategies", whose ranked hyper-parameter list `OptList` sweeps).

For a leaf ``p`` with gradient ``g`` at update ``t = iteration + 1``, with ``lr`` the learning rate (a float, or
``learning_rate(iteration, num_steps)`` for a schedule):

    g   <- g - l2_weight_decay * p                    (the reference's sign, kept)
    m   <- beta1 * m + (1 - beta1) * g
    v   <- beta2 * v + (1 - beta2) * g^2
    lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)     (lr_t = lr without use_bias_correction)
    d    = beta1 * m + (1 - beta1) * g                (Nesterov; d = m without use_nesterov)
    p   <- p - lr_t * d / (sqrt(v) + epsilon) - lr_t * adamw_weight_decay * p

Note where it differs from ``optax.nadamw``: epsilon is added to ``sqrt(v)`` before the bias correction (which
scales the step instead), and the decoupled decay is scaled by the bias-corrected ``lr_t``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Tuple, Union

import jax
import jax.numpy as jnp

from metafam.optimizers import _features as F
from metafam.optimizers.base import Optimizer, check_grad_matches

Schedule = Callable[[Any, Any], Any]


def nadamw_leaf(p: jax.Array, g: jax.Array, m: jax.Array, v: jax.Array, iteration: jax.Array, lr: Any,
                beta1: float, beta2: float, epsilon: float, adamw_weight_decay: float, l2_weight_decay: float,
                use_nesterov: bool = True, use_bias_correction: bool = True) -> Tuple[jax.Array, ...]:
  """One NAdamW update of a leaf (module docstring): ``(new p, new m, new v)``."""
  g = g - p * l2_weight_decay
  m = beta1 * m + (1.0 - beta1) * g
  v = beta2 * v + (1.0 - beta2) * jnp.square(g)
  t = jnp.asarray(iteration, jnp.float32) + 1.0
  lr_t = lr * jnp.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t) if use_bias_correction else lr
  direction = beta1 * m + (1.0 - beta1) * g if use_nesterov else m
  step = lr_t * direction / (jnp.sqrt(v) + epsilon) + lr_t * adamw_weight_decay * p
  return p - step, m, v


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["iteration", "params", "state", "grad_acc", "grad_sqr_acc", "num_steps"],
                   meta_fields=[])
@dataclasses.dataclass(frozen=True)
class NAdamWState:
  """`NAdamW`'s state (the reference's field names): int32 ``iteration`` and ``num_steps`` (-1 when not given),
  params, model state, and the moving averages ``grad_acc`` / ``grad_sqr_acc`` in the compute dtype."""
  iteration: jax.Array
  params: Any
  state: Any
  grad_acc: Any
  grad_sqr_acc: Any
  num_steps: jax.Array


class NAdamW(Optimizer):
  """NAdamW (module docstring). ``learning_rate`` is a float or a schedule ``f(iteration, num_steps)`` (such as the
  compat layer's ``CosineLearningRateSchedule``, which needs ``num_steps`` at ``init``)."""

  def __init__(self, learning_rate: Union[float, Schedule] = 1e-4, beta1: float = 0.9, beta2: float = 0.999,
               epsilon: float = 1e-8, adamw_weight_decay: float = 0.0, l2_weight_decay: float = 0.0,
               use_nesterov: bool = True, use_bias_correction: bool = True):
    if not callable(learning_rate):
      learning_rate = F.check_positive_float("learning_rate", learning_rate, allow_zero=True)
    self.learning_rate = learning_rate
    self.beta1 = F.check_positive_float("beta1", beta1, allow_zero=True)
    self.beta2 = F.check_positive_float("beta2", beta2, allow_zero=True)
    for name, b in (("beta1", self.beta1), ("beta2", self.beta2)):
      if b >= 1.0:
        raise ValueError(f"{name} must lie in [0, 1), got {b!r}.")
    self.epsilon = F.check_positive_float("epsilon", epsilon, allow_zero=True)
    self.adamw_weight_decay = F.check_positive_float("adamw_weight_decay", adamw_weight_decay, allow_zero=True)
    self.l2_weight_decay = F.check_positive_float("l2_weight_decay", l2_weight_decay, allow_zero=True)
    self.use_nesterov, self.use_bias_correction = bool(use_nesterov), bool(use_bias_correction)

  @property
  def name(self) -> str:
    return f"NAdamW(lr={self.learning_rate})"

  def init(self, params, model_state=None, num_steps=None, key=None) -> NAdamWState:
    zeros = lambda p: jnp.zeros(jnp.shape(p), F.compute_dtype(p))  # noqa: E731
    return NAdamWState(iteration=jnp.asarray(0, jnp.int32), params=params, state=model_state,
                       grad_acc=jax.tree.map(zeros, params), grad_sqr_acc=jax.tree.map(zeros, params),
                       num_steps=jnp.asarray(-1 if num_steps is None else num_steps, jnp.int32))

  def update(self, opt_state: NAdamWState, grad, loss=None, model_state=None, key=None) -> NAdamWState:
    check_grad_matches(opt_state.params, grad)
    lr = self.learning_rate
    if callable(lr):
      lr = lr(opt_state.iteration, opt_state.num_steps)

    def leaf(p, g, m, v):
      dtype = m.dtype
      new_p, m, v = nadamw_leaf(p.astype(dtype), g.astype(dtype), m, v, opt_state.iteration, lr, self.beta1,
                                self.beta2, self.epsilon, self.adamw_weight_decay, self.l2_weight_decay,
                                self.use_nesterov, self.use_bias_correction)
      return new_p.astype(p.dtype), m.astype(dtype), v.astype(dtype)

    params, m, v = F.map_leaves(leaf, opt_state.params, grad, opt_state.grad_acc, opt_state.grad_sqr_acc,
                                num_outputs=3)
    return NAdamWState(iteration=opt_state.iteration + 1, params=params,
                       state=opt_state.state if model_state is None else model_state, grad_acc=m, grad_sqr_acc=v,
                       num_steps=opt_state.num_steps)
