"""`learned_optimization.learned_optimizers.base`: `LearnedOptimizer` and the learnable hand-designed optimizers.

A learned optimizer has ``init(key) -> theta`` and ``opt_fn(theta, is_training=False) -> Optimizer``. The classes
here are metafam's learned optimizers under the reference's names and constructor arguments; their ``opt_fn``
returns metafam's optimizer with the reference's interface (`optimizers.base.as_lo_optimizer`: ``get_params_state``,
``set_params``, extra ``update`` keywords such as ``is_valid`` accepted).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.optimizers import learnable_sgdm as _sgdm
from metafam.optimizers import learned as _learned

MetaParams = Any
Params = Any
PRNGKey = jax.Array

# A learned optimizer as a pair of functions: ``init(key) -> theta`` and ``opt_fn(theta, is_training) -> Optimizer``.
MetaParamOpt = collections.namedtuple("MetaParamOpt", ["init", "opt_fn"])
# A pair of mutually inverse maps, e.g. a decay rate <-> its unconstrained meta-parameter.
Invertable = collections.namedtuple("Invertable", ["forward", "inverse"])
one_minus_log = Invertable(forward=lambda x: jnp.log(1 - x), inverse=lambda x: 1 - jnp.exp(x))

__all__ = ["LearnedOptimizer", "LearnableSGD", "LearnableSGDM", "LearnableAdam", "learned_optimizer_from_opt",
           "MetaParams", "Params", "MetaParamOpt", "Invertable", "one_minus_log", "wrap_learned_opt",
           "SumOptimizerState", "SumOptimizer", "SumLearnedOptimizer"]


class LearnedOptimizer(_learned.LearnedOptimizer):
  """Base class: subclasses implement ``init(key) -> theta`` and ``opt_fn(theta, is_training=False)``."""


class LOOptFn:
  """Mixin for a metafam learned optimizer: its ``opt_fn`` returns the optimizer with the reference's interface."""

  def opt_fn(self, theta: MetaParams, is_training: bool = False) -> opt_base.Optimizer:
    return opt_base.as_lo_optimizer(super().opt_fn(theta, is_training=is_training))


def reject_unsupported(owner: str, **given_and_default: tuple) -> None:
  """Raises NotImplementedError for a reference argument set to a value metafam's version does not model.

  ``given_and_default``: ``name=(value given, the only supported value)``.
  """
  for name, (given, supported) in given_and_default.items():
    if given != supported:
      raise NotImplementedError(f"{owner}: {name}={given!r} has no counterpart in metafam's implementation (only "
                                f"{name}={supported!r} is supported).")


class LearnableSGD(LOOptFn, _learned.LearnableSGD):
  """SGD with a learned learning rate (``theta = {"log_lr"}``)."""

  def __init__(self, initial_lr: float = 0.01):
    super().__init__(initial_lr=initial_lr)


class LearnableSGDM(LOOptFn, _sgdm.LearnableSGDM):
  """Heavy-ball SGD with learned learning rate and momentum."""

  def __init__(self, initial_lr: float = 0.01, initial_momentum: float = 0.9):
    super().__init__(initial_lr=initial_lr, momentum=initial_momentum)


class LearnableAdam(LOOptFn, _learned.LearnableAdam):
  """Adam with learned learning rate, betas and epsilon. ``use_summary`` (logging only) is accepted and ignored."""

  def __init__(self, initial_lr: float = 0.001, initial_beta1: float = 0.9, initial_beta2: float = 0.999,
               initial_epsilon: float = 1e-8, use_summary: bool = True):
    super().__init__(initial_lr=initial_lr, beta1=initial_beta1, beta2=initial_beta2, epsilon=initial_epsilon)


class _FromOpt(LOOptFn, _learned.HandDesigned):
  """A fixed optimizer as a learned optimizer without meta-parameters (``theta == {}``)."""


def learned_optimizer_from_opt(opt: opt_base.Optimizer) -> LearnedOptimizer:
  """``opt`` as a learned optimizer whose ``opt_fn`` ignores theta (metafam's `HandDesigned`; theta is ``{}``,
  where the reference uses None)."""
  return _FromOpt(opt)


class _Wrapped(LearnedOptimizer):
  """``learned_opt`` whose optimizers are passed through ``opt_wrapper``."""

  def __init__(self, learned_opt: LearnedOptimizer, opt_wrapper: Callable[[opt_base.Optimizer], opt_base.Optimizer]):
    self.learned_opt = learned_opt
    self.opt_wrapper = opt_wrapper

  def init(self, key: PRNGKey) -> MetaParams:
    return self.learned_opt.init(key)

  def opt_fn(self, theta: MetaParams, is_training: bool = False) -> opt_base.Optimizer:
    return self.opt_wrapper(self.learned_opt.opt_fn(theta, is_training=is_training))


def wrap_learned_opt(learned_opt: LearnedOptimizer,
                     opt_wrapper: Callable[[opt_base.Optimizer], opt_base.Optimizer]) -> LearnedOptimizer:
  """``learned_opt`` with every optimizer it makes wrapped by ``opt_wrapper`` (e.g. gradient clipping)."""
  return _Wrapped(learned_opt, opt_wrapper)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SumOptimizerState:
  """State of `SumOptimizer`: the shared params, model state and iteration, and the inner optimizers' states."""
  iteration: Any
  params: Any
  state: Any
  inner_opt_states: Sequence[Any]

  def replace(self, **changes) -> "SumOptimizerState":
    return dataclasses.replace(self, **changes)


class SumOptimizer(opt_base.Optimizer):
  """Two optimizers whose steps add: ``params + (step_0 + step_1)``, each computed from the same gradient.

  After each update both inner optimizers are given the summed params, so they stay in step.
  """

  def __init__(self, opts: Sequence[opt_base.Optimizer]):
    if len(opts) != 2:
      raise ValueError(f"SumOptimizer: opts must hold exactly 2 optimizers, got {len(opts)}.")
    self.opts = [opt_base.as_lo_optimizer(o) for o in opts]

  def init(self, params, model_state=None, num_steps=None, **kwargs):
    states = tuple(o.init(params, model_state, num_steps=num_steps, **kwargs) for o in self.opts)
    return SumOptimizerState(jnp.asarray(0, jnp.int32), params, model_state, states)

  def get_params(self, state):
    return state.params

  def get_state(self, state):
    return state.state

  def set_params(self, state, params):
    return state.replace(params=params,
                         inner_opt_states=tuple(o.set_params(s, params)
                                                for o, s in zip(self.opts, state.inner_opt_states)))

  def update(self, opt_state, grad, model_state=None, **kwargs):
    new_states = [o.update(s, grad, model_state=model_state, **kwargs)
                  for o, s in zip(self.opts, opt_state.inner_opt_states)]
    steps = [jax.tree.map(jnp.subtract, o.get_params(s), opt_state.params) for o, s in zip(self.opts, new_states)]
    params = jax.tree.map(lambda p, a, b: p + a + b, opt_state.params, *steps)
    new_states = tuple(o.set_params(s, params) for o, s in zip(self.opts, new_states))
    return SumOptimizerState(opt_state.iteration + 1, params,
                             opt_state.state if model_state is None else model_state, new_states)


class SumLearnedOptimizer(LearnedOptimizer):
  """Learned optimizers whose steps add (`SumOptimizer`); theta is ``{"inner_lopt_theta_<i>": theta_i}``."""

  def __init__(self, lopts: Sequence[LearnedOptimizer]):
    self.lopts = list(lopts)

  def init(self, key: PRNGKey) -> MetaParams:
    keys = jax.random.split(key, len(self.lopts))
    return {f"inner_lopt_theta_{i}": lopt.init(k) for i, (lopt, k) in enumerate(zip(self.lopts, keys))}

  def opt_fn(self, theta: MetaParams, is_training: bool = False) -> opt_base.Optimizer:
    return SumOptimizer([lopt.opt_fn(theta[f"inner_lopt_theta_{i}"], is_training=is_training)
                         for i, lopt in enumerate(self.lopts)])
