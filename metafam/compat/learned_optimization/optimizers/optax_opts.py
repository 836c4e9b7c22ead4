"""`learned_optimization.optimizers.optax_opts`: hand-designed optimizers as thin wrappers of optax transformations.

Each class is metafam's `OptaxOptimizer` (every state leaf's dtype kept across ``update``) built with the reference's argument names and defaults; ``update`` accepts and ignores extra
keyword arguments such as ``is_valid``. The wrapped transformation is ``opt.tx``. States are the reference's `OptaxState` (``params``, ``state``,
``optax_opt_state``, ``iteration``): metafam's `OptimizerState` with ``opt_state`` named ``optax_opt_state``;
``update`` also takes metafam's `OptimizerState` (and then returns one).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import optax

from metafam.compat.learned_optimization.optimizers._interface import ModelState, Optimizer, OptState, Params
from metafam.optimizers import base as _mf_base

Gradient = Any

__all__ = ["Params", "ModelState", "OptState", "Gradient", "OptaxState", "OptaxOptimizer", "SGD", "SGDM", "Adam", "RMSProp", "AdaBelief", "AdamW", "Fromage", "Lars", "Lamb",
           "RAdam", "SM3", "Yogi", "Adafactor", "AdaGrad", "PiecewiseLinearAdam", "piecewise_linear"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OptaxState:
  """The reference's state of an optax optimizer: params, model state, the optax state and the update count."""
  params: Any
  state: Any
  optax_opt_state: Any
  iteration: Any

  def replace(self, **changes: Any) -> "OptaxState":
    return dataclasses.replace(self, **changes)


def _to_lo(state: _mf_base.OptimizerState) -> OptaxState:
  return OptaxState(params=state.params, state=state.state, optax_opt_state=state.opt_state,
                    iteration=state.iteration)


def _from_lo(state: OptaxState) -> _mf_base.OptimizerState:
  return _mf_base.OptimizerState(params=state.params, state=state.state, opt_state=state.optax_opt_state,
                                 iteration=jnp.asarray(state.iteration, jnp.int32))


class OptaxOptimizer(Optimizer, _mf_base.OptaxOptimizer):
  """Any `optax.GradientTransformation` with the reference's optimizer interface."""

  def __init__(self, opt: optax.GradientTransformation, name: Optional[str] = None):
    _mf_base.OptaxOptimizer.__init__(self, opt, name=name)

  @property
  def name(self) -> str:
    return self._name or type(self).__name__

  def init(self, params, state=None, num_steps=None, key=None, **kwargs):
    state = kwargs.pop("model_state", state)
    return _to_lo(_mf_base.OptaxOptimizer.init(self, params, model_state=state, num_steps=num_steps, key=key))

  def update(self, opt_state, grad, loss=None, model_state=None, key=None, **kwargs):
    lo = isinstance(opt_state, OptaxState)
    out = _mf_base.OptaxOptimizer.update(self, _from_lo(opt_state) if lo else opt_state, grad, loss=loss,
                                         model_state=model_state, key=key)
    return _to_lo(out) if lo else out


def _label(cls_name: str, **hparams: Any) -> str:
  return cls_name + "_" + "_".join(f"{k}{v}" for k, v in hparams.items())


class SGD(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01):
    self.learning_rate = learning_rate
    super().__init__(optax.sgd(learning_rate), name=_label("SGD", lr=learning_rate))


class SGDM(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, momentum: float = 0.9):
    self.learning_rate, self.momentum = learning_rate, momentum
    super().__init__(optax.sgd(learning_rate, momentum=momentum), name=_label("SGDM", lr=learning_rate, m=momentum))


class Adam(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
               epsilon_root: float = 1e-8):
    self.learning_rate, self.beta1, self.beta2 = learning_rate, beta1, beta2
    self.epsilon, self.epsilon_root = epsilon, epsilon_root
    super().__init__(optax.adam(learning_rate, b1=beta1, b2=beta2, eps=epsilon, eps_root=epsilon_root),
                     name=_label("Adam", lr=learning_rate, b1=beta1, b2=beta2, eps=epsilon, epsroot=epsilon_root))


class RMSProp(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, decay: float = 0.9, epsilon: float = 1e-8, momentum: float = 0.0,
               nesterov: bool = False):
    self.learning_rate, self.decay, self.epsilon = learning_rate, decay, epsilon
    self.momentum, self.nesterov = momentum, nesterov
    super().__init__(optax.rmsprop(learning_rate, decay=decay, eps=epsilon, momentum=momentum or None,
                                   nesterov=nesterov),
                     name=_label("RMSProp", lr=learning_rate, d=decay, eps=epsilon, m=momentum, nesterov=nesterov))


class AdaBelief(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-16,
               eps_root: float = 1e-16):
    self.learning_rate = learning_rate
    super().__init__(optax.adabelief(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root),
                     name=_label("AdaBelief", lr=learning_rate, b1=b1, b2=b2, eps=eps, epsroot=eps_root))


class AdamW(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               eps_root: float = 0.0, mu_dtype: Any = None, weight_decay: float = 1e-4, mask: Any = None):
    self.learning_rate, self.weight_decay = learning_rate, weight_decay
    super().__init__(optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
                                 weight_decay=weight_decay, mask=mask),
                     name=_label("AdamW", lr=learning_rate, b1=b1, b2=b2, eps=eps, wd=weight_decay))


class Fromage(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, min_norm: float = 1e-6):
    self.learning_rate = learning_rate
    super().__init__(optax.fromage(learning_rate, min_norm=min_norm),
                     name=_label("Fromage", lr=learning_rate, min_norm=min_norm))


class Lars(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, weight_decay: float = 0.0, weight_decay_mask: Any = True,
               trust_coefficient: float = 0.001, eps: float = 0.0, trust_ratio_mask: Any = True,
               momentum: float = 0.9, nesterov: bool = False, min_norm: float = 1e-6):
    self.learning_rate = learning_rate
    del min_norm  # accepted and unused, as in the reference
    super().__init__(optax.lars(learning_rate, weight_decay=weight_decay, weight_decay_mask=weight_decay_mask,
                                trust_coefficient=trust_coefficient, eps=eps, trust_ratio_mask=trust_ratio_mask,
                                momentum=momentum, nesterov=nesterov),
                     name=_label("Lars", lr=learning_rate, wd=weight_decay, m=momentum))


class Lamb(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               eps_root: float = 0.0, weight_decay: float = 0.0, mask: Any = None):
    self.learning_rate = learning_rate
    super().__init__(optax.lamb(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay,
                                mask=mask),
                     name=_label("Lamb", lr=learning_rate, b1=b1, b2=b2, eps=eps, wd=weight_decay))


class RAdam(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               eps_root: float = 0.0, threshold: float = 5.0):
    self.learning_rate = learning_rate
    super().__init__(optax.radam(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root, threshold=threshold),
                     name=_label("RAdam", lr=learning_rate, b1=b1, b2=b2, eps=eps))


def _expand_scalar(x, r):
  """``x`` with a leading axis of 1 when ``r`` (a scalar param seen as a 1-vector), else ``x``."""
  return jnp.expand_dims(x, 0) if r else x


def _sm3(learning_rate: float, momentum: float = 0.9, b2: float = 1.0) -> optax.GradientTransformation:
  """optax's SM3 scaling followed by the step ``-learning_rate`` (the transformation `SM3` applies)."""
  return optax.chain(optax.scale_by_sm3(momentum, b2=b2), optax.scale(-learning_rate))


def _scalars_as_vectors(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """``tx`` applied with every 0-d leaf viewed as shape ``(1,)`` (optax's SM3 indexes a missing accumulator for
  scalar params); the updates come back in the params' shapes."""
  lift = lambda tree: jax.tree.map(jnp.atleast_1d, tree)  # noqa: E731

  def init(params):
    return tx.init(lift(params))

  def update(updates, state, params=None):
    new, state = tx.update(lift(updates), state, None if params is None else lift(params))
    return jax.tree.map(lambda n, u: jnp.reshape(n, jnp.shape(u)), new, updates), state

  return optax.GradientTransformation(init, update)


class SM3(OptaxOptimizer):
  """optax's SM3 (scalar params handled as 1-vectors, where optax's own SM3 fails)."""

  def __init__(self, learning_rate: float = 0.01, momentum: float = 0.9, b2: float = 1.0):
    self.learning_rate = learning_rate
    super().__init__(_scalars_as_vectors(_sm3(learning_rate, momentum, b2)),
                     name=_label("SM3", lr=learning_rate, m=momentum))


class Yogi(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-3):
    self.learning_rate = learning_rate
    super().__init__(optax.yogi(learning_rate, b1=b1, b2=b2, eps=eps),
                     name=_label("Yogi", lr=learning_rate, b1=b1, b2=b2, eps=eps))


class Adafactor(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, min_dim_size_to_factor: int = 128, decay_rate: float = 0.8,
               decay_offset: int = 0, multiply_by_parameter_scale: bool = True,
               clipping_threshold: Optional[float] = 1.0, momentum: Optional[float] = None,
               dtype_momentum: Any = jnp.float32, weight_decay_rate: Optional[float] = None, eps: float = 1e-30,
               factored: bool = True, weight_decay_mask: Any = None):
    self.learning_rate = learning_rate
    super().__init__(optax.adafactor(learning_rate, min_dim_size_to_factor=min_dim_size_to_factor,
                                     decay_rate=decay_rate, decay_offset=decay_offset,
                                     multiply_by_parameter_scale=multiply_by_parameter_scale,
                                     clipping_threshold=clipping_threshold, momentum=momentum,
                                     dtype_momentum=dtype_momentum, weight_decay_rate=weight_decay_rate, eps=eps,
                                     factored=factored, weight_decay_mask=weight_decay_mask),
                     name=_label("Adafactor", lr=learning_rate, decay=decay_rate))


class AdaGrad(OptaxOptimizer):
  def __init__(self, learning_rate: float = 0.01, initial_accumulator_value: float = 0.1, eps: float = 1e-7):
    self.learning_rate = learning_rate
    super().__init__(optax.adagrad(learning_rate, initial_accumulator_value=initial_accumulator_value, eps=eps),
                     name=_label("AdaGrad", lr=learning_rate, init=initial_accumulator_value, eps=eps))


def piecewise_linear(times: Sequence[float], vals: Sequence[float]):
  """``f(step)``: linear between the points ``(times[i], vals[i])``, ``vals[0]`` before and ``vals[-1]`` after."""
  if len(times) != len(vals) or not len(vals):
    raise ValueError(f"piecewise_linear needs as many times as values (at least one), got {len(times)} times and "
                     f"{len(vals)} values.")
  if any(b < a for a, b in zip(times, times[1:])):
    raise ValueError(f"piecewise_linear needs non-decreasing times, got {tuple(times)}.")
  xs, ys = jnp.asarray(times, jnp.float32), jnp.asarray(vals, jnp.float32)
  return lambda step: jnp.interp(jnp.asarray(step, jnp.float32), xs, ys)


class PiecewiseLinearAdam(OptaxOptimizer):
  """Adam whose learning rate follows `piecewise_linear` ``(times, lrs)`` over the update count."""

  def __init__(self, times: Sequence[float] = (10000, 20000), lrs: Sequence[float] = (1e-4, 1e-5),
               beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8, epsilon_root: float = 1e-8):
    self.times, self.lrs = tuple(times), tuple(lrs)
    schedule = piecewise_linear(times, lrs)
    super().__init__(optax.chain(optax.scale_by_adam(b1=beta1, b2=beta2, eps=epsilon, eps_root=epsilon_root),
                                 optax.scale_by_schedule(lambda step: -schedule(step))),
                     name=_label("PiecewiseLinearAdam", times=self.times, lrs=self.lrs))
