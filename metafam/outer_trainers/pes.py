"""The persistent ES estimators: `PES` (Vicol et al. 2021) and `NoiseReuseES` (Li et al. 2023, ES-Single).

Each antithetic pair keeps its particles' inner states across truncations (`PESWorkerState`), with the bookkeeping
of the perturbations that shaped the trajectory it is on; they share the ES arguments and the paired layout of
`metafam.outer_trainers.estimators` (the module docstring there: meta-loss, non-finite steps, ``unroll_info``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp

from metafam._checks import check_positive
from metafam.inner import pairs
from metafam.inner.lane_step import LaneState
from metafam.inner.truncated_step import TruncatedStep
from metafam.outer_trainers.base import (GradientEstimate, dense_perturbations, nonfinite_metrics, step_losses,
                                         weighted_noise_sum, zero_perturbations)
from metafam.outer_trainers.estimators import _AntitheticES, _positive_lanes

_NEVER_RESAMPLED = 2 ** 30


def _per_pair_where(pred: jax.Array, a: Any, b: Any) -> Any:
  """``where(pred[i], a[i], b[i])`` for pytrees with a leading pair axis."""
  return jax.tree.map(lambda x, y: jnp.where(pred.reshape(pred.shape + (1,) * (x.ndim - 1)), x, y), a, b)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PESWorkerState:
  """PES worker state.

  Attributes:
    lanes: `LaneState` of the ``2 * num_tasks`` antithetic lanes (``theta + eps`` first, ``theta - eps`` second).
    accumulator: theta-shaped ``[num_tasks, ...]``: the sum of the distinct perturbations applied to each pair's
      current trajectory before this truncation (0 for a fresh trajectory). Dense also with low-rank noise: a sum
      of k rank-r perturbations has rank up to k r, unbounded over a trajectory; it never enters the unroll, and
      adding a perturbation to it costs one ``a @ b.T`` per pair and estimate.
    eps: ``[num_tasks, ...]``, each pair's current perturbation; with ``perturbation="low_rank"`` its matrices
      are `metafam.optimizers.low_rank.LowRank` factors ``a [num_tasks, m, r]``, ``b [num_tasks, n, r]`` (what
      noise reuse reuses).
    age: int32 ``[num_tasks]``, truncations the current ``eps`` has been used for in the current trajectory
      (0: resample at the next truncation).
  """
  lanes: LaneState
  accumulator: Any
  eps: Any
  age: jax.Array

  @property
  def pos_state(self) -> LaneState:
    """``lanes`` under learned_optimization's name (`metafam.compat.learned_optimization`)."""
    return self.lanes


class PES(_AntitheticES):
  """Persistent evolution strategies (Vicol et al. 2021) with optional noise reuse (Li et al. 2023).

  Each antithetic pair keeps its own inner states (one per particle) across truncations. In a truncation the pair
  applies ``theta +- eps``; a step of the trajectory that was already running when the truncation began is weighted
  by ``accumulator + eps`` (every perturbation that shaped it), a step of a trajectory that started inside the
  truncation (from its ``is_new_trajectory`` step on) by ``eps`` alone. The estimate is the mean over pairs of the
  masked mean over steps of ``weight * (L+ - L-)``, divided by ``2 sigma^2``. The accumulator restarts exactly at
  the new-trajectory step; the step before it (``is_done``) still belongs to, and is credited to, the old one.

  ``resample_every = K``: a pair draws a new ``eps`` every K truncations of a trajectory (and after a trajectory
  restarts) and otherwise reuses it; reused noise is counted once in the accumulator. ``K = 1`` is PES; ``K = None``
  keeps one perturbation for a whole trajectory: noise-reuse ES, whose variance does not grow with the number of
  truncations.
  """

  name = "pes"
  nonfinite_unit = "pair-steps"

  def __init__(self, truncated_step: TruncatedStep, unroll_length: int = 20, *, resample_every: Optional[int] = 1,
               **es_args: Any):
    self.unroll_length = check_positive("unroll_length", unroll_length, integer=True)
    if resample_every is not None:
      check_positive("resample_every", resample_every, integer=True)
    self.resample_every = resample_every
    super().__init__(truncated_step, **es_args)

  @property
  def inner_steps_per_estimate(self) -> int:
    return 2 * self.num_tasks * self.unroll_length

  def lane_major(self, worker_state: PESWorkerState) -> PESWorkerState:
    """The lanes are split over the devices; so are the per-pair accumulators, perturbations and ages when every
    device holds whole pairs (each device keeps its own pairs' bookkeeping, and the estimate needs one
    cross-device sum), else they are replicated."""
    flags = lambda tree, value: jax.tree.map(lambda _: value, tree)
    per_pair = self.step.whole_pairs_per_device
    return PESWorkerState(lanes=flags(worker_state.lanes, True), accumulator=flags(worker_state.accumulator, per_pair),
                          eps=flags(worker_state.eps, per_pair), age=per_pair)

  def init_worker_state(self, theta, key):
    # Distinct buffers for accumulator and eps, so a meta-step may donate the whole worker state.
    return self.place_worker_state(PESWorkerState(lanes=self.step.init_step_state(theta, key),
                                                  accumulator=zero_perturbations(theta, self.num_tasks),
                                                  eps=zero_perturbations(theta, self.num_tasks, self._noise_rank),
                                                  age=jnp.zeros((self.num_tasks,), jnp.int32)))

  def estimate_fn(self, theta, worker_state: PESWorkerState, key, with_unroll_info: bool = False):
    k_eps, k_unroll = jax.random.split(key)
    ws = worker_state
    limit = _NEVER_RESAMPLED if self.resample_every is None else self.resample_every
    resample = (ws.age == 0) | (ws.age >= limit)
    eps = _per_pair_where(resample, self._sample_eps(theta, k_eps), ws.eps)
    dense_eps = dense_perturbations(eps)
    # Weight of the steps that continue the trajectory running at the start of this truncation.
    continuing = _per_pair_where(resample, jax.tree.map(jnp.add, ws.accumulator, dense_eps), ws.accumulator)
    thetas = pairs.antithetic_thetas(theta, eps)
    lanes, out = self.step.unroll_fn(thetas, ws.lanes, self._unroll_keys(k_unroll, self.unroll_length),
                                     theta_is_batched=True, with_cfg=with_unroll_info)
    losses, mask = step_losses(out, self.loss_kind)
    delta, pair_mask, mean_loss = pairs.pair_differences(losses, mask, self.clip_loss_diff)
    is_new = pairs.first_half(out.is_new_trajectory, axis=1)
    started = jnp.cumsum(is_new.astype(jnp.int32), axis=0) > 0  # step belongs to a trajectory begun in here
    count = jnp.maximum(jnp.sum(pair_mask, axis=0), 1.0)
    coef_old = jnp.sum(jnp.where(started, 0.0, delta), axis=0) / count
    coef_new = jnp.sum(jnp.where(started, delta, 0.0), axis=0) / count
    scale = 1.0 / (jnp.maximum(jnp.sum(jnp.sum(pair_mask, axis=0) > 0), 1) * 2 * self.sigma ** 2)
    grad = jax.tree.map(lambda a, b: scale * (a + b), weighted_noise_sum(coef_old, continuing),
                        weighted_noise_sum(coef_new, eps))
    restarted = jnp.any(is_new, axis=0)
    new_state = PESWorkerState(lanes=lanes, accumulator=_per_pair_where(restarted, dense_eps, continuing), eps=eps,
                               age=jnp.where(restarted, 0, jnp.where(resample, 1, ws.age + 1)).astype(jnp.int32))
    metrics = {"num_nonfinite": jnp.sum(1.0 - pair_mask), **nonfinite_metrics(out, 1.0 - pair_mask)}
    info = _positive_lanes(out) if with_unroll_info else None
    return GradientEstimate(grad, mean_loss, metrics, unroll_info=info), new_state


class NoiseReuseES(PES):
  """Noise-reuse ES: `PES` with ``resample_every=None`` (one perturbation per pair for a whole trajectory)."""

  name = "nres"

  def __init__(self, truncated_step: TruncatedStep, unroll_length: int = 20, **es_args: Any):
    super().__init__(truncated_step, unroll_length, resample_every=None, **es_args)
