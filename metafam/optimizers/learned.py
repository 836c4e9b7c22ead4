"""Learned optimizers: meta-parameters ``theta`` and the `Optimizer` they define.

A `LearnedOptimizer` has ``init(key) -> theta`` (a pytree of float32 arrays, the meta-parameters) and
``opt_fn(theta, is_training=False) -> Optimizer``. The returned object is an ordinary
`metafam.optimizers.base.Optimizer` (states carry the params), so hand-designed and learned optimizers are
interchangeable: whatever trains with `SGD` or `Adam` trains with ``lopt.opt_fn(theta)``.

``opt_fn`` only closes over ``theta``, so it may be called inside `jit`, `vmap` (with ``theta`` shared or batched
along a leading axis) and `jax.grad` (meta-gradients flow into ``theta`` through any unroll of ``update``).

``lopt.as_optax(theta)`` exposes the optimizer with fixed ``theta`` as an `optax.GradientTransformationExtraArgs`.

Built here: `LearnableSGD` and `LearnableAdam` (hyper-parameters as meta-parameters) and `HandDesigned` (any fixed
`Optimizer`, no meta-parameters). The per-parameter MLP optimizer lives in `metafam.optimizers.mlp_lopt`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam.optimizers.base import Optimizer, OptimizerState, check_grad_matches
from metafam.optimizers.optax_adapter import optimizer_as_optax

MetaParams = Any


class LearnedOptimizer:
  """Base class: ``init(key) -> theta`` and ``opt_fn(theta, is_training=False) -> Optimizer``."""

  def init(self, key: jax.Array) -> MetaParams:
    """Returns the initial meta-parameters ``theta`` (a pytree of float32 arrays)."""
    raise NotImplementedError

  def opt_fn(self, theta: MetaParams, is_training: bool = False) -> Optimizer:
    """The `Optimizer` defined by ``theta``. ``is_training`` is True while meta-training (for train-only noise)."""
    raise NotImplementedError

  def as_optax(self, theta: MetaParams) -> optax.GradientTransformationExtraArgs:
    """``opt_fn(theta)`` as an optax transformation; see `metafam.optimizers.optax_adapter`."""
    return optimizer_as_optax(self.opt_fn(theta))

  @property
  def name(self) -> str:
    return type(self).__name__

  def __repr__(self) -> str:
    return f"<LearnedOptimizer {self.name}>"


def num_meta_params(theta: MetaParams) -> int:
  """The number of scalars in ``theta``."""
  return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(theta)))


def _next_state(state: OptimizerState, params: Any, model_state: Any, opt_state: Any) -> OptimizerState:
  return OptimizerState(params=params, state=state.state if model_state is None else model_state,
                        iteration=state.iteration + 1, opt_state=opt_state)


class HandDesigned(LearnedOptimizer):
  """A fixed `Optimizer` seen as a learned optimizer with no meta-parameters (``theta == {}``).

  Lets baselines such as ``HandDesigned(Adam(3e-4))`` run through code written for learned optimizers.
  """

  def __init__(self, optimizer: Optimizer):
    if not isinstance(optimizer, Optimizer):
      raise TypeError(f"HandDesigned needs a metafam Optimizer, got {type(optimizer).__name__}.")
    self.optimizer = optimizer

  def init(self, key):
    return {}

  def opt_fn(self, theta, is_training=False):
    return self.optimizer

  @property
  def name(self) -> str:
    return f"HandDesigned({self.optimizer.name})"


# -- SGD ---------------------------------------------------------------------------------------------------------
class _ThetaSGD(Optimizer):
  """``p <- p - exp(log_lr) * g``; ``opt_state`` is the empty tuple."""

  def __init__(self, theta):
    self.theta = theta

  @property
  def name(self) -> str:
    return "LearnableSGD.opt_fn(theta)"

  def init(self, params, model_state=None, num_steps=None, key=None) -> OptimizerState:
    return OptimizerState(params=params, state=model_state, iteration=jnp.asarray(0, jnp.int32), opt_state=())

  def update(self, opt_state, grad, loss=None, model_state=None, key=None) -> OptimizerState:
    check_grad_matches(opt_state.params, grad)
    lr = jnp.exp(self.theta["log_lr"])
    params = jax.tree.map(lambda p, g: (p - lr * g).astype(p.dtype), opt_state.params, grad)
    return _next_state(opt_state, params, model_state, ())


class LearnableSGD(LearnedOptimizer):
  """Gradient descent whose learning rate is learned: ``theta = {"log_lr": f32[]}``, ``lr = exp(log_lr)``."""

  def __init__(self, initial_lr: float = 1e-2):
    if not initial_lr > 0:
      raise ValueError(f"initial_lr must be > 0, got {initial_lr!r}.")
    self.initial_lr = float(initial_lr)

  def init(self, key):
    return {"log_lr": jnp.asarray(np.log(self.initial_lr), jnp.float32)}

  def opt_fn(self, theta, is_training=False):
    return _ThetaSGD(theta)

  @property
  def name(self) -> str:
    return f"LearnableSGD(lr0={self.initial_lr:g})"


# -- Adam --------------------------------------------------------------------------------------------------------
def _logit(x: float) -> float:
  return float(np.log(x) - np.log1p(-x))


class _ThetaAdam(Optimizer):
  """Adam with hyper-parameters read from ``theta``; ``opt_state = {"mu": tree, "nu": tree}`` (first/second moments)."""

  def __init__(self, theta):
    self.theta = theta

  @property
  def name(self) -> str:
    return "LearnableAdam.opt_fn(theta)"

  def init(self, params, model_state=None, num_steps=None, key=None) -> OptimizerState:
    return OptimizerState(params=params, state=model_state, iteration=jnp.asarray(0, jnp.int32),
                          opt_state={"mu": jax.tree.map(jnp.zeros_like, params),
                                     "nu": jax.tree.map(jnp.zeros_like, params)})

  def update(self, opt_state, grad, loss=None, model_state=None, key=None) -> OptimizerState:
    check_grad_matches(opt_state.params, grad)
    hp = LearnableAdam.hyperparameters(self.theta)
    omb1, omb2 = hp["one_minus_beta1"], hp["one_minus_beta2"]
    b1, b2 = 1.0 - omb1, 1.0 - omb2
    t = (opt_state.iteration + 1).astype(jnp.float32)
    # 1 - beta^t computed from (1 - beta) without cancellation.
    corr1, corr2 = -jnp.expm1(t * jnp.log1p(-omb1)), -jnp.expm1(t * jnp.log1p(-omb2))
    mu = jax.tree.map(lambda g, m: omb1 * g + b1 * m, grad, opt_state.opt_state["mu"])
    nu = jax.tree.map(lambda g, v: omb2 * jnp.square(g) + b2 * v, grad, opt_state.opt_state["nu"])
    params = jax.tree.map(
        lambda p, m, v: (p - hp["lr"] * (m / corr1) / (jnp.sqrt(v / corr2) + hp["epsilon"])).astype(p.dtype),
        opt_state.params, mu, nu)
    return _next_state(opt_state, params, model_state, {"mu": mu, "nu": nu})


class LearnableAdam(LearnedOptimizer):
  """Adam (bias-corrected, ``epsilon`` outside the square root) with learned hyper-parameters.

  ``theta`` (all f32[] and unconstrained):
    * ``log_lr``: ``lr = exp(log_lr)``.
    * ``logit_one_minus_beta1``, ``logit_one_minus_beta2``: ``1 - beta = sigmoid(logit_one_minus_beta)``, so every
      value gives ``0 < beta < 1``. The update uses ``1 - beta`` itself (moments and the bias correction
      ``1 - beta^t = -expm1(t * log1p(-(1 - beta)))``), so a ``beta`` near 1 loses no precision to cancellation.
    * ``log_epsilon``: ``epsilon = exp(log_epsilon)``.
  """

  def __init__(self, initial_lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8):
    if not initial_lr > 0 or not epsilon > 0:
      raise ValueError(f"initial_lr and epsilon must be > 0, got {initial_lr!r} and {epsilon!r}.")
    for name, b in (("beta1", beta1), ("beta2", beta2)):
      if not 0 < b < 1:
        raise ValueError(f"{name} must lie in (0, 1), got {b!r}.")
    self.initial_lr, self.epsilon = float(initial_lr), float(epsilon)
    self.beta1, self.beta2 = float(beta1), float(beta2)

  def init(self, key):
    f32 = lambda v: jnp.asarray(v, jnp.float32)
    return {"log_lr": f32(np.log(self.initial_lr)),
            "logit_one_minus_beta1": f32(_logit(1.0 - self.beta1)),
            "logit_one_minus_beta2": f32(_logit(1.0 - self.beta2)),
            "log_epsilon": f32(np.log(self.epsilon))}

  @staticmethod
  def hyperparameters(theta) -> dict:
    """``{"lr", "beta1", "beta2", "one_minus_beta1", "one_minus_beta2", "epsilon"}`` (f32 arrays) from ``theta``."""
    omb1 = jax.nn.sigmoid(theta["logit_one_minus_beta1"])
    omb2 = jax.nn.sigmoid(theta["logit_one_minus_beta2"])
    return {"lr": jnp.exp(theta["log_lr"]), "beta1": 1.0 - omb1, "beta2": 1.0 - omb2, "one_minus_beta1": omb1,
            "one_minus_beta2": omb2, "epsilon": jnp.exp(theta["log_epsilon"])}

  def opt_fn(self, theta, is_training=False):
    return _ThetaAdam(theta)

  @property
  def name(self) -> str:
    return f"LearnableAdam(lr0={self.initial_lr:g})"

