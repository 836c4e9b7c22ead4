"""Evaluating (learned) optimizers on held-out instances of a task family, and tuned Adam as their baseline.

Both run on `TruncatedStep`: ``num_tasks`` fresh instances (sampled with ``key``) train on ``train`` for
``num_steps`` steps, and after each update the params are scored on ``split`` (normalized by the task). The same key
gives the same instances and batches, so curves of different optimizers are directly comparable.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam.inner import sharding
from metafam.inner.schedules import ConstantSchedule
from metafam.inner.truncated_step import TruncatedStep
from metafam.optimizers.learned import LearnableAdam

DEFAULT_ADAM_LRS = tuple(float(x) for x in np.logspace(-4, -1, 7))


def _curves(step: TruncatedStep, theta: Any, key: jax.Array, num_steps: int, theta_is_batched: bool,
            data: Any) -> jax.Array:
  """``[num_steps, num_tasks]`` normalized split losses after each update (non-finite steps -> inf)."""
  k_init, k_unroll = jax.random.split(key)
  lanes = step.init_fn(theta, k_init, theta_is_batched=theta_is_batched)
  _, out = step.unroll_fn(theta, lanes, jax.random.split(k_unroll, num_steps), data,
                          theta_is_batched=theta_is_batched)
  return jnp.where(out.mask > 0, out.normalized_meta_loss, jnp.inf)


class FamilyEvaluator:
  """Scores optimizers on ``num_tasks`` held-out instances of ``family`` over ``num_steps`` steps.

  Programs are compiled once per evaluator and theta structure; `evaluate` and `tune_adam` are jitted. With
  ``devices`` (as in `TruncatedStep`: a count or a sequence of devices; ``num_tasks`` must divide evenly) the
  instances are spread over the devices, with the same numbers up to float rounding.
  """

  def __init__(self, family, num_tasks: int = 8, num_steps: int = 100, split: str = "test",
               select_split: str = "inner_valid", adam_lrs: Sequence[float] = DEFAULT_ADAM_LRS, devices: Any = None):
    self.family, self.num_tasks, self.num_steps, self.split = family, num_tasks, num_steps, split
    self.select_split = select_split
    self.adam_lrs = tuple(float(lr) for lr in adam_lrs)
    if not self.adam_lrs or min(self.adam_lrs) <= 0:
      raise ValueError(f"adam_lrs must be positive learning rates, got {adam_lrs!r}.")
    self.devices = devices
    self.mesh = sharding.lane_mesh(devices, num_tasks)  # checks devices and num_tasks before any compilation
    self._adam = LearnableAdam()
    self._jitted = {}

  def _program(self, learned_opt, split: str, groups: int, theta_is_batched: bool):
    cache_key = (id(learned_opt), split, groups, theta_is_batched)
    if cache_key not in self._jitted:
      step = TruncatedStep(self.family, learned_opt, groups * self.num_tasks, ConstantSchedule(self.num_steps),
                           meta_loss_split=split, lane_groups=groups, donate=False, devices=self.devices)
      fn = jax.jit(lambda theta, key, data: _curves(step, theta, key, self.num_steps, theta_is_batched, data))
      self._jitted[cache_key] = (learned_opt, step, fn)  # keeps learned_opt alive while its id is a key
    _, step, fn = self._jitted[cache_key]
    return step, fn

  def evaluate(self, learned_opt: Any, theta: Any, key: jax.Array) -> np.ndarray:
    """``[num_steps]``: the mean over instances of the normalized ``split`` loss after each step."""
    step, fn = self._program(learned_opt, self.split, 1, False)
    return np.asarray(jnp.mean(fn(step.place_theta(theta), sharding.put_replicated(key, self.mesh), step.data),
                               axis=1))

  def tune_adam(self, key: jax.Array) -> Dict[str, Any]:
    """Adam with each of ``adam_lrs`` on the same instances (one vmapped program over lrs x instances).

    The lr with the lowest mean ``select_split`` loss over the last 10% of steps wins (diverged lrs never do); its
    curve on ``split`` is returned with the choice: ``{"best_lr", "curve", "select_scores"}``.
    """
    n_lr, n = len(self.adam_lrs), self.num_tasks
    base = self._adam.init(None)
    theta = jax.tree.map(lambda x: jnp.broadcast_to(x, (n_lr * n,) + jnp.shape(x)), base)
    theta = dict(theta, log_lr=jnp.repeat(jnp.log(jnp.asarray(self.adam_lrs, jnp.float32)), n))
    # One lane group per lr: lane j * n + i sees the instance and batches of lane i in `evaluate`.
    select_step, select_fn = self._program(self._adam, self.select_split, n_lr, True)
    scores = select_fn(select_step.place_theta(theta, theta_is_batched=True), sharding.put_replicated(key, self.mesh),
                       select_step.data)
    scores = np.asarray(scores).reshape(self.num_steps, n_lr, n)
    tail = max(1, self.num_steps // 10)
    per_lr = np.nan_to_num(scores[-tail:].mean(axis=(0, 2)), nan=np.inf)
    best = int(np.argmin(per_lr))
    best_theta = dict(base, log_lr=jnp.log(jnp.float32(self.adam_lrs[best])))
    return {"best_lr": self.adam_lrs[best], "curve": self.evaluate(self._adam, best_theta, key),
            "select_scores": per_lr}
