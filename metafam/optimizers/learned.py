"""Learned optimizers: meta-parameters ``theta`` and the `Optimizer` they define.

A `LearnedOptimizer` has ``init(key) -> theta`` (a pytree of float32 arrays, the meta-parameters) and
``opt_fn(theta, is_training=False) -> Optimizer``. The returned object is an ordinary
`metafam.optimizers.base.Optimizer` (states carry the params), so hand-designed and learned optimizers are
interchangeable: whatever trains with `SGD` or `Adam` trains with ``lopt.opt_fn(theta)``.

``opt_fn`` only closes over ``theta``, so it may be called inside `jit`, `vmap` (with ``theta`` shared or batched
along a leading axis) and `jax.grad` (meta-gradients flow into ``theta`` through any unroll of ``update``).

A learned optimizer implements the contract of `metafam.optimizers.contract`: ``init_accumulators(p)`` and
``leaf_step(theta, count)`` for one tensor (plus, for global features, ``init_extras`` / ``prepare_step``); its
``as_optax(theta)`` (an `optax.GradientTransformationExtraArgs`) and ``opt_fn(theta)`` are built from them.

Built here: `LearnableSGD` and `LearnableAdam` (hyper-parameters as meta-parameters) and `HandDesigned` (any fixed
`Optimizer`, no meta-parameters). The per-parameter MLP optimizer lives in `metafam.optimizers.mlp_lopt`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam._checks import check_number
from metafam.optimizers import contract
from metafam.optimizers._features import logit
from metafam.optimizers.base import Optimizer, OptaxOptimizer
from metafam.tasks._nn import num_params

MetaParams = Any


class LearnedOptimizer:
  """Base class: ``init(key) -> theta`` and the contract of `metafam.optimizers.contract` (``init_accumulators``,
  ``leaf_step``; optionally ``init_extras`` / ``prepare_step``), from which ``opt_fn(theta, is_training=False) ->
  Optimizer`` and ``as_optax(theta)`` follow. A subclass may instead override ``opt_fn`` (`HandDesigned`).

  ``lane_chunk``: vectorized training (`metafam.inner.TruncatedStep`) applies this optimizer's update to this many
  lanes at a time when it trains more (None: all lanes in one vmap). Per-parameter MLP optimizers set it, so that
  one block's feature and hidden tensors stay in cache (docs/performance/inner-loop.md, "Flat lane scaling"); the
  numbers change only by float rounding.

  ``low_rank_weights``: ``opt_fn`` accepts a theta whose 2-D leaves are `metafam.optimizers.low_rank.Perturbed`
  (shared weights plus one lane's low-rank ES perturbation) and never forms the perturbed matrices; vectorized
  training hands other learned optimizers dense weights (`metafam.inner.TruncatedStep.opt_fn`).

  ``has_extras``: the optimizer keeps global state (``init_extras``); ``opt_fn``'s ``opt_state`` is then
  ``{"accumulators": tree, **extras}``.
  """

  lane_chunk: Optional[int] = None
  low_rank_weights: bool = False
  has_extras: bool = False

  def init(self, key: jax.Array) -> MetaParams:
    """Returns the initial meta-parameters ``theta`` (a pytree of float32 arrays)."""
    raise NotImplementedError

  # -- the contract ---------------------------------------------------------------------------------------------
  def init_accumulators(self, p: jax.Array) -> Any:
    """The zero accumulators of one tensor ``p`` (any pytree)."""
    raise NotImplementedError(f"{self.name} implements neither init_accumulators nor opt_fn.")

  def leaf_step(self, theta: MetaParams, count: jax.Array, **kwargs):
    """``f(p, g, acc) -> (step, new acc)``: the update of one tensor at update ``count`` (int32, 0-based); ``step``
    in the compute dtype, subtracted from ``p``."""
    raise NotImplementedError(f"{self.name} implements neither leaf_step nor prepare_step.")

  def init_extras(self, theta: MetaParams, params: Any, num_steps: Any) -> Dict[str, Any]:
    """The optimizer's global state at init (default: none)."""
    return {}

  def prepare_step(self, theta: MetaParams, count: jax.Array, params: List[jax.Array], grads: List[jax.Array],
                   accumulators: List[Any], extras: Dict[str, Any], loss: Any) -> Tuple[contract.LeafFn, Any]:
    """The per-step hook: ``(f(i, p, g, acc) -> (step, new acc), new extras)`` from every tensor at once (lists in
    ``jax.tree.leaves`` order). Default: ``leaf_step``'s function for every tensor, the extras unchanged."""
    leaf = self.leaf_step(theta, count, **contract.horizon_arg(self, extras))
    return (lambda i, p, g, acc: leaf(p, g, acc)), extras

  def opt_fn(self, theta: MetaParams, is_training: bool = False) -> Optimizer:
    """The `Optimizer` defined by ``theta``. ``is_training`` is True while meta-training (for train-only noise)."""
    return contract.ThetaOptimizer(self, theta)

  def as_optax(self, theta: MetaParams, num_steps: Optional[int] = None) -> optax.GradientTransformationExtraArgs:
    """The optimizer with fixed ``theta`` as an optax transformation (`metafam.optimizers.contract.learned_optax`);
    ``num_steps``: the run's length, for an optimizer whose step or features read it."""
    return contract.learned_optax(self, theta, num_steps)

  @property
  def name(self) -> str:
    return type(self).__name__

  def __repr__(self) -> str:
    return f"<LearnedOptimizer {self.name}>"


def as_optax(lopt: LearnedOptimizer, theta: MetaParams, num_steps: Optional[int] = None
             ) -> optax.GradientTransformationExtraArgs:
  """``lopt.as_optax(theta, num_steps)``: the learned optimizer with fixed ``theta`` as an optax transformation."""
  return lopt.as_optax(theta, num_steps)


def num_meta_params(theta: MetaParams) -> int:
  """The number of scalars in ``theta``."""
  return num_params(theta)


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

  def as_optax(self, theta, num_steps=None):
    """The wrapped `OptaxOptimizer`'s transformation (other optimizers have no optax face: TypeError)."""
    if not isinstance(self.optimizer, OptaxOptimizer):
      raise TypeError(f"HandDesigned({self.optimizer.name}).as_optax needs an OptaxOptimizer; use its .tx.")
    return self.optimizer.tx

  @property
  def name(self) -> str:
    return f"HandDesigned({self.optimizer.name})"


# -- SGD ---------------------------------------------------------------------------------------------------------
class LearnableSGD(LearnedOptimizer):
  """Gradient descent whose learning rate is learned: ``theta = {"log_lr": f32[]}``, ``lr = exp(log_lr)``; no
  accumulators."""

  def __init__(self, initial_lr: float = 1e-2):
    self.initial_lr = float(check_number("initial_lr", initial_lr, low=0.0, low_open=True))

  def init(self, key):
    return {"log_lr": jnp.asarray(np.log(self.initial_lr), jnp.float32)}

  def init_accumulators(self, p):
    return ()

  def leaf_step(self, theta, count):
    lr = jnp.exp(theta["log_lr"])
    return lambda p, g, acc: (lr * g, ())

  @property
  def name(self) -> str:
    return f"LearnableSGD(lr0={self.initial_lr:g})"


# -- Adam --------------------------------------------------------------------------------------------------------
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


class LearnableAdam(LearnedOptimizer):
  """Adam (bias-corrected, ``epsilon`` outside the square root) with learned hyper-parameters.

  ``theta`` (all f32[] and unconstrained):
    * ``log_lr``: ``lr = exp(log_lr)``.
    * ``logit_one_minus_beta1``, ``logit_one_minus_beta2``: ``1 - beta = sigmoid(logit_one_minus_beta)``, so every
      value gives ``0 < beta < 1``. The update uses ``1 - beta`` itself (moments and the bias correction
      ``1 - beta^t = -expm1(t * log1p(-(1 - beta)))``), so a ``beta`` near 1 loses no precision to cancellation.
    * ``log_epsilon``: ``epsilon = exp(log_epsilon)``.

  Accumulators per tensor: ``{"mu", "nu"}`` (first / second moments, in the param's dtype).
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
            "logit_one_minus_beta1": f32(logit(1.0 - self.beta1)),
            "logit_one_minus_beta2": f32(logit(1.0 - self.beta2)),
            "log_epsilon": f32(np.log(self.epsilon))}

  @staticmethod
  def hyperparameters(theta) -> dict:
    """``{"lr", "beta1", "beta2", "one_minus_beta1", "one_minus_beta2", "epsilon"}`` (f32 arrays) from ``theta``."""
    omb1 = jax.nn.sigmoid(theta["logit_one_minus_beta1"])
    omb2 = jax.nn.sigmoid(theta["logit_one_minus_beta2"])
    return {"lr": jnp.exp(theta["log_lr"]), "beta1": 1.0 - omb1, "beta2": 1.0 - omb2, "one_minus_beta1": omb1,
            "one_minus_beta2": omb2, "epsilon": jnp.exp(theta["log_epsilon"])}

  def init_accumulators(self, p):
    return {"mu": jnp.zeros_like(p), "nu": jnp.zeros_like(p)}

  def leaf_step(self, theta, count):
    hp = LearnableAdam.hyperparameters(theta)
    omb1, omb2 = hp["one_minus_beta1"], hp["one_minus_beta2"]
    b1, b2 = 1.0 - omb1, 1.0 - omb2
    t = (count + 1).astype(jnp.float32)
    # 1 - beta^t computed from (1 - beta) without cancellation.
    # log1p_neg_safe: at a saturated sigmoid (1 - beta == 1, beta == 0) the correction is 1 with derivative 0.
    corr1, corr2 = -jnp.expm1(t * log1p_neg_safe(omb1)), -jnp.expm1(t * log1p_neg_safe(omb2))

    def leaf(p, g, acc):
      # The moments keep their dtype (f32 hyper-parameters would promote bf16 moments, changing the state's type).
      mu = (omb1 * g + b1 * acc["mu"]).astype(acc["mu"].dtype)
      nu = (omb2 * jnp.square(g) + b2 * acc["nu"]).astype(acc["nu"].dtype)
      return hp["lr"] * (mu / corr1) / (sqrt_zero_safe(nu / corr2) + hp["epsilon"]), {"mu": mu, "nu": nu}
    return leaf

  @property
  def name(self) -> str:
    return f"LearnableAdam(lr0={self.initial_lr:g})"
