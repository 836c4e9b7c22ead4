"""A custom task and task family in plain JAX, trained as a vmapped batch of instances.

    python examples/custom_task_family.py

The family samples a linear-regression problem per instance (true weights and a noise level) as a static-shape
config; 64 instances train with Adam in one jitted `lax.scan` over `vmap`.
"""

import jax
import jax.numpy as jnp

from metafam.optimizers import Adam
from metafam.taskfamilies import TaskFamily, check_family
from metafam.tasks import Task


class LinearRegression(Task):
  """Least squares on a fresh random batch each step: y = x @ w_true + noise."""

  def __init__(self, cfg, dim):
    self.cfg, self.dim = cfg, dim

  def init(self, key):
    return {"w": jnp.zeros((self.dim,)), "b": jnp.zeros(())}

  def loss(self, params, key, batch):
    kx, kn = jax.random.split(key)
    x = jax.random.normal(kx, (32, self.dim))
    y = x @ self.cfg["w_true"] + self.cfg["noise"] * jax.random.normal(kn, (32,))
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


class LinearRegressionFamily(TaskFamily):

  def __init__(self, dim=5):
    super().__init__()
    self.dim = dim

  def sample(self, key):
    k1, k2 = jax.random.split(key)
    return {"w_true": jax.random.normal(k1, (self.dim,)), "noise": jax.random.uniform(k2, (), minval=0.0, maxval=0.5)}

  def task_fn(self, cfg):
    return LinearRegression(cfg, self.dim)


def main(num_tasks=64, num_steps=300):
  family = LinearRegressionFamily()
  check_family(family)  # static shapes, vmappable, finite losses and grads
  opt = Adam(0.05)
  keys = jax.random.split(jax.random.key(0), num_tasks)
  cfgs = jax.vmap(family.sample)(keys)
  states = jax.vmap(lambda c, k: opt.init(family.task_fn(c).init(k)))(cfgs, keys)

  @jax.jit
  def train(states):
    def step(states, key):
      def one(cfg, state, k):
        loss, grad = jax.value_and_grad(family.task_fn(cfg).loss)(opt.get_params(state), k, None)
        return opt.update(state, grad, loss=loss), loss
      return jax.vmap(one)(cfgs, states, jax.random.split(key, num_tasks))
    return jax.lax.scan(step, states, jax.random.split(jax.random.key(1), num_steps))

  states, losses = train(states)
  # Training reaches the noise floor: the remaining loss is about noise^2.
  floor = jnp.mean(cfgs["noise"] ** 2)
  print(f"{num_tasks} instances: mean loss {float(losses[0].mean()):.3f} -> {float(losses[-20:].mean()):.4f} "
        f"(noise floor {float(floor):.4f})")
  return losses, floor


if __name__ == "__main__":
  main()
