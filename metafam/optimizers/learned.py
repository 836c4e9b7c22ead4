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

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam._checks import check_number
from metafam.optimizers.base import Optimizer, OptimizerState, check_grad_matches
from metafam.optimizers.optax_adapter import optimizer_as_optax
from metafam.tasks._nn import num_params

MetaParams = Any


class LearnedOptimizer:
  """Base class: ``init(key) -> theta`` and ``opt_fn(theta, is_training=False) -> Optimizer``.

  ``lane_chunk``: vectorized training (`metafam.inner.TruncatedStep`) applies this optimizer's update to this many
  lanes at a time when it trains more (None: all lanes in one vmap). Per-parameter MLP optimizers set it, so that
  one block's feature and hidden tensors stay in cache (docs/performance/inner-loop.md, "Flat lane scaling"); the
  numbers change only by float rounding.

  ``low_rank_weights``: ``opt_fn`` accepts a theta whose 2-D leaves are `metafam.optimizers.low_rank.Perturbed`
  (shared weights plus one lane's low-rank ES perturbation) and never forms the perturbed matrices; vectorized
  training hands other learned optimizers dense weights (`metafam.inner.TruncatedStep.opt_fn`).
  """

  lane_chunk: Optional[int] = None
  low_rank_weights: bool = False

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
  return num_params(theta)


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
    self.initial_lr = float(check_number("initial_lr", initial_lr, low=0.0, low_open=True))

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


@jax.custom_jvp
def sqrt_zero_safe(x: jax.Array) -> jax.Array:
  """``jnp.sqrt(x)`` (the same operation), whose derivative at ``x == 0`` is 0 instead of ``inf``.

  Adam's second moment is exactly 0 wherever every gradient so far was 0 (dead ReLU units, unused embeddings), and
  there the pullback of ``sqrt`` multiplies a zero cotangent by ``inf``: the meta-gradient turned NaN. Elsewhere
  the derivative is JAX's own, ``t * (0.5 / sqrt(x))``; at 0 it is 0 (the update does not depend on ``v`` where
  the first moment is 0 too).
  """
  return jnp.sqrt(x)


@sqrt_zero_safe.defjvp
def _sqrt_zero_safe_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  ans = jnp.sqrt(x)
  return ans, t * (0.5 / jnp.where(ans == 0, jnp.inf, ans))


@jax.custom_jvp
def log1p_neg_safe(x: jax.Array) -> jax.Array:
  """``jnp.log1p(-x)`` (the same operation), whose derivative at ``x == 1`` (value -inf) is 0 instead of NaN."""
  return jnp.log1p(-x)


@log1p_neg_safe.defjvp
def _log1p_neg_safe_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  one_minus_x = 1 - x
  return jnp.log1p(-x), -t / jnp.where(one_minus_x == 0, jnp.inf, one_minus_x)


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
    # log1p_neg_safe: at a saturated sigmoid (1 - beta == 1, beta == 0) the correction is 1 with derivative 0.
    corr1, corr2 = -jnp.expm1(t * log1p_neg_safe(omb1)), -jnp.expm1(t * log1p_neg_safe(omb2))
    # The moments keep their dtype (f32 hyper-parameters would promote bf16 moments, changing the state's type).
    mu = jax.tree.map(lambda g, m: (omb1 * g + b1 * m).astype(m.dtype), grad, opt_state.opt_state["mu"])
    nu = jax.tree.map(lambda g, v: (omb2 * jnp.square(g) + b2 * v).astype(v.dtype), grad, opt_state.opt_state["nu"])
    params = jax.tree.map(
        lambda p, m, v: (p - hp["lr"] * (m / corr1) / (sqrt_zero_safe(v / corr2) + hp["epsilon"])).astype(p.dtype),
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
    positive = dict(low=0.0, low_open=True)
    self.initial_lr = float(check_number("initial_lr", initial_lr, **positive))
    self.epsilon = float(check_number("epsilon", epsilon, **positive))
    self.beta1 = float(check_number("beta1", beta1, low=0.0, high=1.0, low_open=True, high_open=True))
    self.beta2 = float(check_number("beta2", beta2, low=0.0, high=1.0, low_open=True, high_open=True))

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

