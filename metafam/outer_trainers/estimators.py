"""Meta-gradient estimators: truncated BPTT, full ES and truncated ES here; PES and noise-reuse ES, which keep
state across truncations, in `metafam.outer_trainers.pes`.

Every estimator is built on an injected `TruncatedStep` (as in the reference library: ``PES(truncated_step, ...)``),
which holds the inner configuration: family, learned optimizer, lanes, truncation schedule, meta-loss data, staggered
starts and devices. Every estimator's ``num_tasks`` is its step's: the task instances per estimate. TBPTT trains them
as the step's lanes; the ES estimators train each as an antithetic *pair* of lanes on `TruncatedStep.paired` (the
pair layout: `metafam.inner.pairs`), so their step has ``2 * num_tasks`` lanes. `make_estimator` in
`metafam.outer_trainers.registry` builds the step and the estimator from a name in one call.

Each offers the `GradientEstimator` protocol: ``init_worker_state(theta, key)``, the pure
``estimate_fn(theta, worker_state, key)`` and the jitted ``estimate(theta, worker_state, key)``; each is a pytree
whose leaves are its step's device data. With a step built on several ``devices`` the lanes are spread over them
with the same numbers (see `metafam.inner.sharding`).

``estimate_fn(theta, worker_state, key, with_unroll_info=True)`` (``estimate(..., with_unroll_info=True)``) also
returns the per-step outputs of the estimate's own unroll, with each step's task config, in
``GradientEstimate.unroll_info`` (``[num_steps, lanes]``): TBPTT's lanes; for the ES estimators the positive
particles only (lane ``2i``, ``theta + eps_i``, of every pair ``i``: ``[num_steps, num_tasks]``), as the reference
reports them. The option is static: with it off the traced program is the one without it.

The ES estimators (`FullES`, `TruncatedES`, `PES`, `NoiseReuseES`) take the same keyword arguments ``sigma``,
``loss_kind``, ``clip_loss_diff``, ``stack_antithetic``, ``perturbation`` and ``rank``, declared once on their common
base (``**es_args`` in their source; their signatures list them); each adds its own, the length first.

Defaults: ``unroll_length`` 20, ``sigma`` 0.01 and full noise are `metafam.runs.Recipe`'s; `FullES`'s
``trajectory_length`` 200 is `make_estimator`'s constant trajectory length (see `Recipe`, "Defaults";
tests/runs/test_library_defaults.py pins both).

The meta-loss of a truncation is the masked mean over its steps of the chosen per-step loss (``loss_kind``, default
the task-normalized ``meta_loss`` of the updated params on the step's ``meta_loss_split``). ES scaling: see `base`.
Non-finite steps (or pairs) are left out and counted in ``metrics["num_nonfinite"]``, their fraction in
``metrics["nonfinite_fraction"]`` and their causes in `base.NONFINITE_METRICS`; an estimate in which every one of them
was non-finite reports ``meta_loss`` NaN and a zero gradient, and `MetaTrainer` skips that meta-update. `estimate`
reports a masked step as the step's ``on_nonfinite`` says (`metafam.nonfinite`; the meta-training loop reports
them from its metrics instead).
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from metafam._checks import check_number, check_positive
from metafam.inner import pairs
from metafam.inner.schedules import ConstantSchedule
from metafam.inner.lane_step import LaneState
from metafam.inner.truncated_step import TruncatedStep
from metafam.outer_trainers.base import (GradientEstimate, GradientEstimator, check_loss_kind, check_perturbation,
                                         nonfinite_metrics, sample_perturbations, step_losses, weighted_noise_sum,
                                         zero_nonfinite)

FULL_ES_LOSS_TYPES = ("avg", "last", "min", "tail")


def _positive_lanes(out: Any) -> Any:
  """The positive particles' half (lane ``2i`` of each pair ``i``) of an antithetic unroll's ``[T, 2N]`` outputs."""
  return jax.tree.map(lambda x: pairs.halves(x, 1)[0], out)


class _Codes(NamedTuple):
  """The one field of an `UnrollOutput` that `nonfinite_metrics` reads (TBPTT keeps only it out of its gradient)."""
  nonfinite: jax.Array


class _OnTruncatedStep(GradientEstimator):
  """Shared plumbing of the estimators here: the injected step (a pytree leaf of the estimator), argument checks,
  the step's devices."""

  _data_fields = ("step",)
  reports_unroll_info = True

  def __init__(self, truncated_step: TruncatedStep, loss_kind: str, clip_loss_diff: Optional[float]):
    if not isinstance(truncated_step, TruncatedStep):
      raise TypeError(f"{type(self).__name__} needs a metafam.inner.TruncatedStep as its first argument, got "
                      f"{type(truncated_step).__name__} (make_estimator(name, family, learned_opt, ...) builds both).")
    self.loss_kind = check_loss_kind(loss_kind)
    if clip_loss_diff is not None:
      check_positive("clip_loss_diff", clip_loss_diff)
    self.clip_loss_diff = clip_loss_diff
    self.on_nonfinite = truncated_step.on_nonfinite
    self.num_tasks = truncated_step.num_tasks  # task instances per estimate (ES: one antithetic pair of lanes each)

  @property
  def mesh(self):
    return self.step.mesh

  def _unroll_keys(self, key: jax.Array, num_steps: int) -> jax.Array:
    return jax.random.split(key, num_steps)


class TruncatedBPTT(_OnTruncatedStep):
  """Backpropagation through each truncation of ``unroll_length`` steps (biased: ignores longer-range effects).

  ``num_tasks`` lanes share theta; the gradient is that of the masked mean meta-loss over the truncation: steps
  that went non-finite are left out (and send no NaN into the gradient, see `metafam.inner.lane_step`), and
  ``meta_loss`` is NaN (with a zero gradient) when every step did. ``metrics["num_nonfinite"]`` counts the masked
  steps plus any non-finite gradient entries that remain, which are zeroed.
  """

  name = "tbptt"
  nonfinite_unit = "lane-steps"

  def __init__(self, truncated_step: TruncatedStep, unroll_length: int = 20,
               loss_kind: str = "normalized_meta_loss"):
    super().__init__(truncated_step, loss_kind, None)
    self.unroll_length = check_positive("unroll_length", unroll_length, integer=True)
    self.step = truncated_step

  @property
  def inner_steps_per_estimate(self) -> int:
    return self.num_tasks * self.unroll_length

  def init_worker_state(self, theta, key):
    return self.step.init_step_state(theta, key)

  def estimate_fn(self, theta, worker_state: LaneState, key, with_unroll_info: bool = False):
    keys = self._unroll_keys(key, self.unroll_length)

    def meta_loss(theta):
      lanes, out = self.step.unroll_fn(theta, worker_state, keys, with_cfg=with_unroll_info)
      losses, mask = step_losses(out, self.loss_kind)
      info = out if with_unroll_info else None
      return pairs.masked_mean_or_nan(jnp.sum(losses * mask), jnp.sum(mask)), (lanes, mask, info, out.nonfinite)

    (loss, (lanes, mask, info, codes)), grad = jax.value_and_grad(meta_loss, has_aux=True)(theta)
    grad, bad = zero_nonfinite(grad)
    metrics = {"num_nonfinite": jnp.sum(1.0 - mask) + bad, **nonfinite_metrics(_Codes(codes), 1.0 - mask)}
    return GradientEstimate(grad, loss, metrics, unroll_info=info), lanes


class _AntitheticES(_OnTruncatedStep):
  """What every ES estimator here shares: ``truncated_step.num_tasks`` antithetic pairs on the step's paired layout
  (`TruncatedStep.paired`) and the keyword arguments they all take, declared once here:

  Args:
    sigma: the standard deviation of the perturbations.
    loss_kind: the per-step loss the meta-loss averages (`base.step_losses`).
    clip_loss_diff: clip each pair's loss difference to ``[-c, c]`` (None: no clipping).
    stack_antithetic: run both particles of a pair as one stacked batch (see `TruncatedStep.paired`).
    perturbation, rank: "full" Gaussian noise, or "low_rank" rank-``rank`` noise on matrices (see `base`).

  A subclass's ``__init__`` takes its own arguments and passes ``**es_args`` on; its signature (``help``,
  `inspect.signature`, `metafam.outer_trainers.registry.estimator_arguments`) lists both.
  """

  def __init__(self, truncated_step: TruncatedStep, *, sigma: float = 0.01, loss_kind: str = "normalized_meta_loss",
               clip_loss_diff: Optional[float] = None, stack_antithetic: bool = True, perturbation: str = "full",
               rank: int = 1):
    super().__init__(truncated_step, loss_kind, clip_loss_diff)
    self.sigma = check_positive("sigma", sigma)
    self._noise_rank = check_perturbation(perturbation, rank)
    self.perturbation, self.rank = perturbation, rank
    self.step = self._particle_step(truncated_step).paired(stack=stack_antithetic)

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    init = cls.__dict__.get("__init__")
    params = list(inspect.signature(init).parameters.values()) if init is not None else []
    if params and params[-1].kind is params[-1].VAR_KEYWORD and params[-1].name == "es_args":
      # its own arguments, then the shared ones in place of ``**es_args``
      own = params[:-1]
      shared = [p for p in inspect.signature(_AntitheticES.__init__).parameters.values() if p.kind is p.KEYWORD_ONLY]
      init.__signature__ = inspect.Signature(own + shared)

  def _particle_step(self, truncated_step: TruncatedStep) -> TruncatedStep:
    """The step the particles run on, before pairing (the given one; `FullES` changes it)."""
    return truncated_step

  def _sample_eps(self, theta, key):
    """``num_tasks`` perturbations of theta (low-rank factors for matrices with ``perturbation="low_rank"``)."""
    return sample_perturbations(theta, key, self.num_tasks, self.sigma, self._noise_rank)


class FullES(_AntitheticES):
  """Antithetic ES over complete inner trajectories of ``trajectory_length`` steps from fresh task instances.

  ``loss_type``: "avg" (mean of the per-step meta-losses), "last" (the final step's), "min" (their minimum) or
  "tail" (the mean over the last ``tail_fraction`` of the steps, at least one: where training ends, with less batch
  noise than "last"; the objective of a learned schedule that should anneal).
  ``perturbation="low_rank", rank=r`` (every ES estimator here): matrix meta-parameters get rank-r noise, applied as
  shared weights plus per-lane factors (see `base`); the default "full" draws full Gaussian noise.
  A pair with any non-finite step is left out of the estimate and counted in ``metrics["num_nonfinite"]``.
  Stateless: the worker state is ``{}``. ``trajectory_length`` defaults to 200, `make_estimator`'s constant
  trajectory length (the main job's); a `Recipe` passes its length when it is constant, and with a range of lengths
  (its default, 100 to 2,000) leaves this default, as one length is all FullES runs.
  """

  name = "full_es"
  nonfinite_unit = "pairs"

  def __init__(self, truncated_step: TruncatedStep, trajectory_length: int = 200, *, loss_type: str = "avg",
               tail_fraction: float = 0.1, **es_args: Any):
    self.trajectory_length = check_positive("trajectory_length", trajectory_length, integer=True)
    if loss_type not in FULL_ES_LOSS_TYPES:
      raise ValueError(f"loss_type must be one of {FULL_ES_LOSS_TYPES}, got {loss_type!r}.")
    self.loss_type = loss_type
    self.tail_fraction = float(check_number("tail_fraction", tail_fraction, low=0.0, low_open=True, high=1.0))
    super().__init__(truncated_step, **es_args)

  def _particle_step(self, truncated_step: TruncatedStep) -> TruncatedStep:
    # Complete trajectories of trajectory_length steps from fresh instances, no staggered starts. The schedule is
    # that length, so an optimizer that reads the run's length (a learned schedule, a training-fraction feature) is
    # told it; the unroll stops at the trajectory's last step (flagged is_done, its loss valid), before any reset.
    return truncated_step.replace(schedule=ConstantSchedule(self.trajectory_length), random_initial_iteration=False)

  @property
  def inner_steps_per_estimate(self) -> int:
    return 2 * self.num_tasks * self.trajectory_length

  @property
  def tail_steps(self) -> int:
    """The steps ``loss_type="tail"`` averages: the last ``round(tail_fraction * trajectory_length)``, at least 1."""
    return max(1, int(round(self.tail_fraction * self.trajectory_length)))

  def init_worker_state(self, theta, key):
    return {}

  def estimate_fn(self, theta, worker_state, key, with_unroll_info: bool = False):
    k_eps, k_init, k_unroll = jax.random.split(key, 3)
    eps = self._sample_eps(theta, k_eps)
    thetas = pairs.antithetic_thetas(theta, eps)
    lanes = self.step.init_fn(thetas, k_init, theta_is_batched=True)
    lanes, out = self.step.unroll_fn(thetas, lanes, self._unroll_keys(k_unroll, self.trajectory_length),
                                     theta_is_batched=True, with_cfg=with_unroll_info)
    losses, mask = step_losses(out, self.loss_kind)
    valid_pos, valid_neg = pairs.halves(jnp.all(mask > 0, axis=0))
    pair_valid = valid_pos & valid_neg
    per_lane = self.trajectory_losses(losses, thetas, lanes, jax.random.fold_in(k_unroll, self.trajectory_length))
    pos, neg = pairs.halves(per_lane)
    delta = jnp.where(pair_valid, pos - neg, 0.0)
    if self.clip_loss_diff is not None:
      delta = jnp.clip(delta, -self.clip_loss_diff, self.clip_loss_diff)
    num_valid = jnp.maximum(jnp.sum(pair_valid), 1)
    grad = weighted_noise_sum(delta / (num_valid * 2 * self.sigma ** 2), eps)
    mean_loss = pairs.masked_mean_or_nan(jnp.sum(jnp.where(pair_valid, 0.5 * (pos + neg), 0.0)), jnp.sum(pair_valid))
    metrics = {"num_nonfinite": jnp.sum(~pair_valid).astype(jnp.float32),
               **nonfinite_metrics(out, (~pair_valid).astype(jnp.float32))}
    info = _positive_lanes(out) if with_unroll_info else None
    return GradientEstimate(grad, mean_loss, metrics, unroll_info=info), worker_state


  def trajectory_losses(self, losses, thetas, lanes, key):
    """``[2N]``: each lane's meta-loss for its whole trajectory, from its ``[T, 2N]`` step ``losses`` by
    ``loss_type`` (a subclass may use the per-lane ``thetas``, the final ``lanes`` and ``key`` instead)."""
    if self.loss_type == "avg":
      return jnp.mean(losses, axis=0)
    if self.loss_type == "last":
      return losses[-1]
    if self.loss_type == "tail":
      return jnp.mean(losses[-self.tail_steps:], axis=0)
    return jnp.min(losses, axis=0)


class TruncatedES(_AntitheticES):
  """Antithetic ES over one truncation, both particles starting from the shared unperturbed inner state (biased).

  After the estimate the unperturbed lanes advance ``unroll_length`` steps with theta itself (an extra
  ``num_tasks``-lane unroll with the same keys, so it sees the same configs and batches as the particles).
  """

  name = "truncated_es"
  nonfinite_unit = "pair-steps"
  _data_fields = ("step", "plain")

  def __init__(self, truncated_step: TruncatedStep, unroll_length: int = 20, **es_args: Any):
    self.unroll_length = check_positive("unroll_length", unroll_length, integer=True)
    super().__init__(truncated_step, **es_args)
    self.plain = truncated_step  # the unperturbed lanes

  @property
  def inner_steps_per_estimate(self) -> int:
    return 3 * self.num_tasks * self.unroll_length

  def init_worker_state(self, theta, key):
    return self.plain.init_step_state(theta, key)

  def estimate_fn(self, theta, worker_state: LaneState, key, with_unroll_info: bool = False):
    k_eps, k_unroll = jax.random.split(key)
    eps = self._sample_eps(theta, k_eps)
    thetas = pairs.antithetic_thetas(theta, eps)
    keys = self._unroll_keys(k_unroll, self.unroll_length)
    _, out = self.step.unroll_fn(thetas, pairs.tile_pairs(worker_state), keys, theta_is_batched=True,
                                 with_cfg=with_unroll_info)
    losses, mask = step_losses(out, self.loss_kind)
    delta, pair_mask, mean_loss = pairs.pair_differences(losses, mask, self.clip_loss_diff)
    count = jnp.sum(pair_mask, axis=0)
    coef = jnp.sum(delta, axis=0) / jnp.maximum(count, 1.0)
    grad = weighted_noise_sum(coef / (jnp.maximum(jnp.sum(count > 0), 1) * 2 * self.sigma ** 2), eps)
    lanes, _ = self.plain.unroll_fn(theta, worker_state, keys)
    metrics = {"num_nonfinite": jnp.sum(1.0 - pair_mask), **nonfinite_metrics(out, 1.0 - pair_mask)}
    info = _positive_lanes(out) if with_unroll_info else None
    return GradientEstimate(grad, mean_loss, metrics, unroll_info=info), lanes
