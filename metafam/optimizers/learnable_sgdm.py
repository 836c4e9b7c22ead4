"""`LearnableSGDM`: heavy-ball SGD with momentum whose learning rate and momentum are meta-parameters.

The update is the one of `metafam.optimizers.SGDM` (and ``optax.sgd(lr, momentum=...)``)::

    m <- momentum * m + g          (m zero-initialized, kept in float32)
    p <- p - lr * m

Per-step cost: one buffer and two multiply-adds per element, below Adam's (two buffers, a square root and a
division per element); measured: docs/performance/inner-loop.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from metafam.optimizers import _features as F
from metafam.optimizers.base import Optimizer, OptimizerState, check_grad_matches
from metafam.optimizers.learned import LearnedOptimizer


class LearnableSGDM(LearnedOptimizer):
  """SGD with heavy-ball momentum and learned hyper-parameters.

  ``theta`` (f32[] each, unconstrained), 2 meta-parameters:
    * ``log_lr``: ``lr = exp(log_lr)``;
    * ``logit_one_minus_momentum``: ``1 - momentum = sigmoid(logit_one_minus_momentum)``, so every value gives
      ``0 < momentum < 1``; the update uses ``1 - momentum`` directly (no cancellation near 1).

  Meta-parameters (default config): 2. States are `OptimizerState` with ``opt_state = {"momentum": tree}``.

  Args:
    initial_lr: the initial learning rate (> 0).
    momentum: the initial momentum, in (0, 1).
  """

  def __init__(self, initial_lr: float = 1e-2, momentum: float = 0.9):
    self.initial_lr = F.check_positive("initial_lr", initial_lr)
    self.momentum = F.check_unit_interval("momentum", momentum)

  @property
  def name(self) -> str:
    return f"LearnableSGDM(lr0={self.initial_lr:g}, momentum0={self.momentum:g})"

  def init(self, key: jax.Array) -> dict:
    return {"log_lr": jnp.asarray(np.log(self.initial_lr), jnp.float32),
            "logit_one_minus_momentum": jnp.asarray(F.logit(1.0 - self.momentum), jnp.float32)}

  @staticmethod
  def hyperparameters(theta: dict) -> dict:
    """``{"lr", "momentum", "one_minus_momentum"}`` from ``theta``."""
    omm = jax.nn.sigmoid(theta["logit_one_minus_momentum"])
    return {"lr": jnp.exp(theta["log_lr"]), "momentum": 1.0 - omm, "one_minus_momentum": omm}

  def opt_fn(self, theta: dict, is_training: bool = False) -> Optimizer:
    return _SGDMOptimizer(theta)


class _SGDMOptimizer(Optimizer):
  """`LearnableSGDM` with fixed ``theta``."""

  def __init__(self, theta: dict):
    self.theta = theta

  @property
  def name(self) -> str:
    return "LearnableSGDM.opt_fn(theta)"

  def init(self, params, model_state=None, num_steps=None, key=None) -> OptimizerState:
    return F.init_state(params, model_state, {"momentum": jax.tree.map(F.zeros_like_in, params)})

  def update(self, opt_state, grad, loss=None, model_state=None, key=None) -> OptimizerState:
    check_grad_matches(opt_state.params, grad)
    hp = LearnableSGDM.hyperparameters(self.theta)

    def leaf(p, g, m):
      m_new = ((1.0 - hp["one_minus_momentum"]) * m + g).astype(m.dtype)
      return (p.astype(m.dtype) - hp["lr"] * m_new).astype(p.dtype), m_new

    params, momentum = F.map_leaves(leaf, opt_state.params, grad, opt_state.opt_state["momentum"], num_outputs=2)
    return F.next_state(opt_state, params, model_state, {"momentum": momentum})
