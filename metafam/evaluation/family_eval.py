"""Evaluating (learned) optimizers on held-out instances of a task family, and tuned Adam as their baseline.

Both run on `TruncatedStep`: ``num_tasks`` fresh instances (sampled with ``key``) train on ``train`` for
``num_steps`` steps, and after each update the params are scored on ``split`` (normalized by the task). The same key
gives the same instances and batches, so curves of different optimizers are directly comparable.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam._checks import check_positive_int
from metafam._identity import IdentityCache, held_weakly
from metafam.evaluation import tuning
from metafam.inner import sharding
from metafam.inner.schedules import ConstantSchedule
from metafam.inner.truncated_step import TruncatedStep
from metafam.optimizers.base import Optimizer
from metafam.optimizers.learned import LearnableAdam

DEFAULT_ADAM_LRS = tuple(float(x) for x in tuning.default_learning_rates())  # the shared grid: 1e-4, ..., 1e-1


def _curves(step: TruncatedStep, theta: Any, key: jax.Array, num_steps: int, theta_is_batched: bool) -> jax.Array:
  """``[num_steps, num_tasks]`` normalized split losses after each update (non-finite steps -> inf)."""
  k_init, k_unroll = jax.random.split(key)
  lanes = step.init_fn(theta, k_init, theta_is_batched=theta_is_batched)
  _, out = step.unroll_fn(theta, lanes, jax.random.split(k_unroll, num_steps), theta_is_batched=theta_is_batched)
  return jnp.where(out.mask > 0, out.normalized_meta_loss, jnp.inf)


class _WeakLearnedOpt:
  """Stands in for a learned optimizer (or a plain `Optimizer`) in cached programs, holding it by weak reference.

  A program is only traced while its caller holds the optimizer, so the cache never keeps a dead one alive.
  """
  __slots__ = ("_ref",)

  def __init__(self, learned_opt: Any):
    self._ref = held_weakly(learned_opt)

  @property
  def lane_chunk(self):
    return getattr(self._ref(), "lane_chunk", None)

  def opt_fn(self, theta: Any, is_training: bool = False) -> Any:
    opt = self._ref()
    if isinstance(opt, Optimizer):
      return opt
    return opt.opt_fn(theta, is_training=True) if is_training else opt.opt_fn(theta)


class FamilyEvaluator:
  """Scores optimizers on ``num_tasks`` held-out instances of ``family`` over ``num_steps`` steps.

  Programs are compiled once per evaluator, optimizer (by identity) and theta structure, and cached without keeping
  a learned optimizer alive after its last use (see `metafam._identity`). `evaluate`, `instance_curves` and
  `tune_adam` are jitted. With ``devices`` (as in `TruncatedStep`: a count or a sequence of devices; ``num_tasks``
  must divide evenly) the instances are spread over the devices, with the same numbers up to float rounding.
  """

  def __init__(self, family, num_tasks: int = 8, num_steps: int = 100, split: str = "test",
               select_split: str = "inner_valid", adam_lrs: Sequence[float] = DEFAULT_ADAM_LRS, devices: Any = None):
    self.family, self.num_tasks, self.num_steps, self.split = family, num_tasks, num_steps, split
    self.select_split = select_split
    try:
      self.adam_lrs = tuple(float(lr) for lr in tuning.check_learning_rates(adam_lrs))  # ascending
    except ValueError:
      raise ValueError(f"adam_lrs must be positive learning rates (distinct and finite), got {adam_lrs!r}.") from None
    self.devices = devices
    self.mesh = sharding.lane_mesh(devices, num_tasks)  # checks devices and num_tasks before any compilation
    self.adam = LearnableAdam()  # the Adam that tune_adam tunes (reusing it reuses its compiled programs)
    self._programs = IdentityCache()

  def _program(self, learned_opt, split: str, groups: int, theta_is_batched: bool, num_steps: int):
    def build():
      step = TruncatedStep(self.family, _WeakLearnedOpt(learned_opt), groups * self.num_tasks,
                           ConstantSchedule(num_steps), meta_loss_split=split, lane_groups=groups, donate=False,
                           devices=self.devices, is_training=False)
      # The step is an argument (a pytree of its device data), so the data are program inputs, not constants.
      return step, jax.jit(lambda step, theta, key: _curves(step, theta, key, num_steps, theta_is_batched))
    return self._programs.get(learned_opt, (split, groups, theta_is_batched, num_steps), build)

  def _run(self, learned_opt: Any, theta: Any, key: jax.Array, num_steps: Optional[int] = None) -> jax.Array:
    step, fn = self._program(learned_opt, self.split, 1, False, self.num_steps if num_steps is None else num_steps)
    return fn(step, step.place_theta(theta), sharding.place(key, self.mesh, lane_major=False))

  def evaluate(self, learned_opt: Any, theta: Any, key: jax.Array) -> np.ndarray:
    """``[num_steps]``: the mean over instances of the normalized ``split`` loss after each step."""
    return np.asarray(jnp.mean(self._run(learned_opt, theta, key), axis=1))

  def instance_curves(self, learned_opt: Any, theta: Any, key: jax.Array,
                      num_steps: Optional[int] = None) -> np.ndarray:
    """``f64[num_steps, num_tasks]``: per-instance normalized ``split`` loss after each step (inf where a step went
    non-finite); `evaluate` is their mean over instances (same program, instances and batches). ``num_steps``: train
    that many steps instead of the evaluator's (the same instances; a longer run's first steps draw the same keys),
    compiled once per length like the evaluator's own programs."""
    if num_steps is not None:
      check_positive_int("num_steps", num_steps)
    return np.asarray(self._run(learned_opt, theta, key, num_steps), np.float64)

  def tune_adam(self, key: jax.Array) -> Dict[str, Any]:
    """Adam with each of ``adam_lrs`` on the same instances (one vmapped program over lrs x instances).

    Rates are tuned by `metafam.evaluation.tuning.tune` (one constant schedule, no grid extension), which chooses
    by `metafam.evaluation.tuning.select_best` on the per-step ``select_split`` curves (eval points 1..num_steps,
    scored over the last ``max(1, num_steps // 10)`` steps): a rate with a non-finite step on any instance, however
    early, has diverged and is never chosen; ties go to the smaller rate. The chosen
    rate's curve on ``split`` is returned with the choice: ``{"best_lr", "curve", "select_scores" (f64[L], inf where
    diverged), "diverged" (bool[L])}``.

    Raises:
      RuntimeError: every rate diverged (lower the grid, ``adam_lrs``).
    """
    n, base = self.num_tasks, self.adam.init(None)

    def train(lrs, schedules):
      # One lane group per lr: lane j * n + i sees the instance and batches of lane i in `evaluate`.
      theta = jax.tree.map(lambda x: jnp.broadcast_to(x, (len(lrs) * n,) + jnp.shape(x)), base)
      theta = dict(theta, log_lr=jnp.repeat(jnp.log(jnp.asarray(lrs, jnp.float32)), n))
      step, fn = self._program(self.adam, self.select_split, len(lrs), True, self.num_steps)
      curves = fn(step, step.place_theta(theta, theta_is_batched=True),
                  sharding.place(key, self.mesh, lane_major=False))
      curves = np.asarray(curves).reshape(self.num_steps, len(lrs), n).transpose(1, 2, 0)  # [L, instances, T]
      return {"constant": tuning.Lanes({self.select_split: curves})}
    tail = tuning.last_steps_fraction(self.num_steps, max(1, self.num_steps // 10))
    tuned = tuning.tune(train, self.adam_lrs, np.arange(1, self.num_steps + 1), tail_fraction=tail,
                        selection_split=self.select_split)
    best = tuned.best_index
    if best < 0:
      raise RuntimeError(f"tuned Adam: every learning rate in {self.adam_lrs} diverged on {self.select_split} of "
                         f"{getattr(self.family, 'name', type(self.family).__name__)}; give the evaluator smaller "
                         f"adam_lrs.")
    best_theta = dict(base, log_lr=jnp.log(jnp.float32(self.adam_lrs[best])))
    return {"best_lr": self.adam_lrs[best], "curve": self.evaluate(self.adam, best_theta, key),
            "select_scores": tuned.scores["constant"], "diverged": tuned.diverged["constant"]}
