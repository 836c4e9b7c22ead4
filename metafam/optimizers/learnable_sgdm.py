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
from metafam.optimizers.learned import LearnedOptimizer


class LearnableSGDM(LearnedOptimizer):
  """SGD with heavy-ball momentum and learned hyper-parameters.

  ``theta`` (f32[] each, unconstrained), 2 meta-parameters:
    * ``log_lr``: ``lr = exp(log_lr)``;
    * ``logit_one_minus_momentum``: ``1 - momentum = sigmoid(logit_one_minus_momentum)``, so every value gives
      ``0 < momentum < 1``; the update uses ``1 - momentum`` directly (no cancellation near 1).

  Meta-parameters (default config): 2. Accumulators per tensor: ``{"momentum"}`` (compute dtype).

  Args:
    initial_lr: the initial learning rate (> 0).
    momentum: the initial momentum, in (0, 1).
  """

  def __init__(self, initial_lr: float = 1e-2, momentum: float = 0.9):
    self.initial_lr = F.check_positive_float("initial_lr", initial_lr)
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

  def init_accumulators(self, p: jax.Array) -> dict:
    return {"momentum": F.zeros_like_in(p)}

  def leaf_step(self, theta: dict, count: jax.Array):
    hp = LearnableSGDM.hyperparameters(theta)

    def leaf(p, g, acc):
      m = acc["momentum"]
      m_new = ((1.0 - hp["one_minus_momentum"]) * m + g).astype(m.dtype)
      return hp["lr"] * m_new, {"momentum": m_new}
    return leaf
