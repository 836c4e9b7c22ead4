"""Influence balancing (Tallec & Ollivier 2017), the PES paper's known-answer problem, as a metafam family."""

import jax.numpy as jnp
import numpy as np

from metafam.optimizers.base import Optimizer, OptimizerState
from metafam.taskfamilies.base import single_task_to_family
from metafam.tasks.base import Task

N_UNITS, N_POS = 23, 10
A = 0.5 * np.eye(N_UNITS) + 0.5 * np.eye(N_UNITS, k=1)
SIGN = np.concatenate([np.ones(N_POS), -np.ones(N_UNITS - N_POS)]).astype(np.float32)
OPTIMUM = -1.0 / 6.0


class InfluenceTask(Task):
  """params = the state s (23 units, s0 = ones); loss 0.5 * (s[0] - 1)^2."""

  def init(self, key):
    return jnp.ones((N_UNITS,), jnp.float32)

  def loss(self, params, key, batch):
    return 0.5 * (params[0] - 1.0) ** 2


class _Dynamics(Optimizer):
  def __init__(self, theta):
    self.theta = theta

  def init(self, params, model_state=None, num_steps=None, key=None):
    return OptimizerState(params, model_state, jnp.asarray(0, jnp.int32), ())

  def update(self, state, grad, loss=None, model_state=None, key=None):
    s = jnp.asarray(A, jnp.float32) @ state.params + self.theta["theta"] * SIGN
    return OptimizerState(s, state.state, state.iteration + 1, ())


class InfluenceDynamics:
  """The 'learned optimizer' of influence balancing: s <- A s + theta * sign (the gradient is ignored)."""

  def __init__(self, theta0=0.5):
    self.theta0 = theta0

  def init(self, key):
    return {"theta": jnp.asarray(self.theta0, jnp.float32)}

  def opt_fn(self, theta, is_training=False):
    return _Dynamics(theta)


def influence_family():
  return single_task_to_family(InfluenceTask())
