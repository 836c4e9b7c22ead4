"""Planted problems: task families on which what meta-training should find is known in advance.

Issue 55: a recipe that cannot find a known answer on a problem that costs milliseconds per meta-step will not find
an unknown one on the real suite. Each problem here runs through the same engine a user runs (`TruncatedStep`, the
registered estimators, `MetaTrainer`); tests/benchmark/test_planted.py holds the checks, docs/guide/planted.md the
settings and the measured outcomes.

  * `MatrixQuadraticFamily`: ``0.5 * mean((W - T)^2)`` over one ``[m, n]`` matrix ``W`` (optionally with Gaussian
    gradient noise). Its only tensor is a matrix, so for `MuonResidualLOpt` the Muon step gain ``log_gain[0]`` sets
    the step size and ``log_gain[1]`` (the gain of the non-matrix tensors) provably has no effect on any loss.
    With ``target_std=0`` (the minimum at ``W = 0``) and gradient noise, a residual that reads the parameter helps.
  * `sweep_log_gain` (on `objective_by_theta`): the known answer for the step gain, found independently by a sweep
    of constant rates over the same family, trajectory-length distribution and meta-objective; `matrix_log_gain`
    reads the learned one.
  * `schedule_problem`: the known answer for a schedule under a final-loss objective (FullES ``loss_type="tail"``):
    the best constant rate by that sweep, then the best two-knot schedule over the run by a grid sweep (on the noisy
    quadratic it anneals); a recipe's estimator must get there from the flat start.
  * `noise_drift_test` (with `adam_gradients`, `adam_first_moment`, `run_recorded`): whether a meta-parameter that
    cannot affect the loss drifted, or was estimated, beyond what its noise explains.
  * `residual_slopes`, `without_feature`: which features a learned residual reads, and the ablation that shows it
    uses one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam._checks import check_positive_int
from metafam.inner.schedules import ConstantSchedule
from metafam.inner.truncated_step import TruncatedStep
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks.base import Task


class _MatrixQuadratic(Task):
  """``0.5 * mean((W - T - noise)^2)``: noise a fresh N(0, noise_scale^2) matrix per step (from the loss key)."""

  def __init__(self, cfg, shape, noise_std):
    self.cfg, self.shape, self.noise_std = cfg, tuple(shape), float(noise_std)

  def init(self, key):
    return {"w": jax.random.normal(key, self.shape, jnp.float32)}

  def loss(self, params, key, batch):
    err = params["w"] - self.cfg["target"]
    if self.noise_std:
      err = err - self.cfg["noise_scale"] * jax.random.normal(key, self.shape, jnp.float32)
    return 0.5 * jnp.mean(jnp.square(err))


class MatrixQuadraticFamily(TaskFamily):
  """Quadratics ``0.5 * mean((W - T)^2)`` over one matrix ``W: f32[m, n]``, from ``W_0 ~ N(0, 1)``.

  Config: ``{"target": f32[m, n] ~ N(0, target_std^2), "noise_scale": f32[]}``. The initial loss is ``(1 +
  target_std^2) / 2`` in expectation and the minimum 0. With ``target_std=0`` the minimum is ``W = 0`` for every
  instance: the parameter itself points exactly at it (the planted residual: a step along the parameter helps).
  With ``noise_std > 0`` the loss (and hence the gradient) sees a fresh Gaussian matrix per step, of standard
  deviation ``noise_scale``, drawn per instance log-uniformly in ``[noise_std / noise_spread,
  noise_std * noise_spread]``: the gradient is unbiased, its noise grows with ``noise_scale``, and the expected loss
  is the noise-free loss plus ``noise_scale^2 / 2``.

  The family has no data (``datasets`` is None): every split's loss is the same function, so the meta-loss of the
  estimators is the noise-free loss of the updated ``W`` when ``noise_std == 0``.
  """

  def __init__(self, shape: Sequence[int] = (8, 8), noise_std: float = 0.0, noise_spread: float = 1.0,
               target_std: float = 1.0):
    super().__init__()
    self.shape = tuple(check_positive_int("shape", s) for s in shape)
    if len(self.shape) != 2:
      raise ValueError(f"shape must be (m, n), got {shape!r}.")
    if noise_std < 0 or noise_spread < 1:
      raise ValueError(f"need noise_std >= 0 and noise_spread >= 1, got {noise_std!r}, {noise_spread!r}.")
    if target_std < 0:
      raise ValueError(f"target_std must be >= 0, got {target_std!r}.")
    self.noise_std, self.noise_spread, self.target_std = float(noise_std), float(noise_spread), float(target_std)
    self.name = f"MatrixQuadraticFamily{self.shape[0]}x{self.shape[1]}"

  def sample(self, key):
    k1, k2 = jax.random.split(key)
    half = float(np.log(self.noise_spread))
    scale = self.noise_std * jnp.exp(jax.random.uniform(k2, (), jnp.float32, -half, half))
    return {"target": self.target_std * jax.random.normal(k1, self.shape, jnp.float32), "noise_scale": scale}

  def task_fn(self, cfg):
    return _MatrixQuadratic(cfg, self.shape, self.noise_std)


def matrix_log_gain(lopt: Any, theta: Any, shape: Sequence[int]) -> float:
  """The log of the step multiplier `MuonResidualLOpt` applies to an ``[m, n]`` matrix at ``theta``, relative to its
  initial rule: ``log_gain[0] + shape_power . log((m, n) / base_fan_in)`` (0 at the initial theta with the default
  ``fan_in_power=0``). The matrix's step is ``step_mult * exp(matrix_log_gain) * (the rule's direction)``, so a
  meta-trained optimizer's constant rate is ``step_mult * exp(matrix_log_gain)``."""
  log_fans = np.log(np.asarray(shape, np.float64) / lopt.base_fan_in)
  power = theta["shape_power"] if "shape_power" in theta else lopt.initial_fan_exponents()
  return float(np.asarray(theta["log_gain"])[0] + np.dot(np.asarray(power, np.float64), log_fans))


def with_log_gain_offsets(theta: Any, offsets: Sequence[float], index: int = 0) -> Any:
  """``theta`` stacked ``len(offsets)`` times along a new leading axis, with ``offsets[j]`` added to
  ``log_gain[index]`` of copy ``j`` (the batched thetas `objective_by_theta` scores)."""
  offsets = jnp.asarray(offsets, jnp.float32)
  stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (len(offsets),) + jnp.shape(x)), theta)
  return dict(stacked, log_gain=stacked["log_gain"].at[:, index].add(offsets))


def objective_by_theta(family: TaskFamily, lopt: Any, thetas: Any, schedule: Any, key: jax.Array,
                       num_tasks: int = 32, max_length: int = None, is_training: bool = True,
                       num_lengths: int = 4096, per_instance: bool = False,
                       tail_fraction: Optional[float] = None) -> np.ndarray:
  """``f64[K]``: the meta-objective the truncated estimators follow, at each of ``K`` stacked ``thetas``.

  That objective is the per-step mean of the normalized meta-loss over a lane's timeline: a trajectory of length
  ``L ~ schedule`` contributes its ``L`` steps, so it is ``E[sum_{t < L} loss_t] / E[L]``, with ``loss_t`` the
  normalized meta-loss after step ``t`` averaged over instances. With ``tail_fraction`` it is instead `FullES`'s
  ``loss_type="tail"`` objective: the mean of ``loss_t`` over the last ``max(1, round(tail_fraction *
  max_length))`` steps of a ``max_length``-step run (``schedule`` then only sets the default length). Every theta
  trains the same ``num_tasks`` fresh
  instances (the same keys) for ``max_length`` steps (default: the schedule's ``high`` or ``length``), with
  ``opt_fn(theta, is_training)`` (``is_training=True``: as the estimators train, e.g. with ``lr_spread``); the
  expectation over lengths uses ``num_lengths`` draws of ``schedule``. A theta whose run went non-finite scores inf.
  ``per_instance``: ``f64[K, num_tasks]``, each instance's objective (their mean is the objective), for paired
  comparisons of thetas on the same instances.
  """
  num_thetas = len(jax.tree.leaves(thetas)[0])
  if max_length is None:
    max_length = int(getattr(schedule, "high", getattr(schedule, "length", 0)))
  check_positive_int("max_length", max_length)
  step = TruncatedStep(family, lopt, num_thetas * num_tasks, ConstantSchedule(max_length), meta_loss_split="test",
                       lane_groups=num_thetas, donate=False, is_training=is_training)
  lanes_theta = jax.tree.map(lambda x: jnp.repeat(x, num_tasks, axis=0), thetas)
  k_init, k_unroll, k_len = jax.random.split(key, 3)

  @jax.jit
  def curves(lanes_theta):
    lanes = step.init_fn(lanes_theta, k_init, theta_is_batched=True)
    _, out = step.unroll_fn(lanes_theta, lanes, jax.random.split(k_unroll, max_length), theta_is_batched=True)
    return jnp.where(out.mask > 0, out.normalized_meta_loss, jnp.inf)

  c = np.asarray(curves(lanes_theta), np.float64).reshape(max_length, num_thetas, num_tasks)
  if tail_fraction is not None:
    per = c[-max(1, int(round(tail_fraction * max_length))):].mean(axis=0)
    return per if per_instance else per.mean(axis=1)
  lengths = np.asarray(jax.vmap(schedule.sample)(jax.random.split(k_len, num_lengths)))
  cumulative = np.cumsum(c, axis=0)  # [T, K, num_tasks]
  per = cumulative[lengths - 1].mean(axis=0) / lengths.mean()
  return per if per_instance else per.mean(axis=1)


def with_schedules(theta: Any, knots: Sequence[Sequence[float]]) -> Any:
  """``theta`` stacked ``len(knots)`` times along a new leading axis, copy ``j`` with ``log_schedule = knots[j]``
  (`MuonResidualLOpt`'s learned schedule): the batched thetas of a sweep over schedules."""
  knots = jnp.asarray(knots, jnp.float32)
  stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (len(knots),) + jnp.shape(x)), theta)
  if knots.ndim != 2 or knots.shape[1] != jnp.shape(theta["log_schedule"])[0]:
    raise ValueError(f"knots must be [K, {jnp.shape(theta['log_schedule'])[0]}], got shape {knots.shape}.")
  return dict(stacked, log_schedule=knots)


@dataclasses.dataclass(frozen=True)
class GainSweep:
  """A sweep of constant rates: ``objective[j]`` at log-gain offset ``offsets[j]``; ``best`` the best offset,
  refined by a parabola through the best grid point and its neighbours (in log-gain)."""
  offsets: Tuple[float, ...]
  objective: Tuple[float, ...]
  best: float


def sweep_log_gain(family: TaskFamily, lopt: Any, theta: Any, schedule: Any, key: jax.Array,
                   offsets: Sequence[float] = tuple(np.linspace(-2.5, 2.5, 21)), index: int = 0,
                   **kwargs: Any) -> GainSweep:
  """The best constant rate of ``lopt`` at ``theta`` on ``family``, as a log-gain offset: `objective_by_theta` of
  ``theta`` with each of ``offsets`` added to ``log_gain[index]`` (at the initial theta of `MuonResidualLOpt` that
  is Muon at rate ``step_mult * exp(offset)``: a plain rate sweep). ``kwargs`` go to `objective_by_theta`."""
  offsets = tuple(float(o) for o in offsets)
  obj = objective_by_theta(family, lopt, with_log_gain_offsets(theta, offsets, index), schedule, key, **kwargs)
  j = int(np.argmin(obj))
  best = offsets[j]
  if 0 < j < len(offsets) - 1 and np.all(np.isfinite(obj[j - 1:j + 2])):
    (x0, x1, x2), (y0, y1, y2) = offsets[j - 1:j + 2], obj[j - 1:j + 2]
    denom = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denom
    b = (x2 ** 2 * (y0 - y1) + x1 ** 2 * (y2 - y0) + x0 ** 2 * (y1 - y2)) / denom
    if a > 0:
      best = float(np.clip(-b / (2 * a), x0, x2))
  return GainSweep(offsets, tuple(float(v) for v in obj), best)


@dataclasses.dataclass(frozen=True)
class ScheduleProblem:
  """`schedule_problem`'s answer: the family, the optimizer at the best constant rate with a flat two-knot schedule,
  and the sweep of schedules.

  Attributes:
    family, learned_opt, horizon, tail_fraction: the problem (``learned_opt`` at ``best_constant_rate``, its
      ``log_schedule`` (start, end) of the run 0 at init: the flat start).
    best_constant_rate: the constant rate that minimizes the objective (`sweep_log_gain`, refined).
    knots: ``f64[K, 2]``, the swept (start, end) log multipliers; ``objective``: ``f64[K]`` at each.
  """
  family: Any
  learned_opt: Any
  horizon: int
  tail_fraction: float
  best_constant_rate: float
  knots: np.ndarray
  objective: np.ndarray

  @property
  def best_knots(self) -> np.ndarray:
    return self.knots[int(np.argmin(self.objective))]

  def score(self, thetas: Any, key: jax.Array, num_tasks: int = 32) -> np.ndarray:
    """``f64[K, num_tasks]``: the objective of ``K`` stacked thetas on ``num_tasks`` instances from ``key`` (the
    same for every theta: paired)."""
    return objective_by_theta(self.family, self.learned_opt, thetas, ConstantSchedule(self.horizon), key,
                              num_tasks=num_tasks, per_instance=True, tail_fraction=self.tail_fraction)


def schedule_problem(recipe: Any, horizon: int = 200, tail_fraction: float = 0.1, key: jax.Array = None,
                     num_tasks: int = 16, probe_rate: float = 0.3,
                     start_knots: Sequence[float] = tuple(np.linspace(-1.0, 3.0, 9)),
                     end_knots: Sequence[float] = tuple(np.linspace(-5.0, 1.0, 13))) -> ScheduleProblem:
  """The planted schedule under a final-loss objective, with its known answer.

  `MatrixQuadraticFamily((8, 8), noise_std=0.5, target_std=0)`: Muon's fixed-size steps leave ``W`` jittering at a
  floor the rate sets, so the loss where training ends is lowest for a rate that starts large and anneals. The
  optimizer is ``recipe``'s (`MuonResidualLOpt` with ``lr_spread`` and the other options it sets) with
  ``residual="none"``, a constant base and two learned knots (start, end; 0 at init). The objective is the one
  `FullES` estimates with ``loss_type="tail"``: the mean normalized loss over the last ``tail_fraction`` of
  ``horizon``-step runs, trained as meta-training trains (``is_training``). Known answer, by sweeps of that
  objective on ``num_tasks`` instances: the best constant rate (from ``probe_rate``, log offsets -4 to +1), then,
  at that rate, every (start, end) pair of the grids.
  """
  key = jax.random.key(0) if key is None else key
  k_rate, k_grid = jax.random.split(key)
  family = MatrixQuadraticFamily((8, 8), noise_std=0.5, target_std=0.0)
  kwargs = {**recipe.optimizer_kwargs, "residual": "none", "schedule_knots": 2, "base_schedule": "constant"}
  schedule = ConstantSchedule(horizon)
  probe = recipe.replace(step_mult=float(probe_rate), optimizer_kwargs=kwargs).build_learned_optimizer()
  sweep = sweep_log_gain(family, probe, probe.init(jax.random.key(0)), schedule, k_rate,
                         offsets=np.linspace(-4, 1, 21), num_tasks=num_tasks, tail_fraction=tail_fraction)
  rate = float(probe_rate * np.exp(sweep.best))
  lopt = recipe.replace(step_mult=rate, optimizer_kwargs=kwargs).build_learned_optimizer()
  knots = np.asarray([(a, b) for a in start_knots for b in end_knots], np.float64)
  objective = objective_by_theta(family, lopt, with_schedules(lopt.init(jax.random.key(0)), knots), schedule, k_grid,
                                 num_tasks=num_tasks, tail_fraction=tail_fraction)
  return ScheduleProblem(family, lopt, horizon, tail_fraction, rate, knots, np.asarray(objective, np.float64))


def adam_gradients(mu_history: np.ndarray, b1: float = 0.9) -> np.ndarray:
  """The gradients an Adam meta-optimizer was fed, recovered from its first moments after each step.

  ``mu_history[t]`` is Adam's ``mu`` after meta-step ``t`` (``[T, ...]``, from zeros before the first): since
  ``mu_t = b1 mu_{t-1} + (1 - b1) g_t``, the fed (clipped) gradient is ``g_t = (mu_t - b1 mu_{t-1}) / (1 - b1)``. So
  the estimates a `MetaTrainer` applied are read off its state without touching the trainer (a skipped meta-step
  leaves ``mu`` as it was; drop those steps first).
  """
  mu = np.asarray(mu_history, np.float64)
  previous = np.concatenate([np.zeros_like(mu[:1]), mu[:-1]], axis=0)
  return (mu - b1 * previous) / (1 - b1)


def adam_drift(grads: np.ndarray, learning_rate: float, b1: float = 0.9, b2: float = 0.999,
               eps: float = 1e-8) -> np.ndarray:
  """How far ``optax.adam(learning_rate)`` moves one scalar fed each row of ``grads`` (``[T, K]``: K series, in
  order), per series: ``f64[K]``, the sum of its updates."""
  g = jnp.asarray(grads, jnp.float32)
  opt = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)

  def one(series):
    def body(state, gt):
      updates, state = opt.update(gt, state)
      return state, updates
    _, updates = jax.lax.scan(body, opt.init(series[0]), series)
    return jnp.sum(updates)
  return np.asarray(jax.jit(jax.vmap(one, in_axes=1))(g), np.float64)


@dataclasses.dataclass(frozen=True)
class DriftTest:
  """`noise_drift_test`'s answer.

  Attributes:
    drift: how far the meta-optimizer moved the coordinate (re-played from its gradients).
    null_drifts: the drifts of the same meta-optimizer fed the same gradients with the sign of each block flipped at
      random (``num_null`` of them).
    p_value: two-sided, the fraction of null drifts at least as large in magnitude as ``drift`` (with the observed
      one counted, so never 0).
    mean, standard_error, t: the gradients' mean, its standard error from the block means, and their ratio.
  """
  drift: float
  null_drifts: np.ndarray
  p_value: float
  mean: float
  standard_error: float
  t: float


def noise_drift_test(grads: Sequence[float], learning_rate: float, block: int, key: jax.Array,
                     num_null: int = 1999, **adam_kwargs: Any) -> DriftTest:
  """Did a coordinate move further than the noise of its gradient estimates explains?

  ``grads``: the meta-gradients of one coordinate that an Adam meta-optimizer at ``learning_rate`` was fed, in
  order (e.g. `adam_gradients` of a run). If the coordinate has no effect on the meta-loss, an unbiased estimator
  gives it zero-mean noise that is symmetric (ES: flipping the sign of its perturbation changes no loss), and Adam
  still moves it like a random walk. The null distribution keeps the noise and removes any mean: the series is cut
  into blocks of ``block`` meta-steps (longer than the estimates' correlation time: for noise-reuse ES, the
  truncations of a trajectory), every block's sign is flipped at random, and each such series is re-played through
  the same Adam. A biased estimate (a mean that is not zero) drifts the same way in every block and lands in the
  tails; ``p_value`` says how far.
  """
  g = np.asarray(grads, np.float64).reshape(-1)
  num_blocks = len(g) // block
  if num_blocks < 4:
    raise ValueError(f"need at least 4 blocks of {block} meta-steps, got {len(g)} gradients.")
  g = g[:num_blocks * block]
  signs = np.asarray(jax.random.rademacher(key, (num_blocks, num_null), jnp.float32), np.float64)
  flipped = g[:, None] * np.repeat(signs, block, axis=0)
  drifts = adam_drift(np.concatenate([g[:, None], flipped], axis=1), learning_rate, **adam_kwargs)
  drift, null = float(drifts[0]), drifts[1:]
  p_value = float((1 + np.sum(np.abs(null) >= abs(drift))) / (1 + num_null))
  means = g.reshape(num_blocks, block).mean(axis=1)
  se = float(means.std(ddof=1) / np.sqrt(num_blocks))
  return DriftTest(drift, null, p_value, float(g.mean()), se, float(g.mean() / se) if se > 0 else 0.0)


def adam_first_moment(opt_state: Any) -> Any:
  """The ``mu`` (first moment) of the Adam inside a meta-optimizer state (`metafam.outer_trainers.meta_optimizer`:
  ``optax.adam``, with or without a schedule)."""
  import optax
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
           if isinstance(s, optax.ScaleByAdamState)]
  if len(found) != 1:
    raise ValueError(f"expected one Adam state in the meta-optimizer state, found {len(found)}.")
  return found[0].mu


def run_recorded(trainer: Any, state: Any, num_steps: int, record: Any):
  """``num_steps`` meta-steps of ``trainer`` (`MetaTrainer.step`, the compiled program a run uses) from ``state``;
  returns ``(state, records)`` with ``records`` the ``[num_steps, ...]`` stack of ``record(state, metrics)`` after
  each step (e.g. ``lambda s, m: (s.theta["log_gain"], adam_first_moment(s.opt_state)["log_gain"],
  m["grad_norm"])``). A step the trainer
  skipped (non-finite estimate) raises: the recorded series would not be the applied one."""
  out = []
  for _ in range(num_steps):
    state, metrics = trainer.step(state)
    out.append(jax.tree.map(np.asarray, record(state, metrics)))
    if float(metrics["update_skipped"]):
      raise RuntimeError(f"meta-step {int(state.step)} was skipped (non-finite estimate).")
  return state, jax.tree.map(lambda *x: np.stack(x), *out)


def residual_slopes(lopt: Any, theta: Any, key: jax.Array, matrix: bool = True, num_points: int = 4096) -> np.ndarray:
  """``f64[num_features]``: the mean slope of `MuonResidualLOpt`'s residual ``r`` (before centring) with respect
  to each of its per-element input features (gradient, parameter, momentum, and with ``residual="after"`` the
  rule's direction; each normalized to unit RMS over its tensor), at ``theta``, over ``num_points`` elements whose
  features are independent N(0, 1) (the distribution the normalization aims at). ``matrix`` sets the static
  "is a matrix" flag. All zero at the initial theta (the output layer starts at zero); the step is
  ``gain * (d + rms(d) * r)``, *subtracted* from the parameter, so a positive slope on the parameter feature is a
  pull towards zero (weight decay), on the gradient feature an extra step down the gradient."""
  from metafam.optimizers import _features as F
  n = lopt.num_leaf_features
  x = jax.random.normal(key, (n, num_points), jnp.float32)
  flag = jnp.asarray([1.0 if matrix else -1.0], jnp.float32)

  def total(x):
    bias0 = F.mlp_bias0(theta["mlp"], flag, n)
    return jnp.sum(F.mlp_columns(theta["mlp"], x, bias0, len(lopt.hidden_sizes) + 1)[0])
  return np.asarray(jax.grad(total)(x).mean(axis=1), np.float64)


def without_feature(theta: Any, feature: int) -> Any:
  """`MuonResidualLOpt`'s ``theta`` with the residual MLP blind to input ``feature`` (its row of the first layer's
  weights zeroed): the ablation that shows whether a learned residual uses that feature."""
  mlp = dict(theta["mlp"], w0=jnp.asarray(theta["mlp"]["w0"]).at[feature].set(0.0))
  return dict(theta, mlp=mlp)
