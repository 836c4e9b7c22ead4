"""The signal-to-noise ratio of meta-gradient estimates at a fixed theta (issue 55, part 3: "signal measured").

    python experiments/meta_gradient_signal.py --quick          # one small setting, 32 draws: a smoke run (< 60 s)
    python experiments/meta_gradient_signal.py                  # every setting, 256 pairs each
    python experiments/meta_gradient_signal.py --only base,pes_20 --pairs-total 512 --json rows.json --draws d.npz
    python experiments/meta_gradient_signal.py --cosines d.npz --reference base   # mean directions, from --draws

The commands behind docs/guide/signal.md (512 pairs for the settings with constant trajectory lengths, 256 for the
two log-uniform ones), their wall times and printed tables are in experiments/results/meta_gradient_signal.md.

What is measured. At one fixed theta of `muon_residual_lopt` (recipe_c's learned optimizer and its ``step_mult`` and
``lr_spread``), on the 8x8 image-MLP family (one hidden layer of 32 units, batches of 32), the script draws ``N``
independent meta-gradient estimates of one *antithetic pair* each, through the registered estimators' own
``estimate_fn`` (nothing of the engine is re-implemented), and computes per coordinate of theta and for the whole
vector how much of an estimate is signal. An estimate with ``P`` pairs is the mean of ``P`` per-pair estimates that
are independent and identically distributed (each pair has its own keys: instance, initialization, batches,
trajectory lengths, start offset and perturbation; the engine's ``P``-pair estimate is exactly their mean when every
pair is finite), so ``N`` single-pair draws give the statistics of ``N / P`` estimates of ``P`` pairs for every
``P`` at once; the ``direct_p8`` setting checks that claim against the engine's own 8-pair estimator.

Worker states. Every draw is one *independent chain*: a fresh worker state (its own key; lanes staggered by
``random_initial_iteration`` as in meta-training), advanced by ``burn_in`` estimates at the same theta whose results
are discarded (the estimator's own state transitions: PES accumulates its perturbations, NRES keeps its noise for the
trajectory, TruncatedES advances its unperturbed lanes), then one estimate that is kept. ``burn_in`` is the longest
trajectory of the schedule in truncations, so every lane has finished its shortened first trajectory and is part-way
through a trajectory that began at iteration 0 from fresh params (for a constant length that is exactly the
stationary state of meta-training at a fixed theta; for log-uniform lengths approximately). Successive estimates of
one chain are *not* used: they are correlated (NRES reuses a pair's noise for a whole trajectory), and the naive
standard error of correlated draws is too small. FullES is stateless: each draw is complete trajectories from fresh
instances.

Statistics (see `signal_statistics`; for ``n`` estimates ``g_1..g_n`` of a ``d``-vector):

* ``t_j = |mean_j| / (sd_j / sqrt(n))`` per coordinate: the significance of the coordinate's mean over the ``n``
  draws (a t statistic). Its median over coordinates and the fraction of coordinates with ``t_j > 2`` are reported;
  with no signal at all ``|t|`` follows Student's t with ``n - 1`` degrees of freedom: median 0.67-0.68 and 4.6-5%
  above 2 for ``n >= 64``. From per-pair draws ``t_j`` is the same for ``n / P`` estimates of ``P`` pairs.
* ``r_j = |mean_j| / sd_j = t_j / sqrt(n)``: the SNR of *one* estimate of the coordinate (what one meta-step sees).
  Noise inflates it (``E t^2 = delta^2 + 1`` roughly), so the pairs one estimate needs for ``r = 1`` on the median
  coordinate are reported as ``N / (t_med^2 - 1)`` from ``N`` pair draws, and as unresolved when ``t_med^2 < 2``.
* ``rho``: the whole-vector SNR of one estimate, ``|mu| / sqrt(E |g - mu|^2)``, with ``|mu|^2`` estimated without
  bias by the U-statistic ``mean_{i != k} g_i . g_k`` and ``E |g - mu|^2`` by the sum of the coordinate variances.
  Two independent estimates have cosine about ``rho^2 / (1 + rho^2)`` (high dimension), and one estimate's cosine
  with the true meta-gradient is about ``rho / sqrt(1 + rho^2)``. ``P`` pairs give ``sqrt(P) * rho_1``.
* ``ES efficiency``: ``rho_1^2 (d + 1)``. For a loss that is linear in theta and free of noise an antithetic pair
  estimates ``(z . grad) z`` with ``z ~ N(0, I_d)``, whose ``rho^2`` is exactly ``1 / (d + 1)``: the efficiency is
  1 when only the ES sampling noise is there, and below 1 by the share of the variance that comes from everything
  else (instances, batches, truncation, non-linearity in sigma).
  Not meaningful for TBPTT (no perturbation), whose rows report it all the same.
* ``cos_half``: the cosine between the means of the two halves of the draws (first ``n/2`` and last ``n/2``): a
  direct, assumption-free check of whether the draws agree on a direction (about ``rho^2 / (rho^2 + 2 / n)``).
* ``--cosines``: the cosine between two settings' *expected* estimates, corrected for their noise
  (`direction_cosine`): whether estimators, objectives or lengths point the same way, which the SNR cannot tell
  (a biased estimator can have a high SNR).

Levers the engine has no option for (issue 55 lists them) are not measured here: antithetic particles always share
keys and data (`metafam.inner.pairs`; ``TruncatedStep.paired``), and the sign of the pair difference is not an
objective of its own; ``clip_loss_diff`` -> 0 gives it per loss difference (FullES: the sign of each pair's
trajectory difference; the truncated estimators: the sum over the truncation's steps of each step's sign), which the
``*_sign`` settings measure. See docs/guide/signal.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

# The families (the table's; the smoke run's, which compiles in a fraction of the time) and the learned optimizer
# with its settings (experiments/generalist_v2/recipe_c.json's optimizer).
FAMILIES = {"image_mlp": {"hidden_sizes": (32,), "image_size": 8, "batch_size": 32},
            "matrix_quadratic": {"shape": (8, 8)}}
OPTIMIZER = "muon_residual_lopt"
OPTIMIZER_KWARGS = {"step_mult": 0.0316, "lr_spread": 3.1623}
SIGMA = 0.01
RESIDUAL_SCALE = 0.2  # theta "residual": the residual MLP's output weights drawn N(0, RESIDUAL_SCALE^2)
ESTIMATOR_NAMES = ("nres", "pes", "truncated_es", "full_es", "tbptt")
LOSS_KINDS = ("meta_loss", "normalized_meta_loss", "loss", "normalized_loss")
FULL_ES_LOSS_TYPES = ("avg", "last", "min")
THETAS = ("init", "residual")
# Leaves of muon_residual_lopt's theta whose meta-gradient is zero by construction: the output bias of the residual
# MLP at every theta (the residual is centred over each tensor, which removes it), and at the initial theta also the
# hidden layer (the output weights are 0 there, so nothing reaches the hidden units). "live" coordinates are the rest
# (on the image-MLP family; on the matrix quadratic, which has no non-matrix tensor, ``log_gain[1]`` is dead too).
DEAD_LEAVES = {"init": ("['mlp']['w0']", "['mlp']['b0']", "['mlp']['b1']"), "residual": ("['mlp']['b1']",)}
SIGN_CLIP = 1e-7  # clip_loss_diff of the *_sign settings: below almost every loss difference (float32 losses ~1)


@dataclasses.dataclass(frozen=True)
class Setting:
  """One row: an estimator configuration at one theta.

  Attributes:
    name: the row's label.
    estimator: a registered estimator name (`metafam.outer_trainers.ESTIMATORS`).
    unroll_length: inner steps per truncation (FullES: the trajectory length).
    lengths: ``(low, high)`` trajectory lengths: constant when equal, else log-uniform.
    loss_kind: the per-step loss of the objective (`metafam.outer_trainers.base.LOSS_KINDS`).
    loss_type: FullES only: "avg", "last" or "min" over the trajectory.
    clip_loss_diff: the estimators' ``clip_loss_diff`` (None: no clip; `SIGN_CLIP`: the sign of the difference).
    theta: "init" (the learned optimizer's initial theta: Muon exactly) or "residual" (the residual switched on).
    pairs: antithetic pairs (TBPTT: lanes) per engine estimate; 1 for per-pair draws.
  """
  name: str
  estimator: str = "nres"
  unroll_length: int = 20
  lengths: Tuple[int, int] = (100, 100)
  loss_kind: str = "normalized_meta_loss"
  loss_type: str = "avg"
  clip_loss_diff: Optional[float] = None
  theta: str = "init"
  pairs: int = 1

  def __post_init__(self):
    if self.estimator not in ESTIMATOR_NAMES:
      raise ValueError(f"{self.name}: estimator must be one of {ESTIMATOR_NAMES}, got {self.estimator!r}.")
    for field in ("unroll_length", "pairs"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{self.name}: {field} must be a positive int, got {value!r}.")
    low, high = self.lengths
    if not 1 <= low <= high:
      raise ValueError(f"{self.name}: lengths must satisfy 1 <= low <= high, got {self.lengths!r}.")
    if self.loss_kind not in LOSS_KINDS:
      raise ValueError(f"{self.name}: loss_kind must be one of {LOSS_KINDS}, got {self.loss_kind!r}.")
    if self.loss_type not in FULL_ES_LOSS_TYPES:
      raise ValueError(f"{self.name}: loss_type must be one of {FULL_ES_LOSS_TYPES}, got {self.loss_type!r}.")
    if self.theta not in THETAS:
      raise ValueError(f"{self.name}: theta must be one of {THETAS}, got {self.theta!r}.")
    if self.estimator == "full_es" and low != high:
      raise ValueError(f"{self.name}: full_es trains whole trajectories of one length; give lengths (L, L).")

  @property
  def burn_in(self) -> int:
    """Estimates discarded before the kept one: the longest trajectory in truncations (0 for stateless FullES)."""
    return 0 if self.estimator == "full_es" else math.ceil(self.lengths[1] / self.unroll_length)

  @property
  def inner_steps_per_pair(self) -> int:
    """Inner steps one pair spends on the kept estimate (both particles; TBPTT: its one lane)."""
    if self.estimator == "full_es":
      return 2 * self.lengths[0]
    per_lane = {"tbptt": 1, "truncated_es": 3}.get(self.estimator, 2)
    return per_lane * self.unroll_length

  def describe(self) -> str:
    low, high = self.lengths
    if self.estimator == "full_es":
      what = f"full_es L={low} {self.loss_type}"
    else:
      sched = f"L={low}" if low == high else f"L~logU({low},{high})"
      what = f"{self.estimator} U={self.unroll_length} {sched}"
    if self.loss_kind != "normalized_meta_loss":
      what += f" {self.loss_kind}"
    if self.clip_loss_diff is not None:
      what += " sign" if self.clip_loss_diff <= SIGN_CLIP else f" clip={self.clip_loss_diff:g}"
    if self.theta != "init":
      what += f" theta={self.theta}"
    if self.pairs != 1:
      what += f" P={self.pairs} (engine)"
    return what


# The rows of the default table. "base" is recipe_c's estimator (NRES, truncations of 20) at a constant trajectory
# length of 100; each other row changes one lever.
DEFAULT_SETTINGS: Tuple[Setting, ...] = (
    Setting("base"),
    Setting("nres_u10", unroll_length=10),
    Setting("nres_u50", unroll_length=50),
    Setting("pes_20", estimator="pes"),
    Setting("tes_20", estimator="truncated_es"),
    Setting("nres_train_loss", loss_kind="normalized_loss"),
    Setting("nres_sign", clip_loss_diff=SIGN_CLIP),
    Setting("full_es_avg", estimator="full_es"),
    Setting("full_es_last", estimator="full_es", loss_type="last"),
    Setting("full_es_avg_sign", estimator="full_es", clip_loss_diff=SIGN_CLIP),
    Setting("tbptt_20", estimator="tbptt"),
    Setting("nres_residual", theta="residual"),
    Setting("direct_p8", pairs=8),
    Setting("nres_logu", lengths=(100, 2000)),
    Setting("pes_logu", estimator="pes", lengths=(100, 2000)),
)
QUICK_SETTINGS: Tuple[Setting, ...] = (Setting("quick", unroll_length=10, lengths=(40, 40)),)
PAIRS_GRID = (4, 8, 16, 32)


# -- statistics (pure numpy; what tests/project/test_meta_gradient_signal.py checks on synthetic draws) ----------------

def signal_statistics(estimates: np.ndarray) -> Dict[str, Any]:
  """The signal statistics of ``n`` independent estimates of a ``d``-vector (``estimates``: ``[n, d]``, n >= 4).

  Returns a dict of plain floats and arrays:
    ``n``, ``d``; per coordinate ``mean``, ``sd`` (ddof 1), ``t`` = ``|mean| / (sd / sqrt(n))`` (0 where both mean
    and sd are 0, inf where only sd is) and ``r`` = ``t / sqrt(n)`` (one estimate's SNR);
    ``median_t``, ``frac_t_gt_2``, ``median_r``;
    ``norm2_mean``: the unbiased U-statistic ``mean_{i != k} g_i . g_k`` of ``|E g|^2`` (may be negative);
    ``total_var``: ``sum_j sd_j^2``, the unbiased ``E |g - E g|^2``;
    ``rho2`` = ``norm2_mean / total_var`` and ``rho`` = ``sqrt(max(rho2, 0))``: one estimate's whole-vector SNR;
    ``rho2_se``: the standard error of ``rho2`` from the U-statistic's variance, ``(4 / n) Var(g . mu) +
    2 tr(Sigma^2) / (n (n - 1))`` (Hoeffding), with ``Var(g . mu)`` and ``tr(Sigma^2)`` estimated from the draws,
    divided by ``total_var`` (whose own noise is ignored);
    ``cos_half``: the cosine between the means of the first and the last ``n // 2`` estimates;
    ``proj_snr``: mean / sd of every estimate's projection on the unit mean direction of the *other* half (cross-fit,
    so no estimate is projected on a direction fitted to itself).
  Raises ValueError for anything but a finite 2-D array with at least 4 rows.
  """
  g = np.asarray(estimates, np.float64)
  if g.ndim != 2:
    raise ValueError(f"estimates must be a 2-D array [n, d], got shape {g.shape}.")
  n, d = g.shape
  if n < 4 or d < 1:
    raise ValueError(f"estimates needs at least 4 draws and 1 coordinate, got shape {g.shape}.")
  if not np.all(np.isfinite(g)):
    raise ValueError("estimates must be finite (drop non-finite draws first).")
  mean = g.mean(axis=0)
  sd = g.std(axis=0, ddof=1)
  with np.errstate(divide="ignore", invalid="ignore"):
    t = np.where(sd > 0, np.abs(mean) / (sd / np.sqrt(n)), np.where(mean == 0, 0.0, np.inf))
  total = g.sum(axis=0)
  norm2_mean = (total @ total - np.sum(g * g)) / (n * (n - 1))
  total_var = float(np.sum(sd ** 2))
  rho2 = norm2_mean / total_var if total_var > 0 else math.inf
  centred = g - mean
  small = centred @ centred.T if n <= d else centred.T @ centred  # the same non-zero eigenvalues
  trace_sigma2 = float(np.sum(small ** 2)) / (n - 1) ** 2
  var_u = 4.0 / n * float(np.var(centred @ mean, ddof=1)) + 2.0 * trace_sigma2 / (n * (n - 1))
  rho2_se = math.sqrt(var_u) / total_var if total_var > 0 else math.nan
  half = n // 2
  first, last = g[:half], g[n - half:]
  cos_half = _cosine(first.mean(axis=0), last.mean(axis=0))
  projections = np.concatenate([last @ _unit(first.mean(axis=0)), first @ _unit(last.mean(axis=0))])
  proj_sd = projections.std(ddof=1)
  return {"n": int(n), "d": int(d), "mean": mean, "sd": sd, "t": t, "r": t / np.sqrt(n),
          "median_t": float(np.median(t)), "frac_t_gt_2": float(np.mean(t > 2)),
          "median_r": float(np.median(t) / np.sqrt(n)), "norm2_mean": float(norm2_mean), "total_var": total_var,
          "rho2": float(rho2), "rho": float(math.sqrt(max(rho2, 0.0))), "rho2_se": float(rho2_se), "cos_half": cos_half,
          "proj_snr": float(projections.mean() / proj_sd) if proj_sd > 0 else math.nan}


def _unit(v: np.ndarray) -> np.ndarray:
  norm = np.linalg.norm(v)
  return v / norm if norm > 0 else v


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
  denom = np.linalg.norm(a) * np.linalg.norm(b)
  return float(a @ b / denom) if denom > 0 else math.nan


def group_means(per_pair: np.ndarray, pairs: int) -> np.ndarray:
  """``[n // pairs, d]``: consecutive groups of ``pairs`` per-pair draws averaged, i.e. ``n // pairs`` independent
  estimates of ``pairs`` pairs each (a remainder is dropped)."""
  per_pair = np.asarray(per_pair)
  if not isinstance(pairs, (int, np.integer)) or isinstance(pairs, bool) or pairs < 1:
    raise ValueError(f"pairs must be a positive int, got {pairs!r}.")
  groups = per_pair.shape[0] // pairs
  if groups < 1:
    raise ValueError(f"{per_pair.shape[0]} draws hold no group of {pairs} pairs.")
  return per_pair[:groups * pairs].reshape((groups, pairs) + per_pair.shape[1:]).mean(axis=1)


def mean_pairwise_cosine(estimates: np.ndarray) -> float:
  """The mean cosine between estimates ``2i`` and ``2i + 1`` (disjoint pairs of independent estimates)."""
  g = np.asarray(estimates, np.float64)
  m = g.shape[0] // 2
  if m < 1:
    raise ValueError("mean_pairwise_cosine needs at least 2 estimates.")
  return float(np.mean([_cosine(g[2 * i], g[2 * i + 1]) for i in range(m)]))


def direction_cosine(a: np.ndarray, b: np.ndarray) -> float:
  """The cosine between the expectations of two sets of independent draws ``a [n_a, d]`` and ``b [n_b, d]``,
  corrected for their noise: ``mu_a . mu_b`` from cross-fitted half means (the first half of ``a`` with the last
  half of ``b`` and vice versa, which share no draw, so its expectation is exact even when draw ``i`` of ``a`` and
  of ``b`` came from the same key) over ``sqrt(|mu_a|^2 |mu_b|^2)`` from the U-statistics of `signal_statistics`.
  NaN when either squared norm is not positive (no resolved signal); noisy inputs may give values outside [-1, 1]."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
    raise ValueError(f"direction_cosine needs [n, d] arrays of the same d, got {a.shape} and {b.shape}.")
  ha, hb = a.shape[0] // 2, b.shape[0] // 2
  dot = 0.5 * (a[:ha].mean(axis=0) @ b[b.shape[0] - hb:].mean(axis=0)
               + a[a.shape[0] - ha:].mean(axis=0) @ b[:hb].mean(axis=0))
  na, nb = signal_statistics(a)["norm2_mean"], signal_statistics(b)["norm2_mean"]
  return float(dot / math.sqrt(na * nb)) if na > 0 and nb > 0 else math.nan


def es_efficiency(rho2_per_pair: float, d: int) -> float:
  """``rho_1^2 (d + 1)``: one pair's squared whole-vector SNR relative to that of noise-free antithetic ES on a
  linear loss in ``d`` dimensions, ``1 / (d + 1)`` (see the module docstring)."""
  return float(rho2_per_pair * (d + 1))


def pairs_for_unit_snr(median_t: float, num_draws: int) -> float:
  """Pairs one estimate needs for SNR 1 on the median coordinate, from the median ``t`` over ``num_draws``
  per-pair draws: ``num_draws / (median_t^2 - 1)`` (``t^2`` less its noise, 1), or inf when ``median_t^2 < 2`` (not
  resolved: the median coordinate is not distinguishable from no signal with these draws)."""
  excess = median_t ** 2 - 1.0
  return math.inf if median_t ** 2 < 2.0 else float(num_draws / excess)


# -- drawing the estimates ----------------------------------------------------------------------------------------

def _build(setting: Setting, family_name: str = "image_mlp"):
  """(estimator, theta, coordinate names) of a setting on the family ``family_name`` (a key of `FAMILIES`)."""
  import jax
  from metafam.inner.schedules import ConstantSchedule, LogUniformSchedule
  from metafam.optimizers.registry import get_learned_optimizer
  from metafam.outer_trainers.registry import make_estimator
  from metafam.benchmark.planted import MatrixQuadraticFamily
  from metafam.taskfamilies.image_mlp import ImageMLPFamily

  if family_name not in FAMILIES:
    raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {family_name!r}.")
  lopt = get_learned_optimizer(OPTIMIZER, **OPTIMIZER_KWARGS)
  family = (ImageMLPFamily if family_name == "image_mlp" else MatrixQuadraticFamily)(**FAMILIES[family_name])
  theta = lopt.init(jax.random.key(0))
  if setting.theta == "residual":
    w1 = theta["mlp"]["w1"]
    theta = dict(theta, mlp=dict(theta["mlp"], w1=RESIDUAL_SCALE * jax.random.normal(jax.random.key(123), w1.shape)))
  low, high = setting.lengths
  schedule = ConstantSchedule(low) if low == high else LogUniformSchedule(low, high)
  kwargs: Dict[str, Any] = {"loss_kind": setting.loss_kind}
  if setting.estimator == "full_es":
    kwargs.update(trajectory_length=low, loss_type=setting.loss_type)
  else:
    kwargs["unroll_length"] = setting.unroll_length
  if setting.estimator != "tbptt":
    kwargs.update(sigma=SIGMA, clip_loss_diff=setting.clip_loss_diff)
  elif setting.clip_loss_diff is not None:
    raise ValueError(f"{setting.name}: tbptt has no clip_loss_diff.")
  estimator = make_estimator(setting.estimator, family, lopt, num_tasks=setting.pairs, schedule=schedule, **kwargs)
  names = [f"{jax.tree_util.keystr(path)}[{i}]" for path, leaf in jax.tree_util.tree_leaves_with_path(theta)
           for i in range(int(np.size(leaf)))]
  return estimator, theta, names


def draw_estimates(setting: Setting, num_draws: int, seed: int = 0, chunk: int = 128, family: str = "image_mlp"):
  """``(grads [num_draws, d], meta_losses [num_draws], nonfinite [num_draws], names)``: one kept estimate per
  independent chain (fresh worker state, ``setting.burn_in`` discarded estimates, then the kept one), all chains of
  a chunk in one jitted `jax.vmap` of the estimator's own ``estimate_fn``."""
  import jax
  from jax.flatten_util import ravel_pytree

  estimator, theta, names = _build(setting, family)
  burn_in = setting.burn_in

  def chain(key):
    k_init, k_burn, k_keep = jax.random.split(key, 3)
    state = estimator.init_worker_state(theta, k_init)
    if burn_in:
      def body(state, k):
        return estimator.estimate_fn(theta, state, k)[1], None
      state, _ = jax.lax.scan(body, state, jax.random.split(k_burn, burn_in))
    estimate, _ = estimator.estimate_fn(theta, state, k_keep)
    return ravel_pytree(estimate.grad)[0], estimate.meta_loss, estimate.metrics["num_nonfinite"]

  run = jax.jit(jax.vmap(chain))
  keys = jax.random.split(jax.random.key(seed), num_draws)
  parts = [jax.device_get(run(keys[i:i + chunk])) for i in range(0, num_draws, chunk)]
  grads, losses, bad = (np.concatenate([np.asarray(p[j], np.float64) for p in parts]) for j in range(3))
  return grads, losses, bad, names


# -- one setting, the table ---------------------------------------------------------------------------------------

def _leaf_of(name: str) -> str:
  return name.rsplit("[", 1)[0]


def measure(setting: Setting, num_tasks: int, seed: int, pairs_grid: Sequence[int],
            family: str = "image_mlp", keep_draws: bool = False) -> Dict[str, Any]:
  """Draws ``num_tasks // setting.pairs`` estimates of ``setting`` and returns its row (plain JSON data; with
  ``keep_draws`` also ``row["draws_array"]``, the ``[draws, d]`` estimates, not JSON)."""
  start = time.time()
  draws = max(num_tasks // setting.pairs, 4)
  grads, losses, bad, names = draw_estimates(setting, draws, seed, family=family)
  seconds = time.time() - start
  finite = np.all(np.isfinite(grads), axis=1) & np.isfinite(losses)
  kept = grads[finite]
  if kept.shape[0] < 4:
    raise RuntimeError(f"{setting.name}: only {kept.shape[0]} of {draws} draws were finite.")
  stats = signal_statistics(kept)
  d, n = stats["d"], stats["n"]
  pair_draws = n * setting.pairs  # pairs behind the statistics (t depends on these only)
  # rho2 of one pair: an estimate of P pairs has P times the rho2 of one.
  rho2_pair = stats["rho2"] / setting.pairs
  rho2_pair_se = stats["rho2_se"] / setting.pairs
  row = {"name": setting.name, "setting": setting.describe(), "config": dataclasses.asdict(setting),
         "draws": int(draws), "finite_draws": int(n), "pairs_per_draw": setting.pairs, "pair_draws": int(pair_draws),
         "nonfinite_steps_or_pairs": float(np.sum(bad)), "seconds": round(seconds, 1), "d": d,
         "burn_in_truncations": setting.burn_in, "inner_steps_per_pair": setting.inner_steps_per_pair,
         "meta_loss_mean": float(np.mean(losses[finite])),
         "median_t": stats["median_t"], "frac_t_gt_2": stats["frac_t_gt_2"], "median_r": stats["median_r"],
         "rho2": stats["rho2"], "rho": stats["rho"], "rho2_per_pair": rho2_pair, "rho2_per_pair_se": rho2_pair_se,
         "es_efficiency": es_efficiency(rho2_pair, d), "es_efficiency_se": es_efficiency(rho2_pair_se, d),
         "pairs_for_rho_1": (1.0 / rho2_pair) if rho2_pair > 0 else math.inf,
         "pairs_for_median_r_1": pairs_for_unit_snr(stats["median_t"], pair_draws),
         "cos_half": stats["cos_half"], "proj_snr": stats["proj_snr"]}
  gain = names.index("['log_gain'][0]")
  row["t_log_gain0"] = float(stats["t"][gain])
  live = np.array([_leaf_of(name) not in DEAD_LEAVES[setting.theta] for name in names])
  row["live_coords"] = int(live.sum())
  row["median_t_live"] = float(np.median(stats["t"][live]))
  row["frac_t_gt_2_live"] = float(np.mean(stats["t"][live] > 2))
  row["pairs_for_median_live_r_1"] = pairs_for_unit_snr(row["median_t_live"], pair_draws)
  leaves: Dict[str, List[int]] = {}
  for i, name in enumerate(names):
    leaves.setdefault(_leaf_of(name), []).append(i)
  row["by_leaf"] = {leaf: {"coords": len(idx), "median_t": float(np.median(stats["t"][idx])),
                           "frac_t_gt_2": float(np.mean(stats["t"][idx] > 2))} for leaf, idx in leaves.items()}
  row["t"] = [float(x) for x in stats["t"]]
  row["mean"] = [float(x) for x in stats["mean"]]
  row["sd"] = [float(x) for x in stats["sd"]]
  if setting.pairs == 1:
    grid = []
    for p in pairs_grid:
      if kept.shape[0] // p < 4:
        continue
      grouped = group_means(kept, p)
      gs = signal_statistics(grouped)
      grid.append({"pairs": p, "estimates": gs["n"], "median_r": gs["median_r"],
                   "frac_r_gt_1": float(np.mean(gs["r"] > 1)), "rho": gs["rho"],
                   "rho_predicted": math.sqrt(max(rho2_pair, 0.0) * p),
                   "cos_two_estimates": mean_pairwise_cosine(grouped)})
    row["pairs_grid"] = grid
  if keep_draws:
    row["draws_array"] = grads
  return row


def _fmt(x: float, digits: int = 2) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "nan"
  if math.isinf(x):
    return "unresolved"
  if abs(x) >= 1000:
    return f"{x:,.0f}"
  return f"{x:.{digits}f}"


def markdown(rows: Sequence[Dict[str, Any]]) -> str:
  """The Markdown tables of measured ``rows``: the main table, the pairs grid of every per-pair row, and the
  per-leaf breakdown of the first row."""
  lines = ["| setting | pair draws | inner steps / pair | median t (all) | frac t>2 (all) | median t (live) | "
           "frac t>2 (live) | t log_gain[0] | rho (1 pair) | ES efficiency (+- se) | pairs for rho=1 | "
           "pairs for median live r=1 | cos_half | s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['name']}: {r['setting']} | {r['pair_draws']} | {r['inner_steps_per_pair']} | "
                 f"{_fmt(r['median_t'])} | {_fmt(r['frac_t_gt_2'])} | {_fmt(r['median_t_live'])} | "
                 f"{_fmt(r['frac_t_gt_2_live'])} | {_fmt(r['t_log_gain0'], 1)} | "
                 f"{_fmt(math.sqrt(max(r['rho2_per_pair'], 0.0)), 3)} | {_fmt(r['es_efficiency'])} +- "
                 f"{_fmt(r['es_efficiency_se'])} | "
                 f"{_fmt(r['pairs_for_rho_1'], 0)} | {_fmt(r['pairs_for_median_live_r_1'], 0)} | {_fmt(r['cos_half'])} | "
                 f"{r['seconds']:.0f} |")
  grids = [r for r in rows if r.get("pairs_grid")]
  if grids:
    lines += ["", "Estimates of P pairs (grouped per-pair draws): median over coordinates of one estimate's SNR r, "
              "fraction of coordinates with r > 1, whole-vector rho (measured; predicted sqrt(P) rho_1), mean "
              "cosine of two independent estimates.", "",
              "| setting | P | estimates | median r | frac r>1 | rho | rho predicted | cos(two estimates) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in grids:
      for gr in r["pairs_grid"]:
        lines.append(f"| {r['name']} | {gr['pairs']} | {gr['estimates']} | {_fmt(gr['median_r'])} | "
                     f"{_fmt(gr['frac_r_gt_1'])} | {_fmt(gr['rho'])} | {_fmt(gr['rho_predicted'])} | "
                     f"{_fmt(gr['cos_two_estimates'])} |")
  lines += ["", f"Per leaf of theta ({rows[0]['name']}; median t and fraction t > 2 per leaf, then the same for "
            "every row):", ""]
  leaves = list(rows[0]["by_leaf"])
  lines += ["| setting | " + " | ".join(f"{leaf} ({rows[0]['by_leaf'][leaf]['coords']})" for leaf in leaves) + " |",
            "|---|" + "---|" * len(leaves)]
  for r in rows:
    cells = [f"{_fmt(r['by_leaf'][leaf]['median_t'], 1)} / {_fmt(r['by_leaf'][leaf]['frac_t_gt_2'])}"
             for leaf in leaves]
    lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true",
                      help="one small setting (NRES, U=10, L=40) with 32 pair draws on the 8x8 matrix quadratic: a "
                           "smoke run (< 60 s)")
  parser.add_argument("--family", choices=sorted(FAMILIES), default=None,
                      help="the task family (default image_mlp; matrix_quadratic with --quick)")
  parser.add_argument("--only", default="",
                      help="comma-separated setting names to run (default: all); known: "
                           + ", ".join(s.name for s in DEFAULT_SETTINGS))
  parser.add_argument("--pairs-total", type=int, default=None,
                      help="independent antithetic pairs per setting (default 256; 32 with --quick)")
  parser.add_argument("--seed", type=int, default=0, help="the key of the draws (the same for every setting)")
  parser.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON to PATH")
  parser.add_argument("--draws", default=None, metavar="PATH",
                      help="also write every setting's raw estimates [draws, d] to PATH (.npz, one array per setting)")
  parser.add_argument("--cosines", default=None, metavar="PATH[,PATH]",
                      help="measure nothing: print the noise-corrected cosine between every setting's mean estimate "
                           "and --reference's, from .npz files written by --draws")
  parser.add_argument("--reference", default="base", help="the reference setting of --cosines (default base)")
  args = parser.parse_args(argv)
  if args.pairs_total is None:
    args.pairs_total = 32 if args.quick else 256
  if args.family is None:
    args.family = "matrix_quadratic" if args.quick else "image_mlp"
  if args.pairs_total < 8:
    parser.error(f"--pairs-total must be at least 8, got {args.pairs_total}.")
  if args.seed < 0:
    parser.error(f"--seed must be >= 0, got {args.seed}.")
  known = {s.name: s for s in (QUICK_SETTINGS if args.quick else DEFAULT_SETTINGS)}
  if args.only:
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
      parser.error(f"--only: unknown settings {unknown}; known: {', '.join(known)}.")
    args.settings = [known[n] for n in names]
  else:
    args.settings = list(known.values())
  for s in args.settings:
    if args.pairs_total // s.pairs < 4:
      parser.error(f"--pairs-total {args.pairs_total} gives setting {s.name} ({s.pairs} pairs per estimate) fewer "
                   "than 4 estimates.")
  return args


def cosine_table(paths: Sequence[str], reference: str) -> str:
  """The Markdown table of `direction_cosine` between each setting's draws in the ``--draws`` files ``paths`` and
  those of ``reference`` (settings at another theta than the reference's are compared all the same: say so)."""
  arrays: Dict[str, np.ndarray] = {}
  for path in paths:
    with np.load(path) as data:
      arrays.update({k: data[k] for k in data.files})
  if reference not in arrays:
    raise ValueError(f"--reference {reference!r} is not in {', '.join(paths)} (settings: {', '.join(arrays)}).")
  lines = [f"| setting | cosine of its mean estimate with {reference}'s |", "|---|---|"]
  for name, draws in arrays.items():
    if name != reference:
      lines.append(f"| {name} | {_fmt(direction_cosine(draws, arrays[reference]))} |")
  return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  if args.cosines:
    print(cosine_table([p for p in args.cosines.split(",") if p], args.reference))
    return 0
  import jax
  grid = tuple(p for p in PAIRS_GRID if args.pairs_total // p >= 4)
  print(f"# meta-gradient signal: {OPTIMIZER} {OPTIMIZER_KWARGS}, {args.family} {FAMILIES[args.family]}, "
        f"sigma {SIGMA}, "
        f"{args.pairs_total} pairs per setting, seed {args.seed}, JAX {jax.__version__}, "
        f"{jax.devices()[0].platform}", flush=True)
  rows, arrays = [], {}
  for setting in args.settings:
    row = measure(setting, args.pairs_total, args.seed, grid, args.family, keep_draws=bool(args.draws))
    if args.draws:
      arrays[setting.name] = row.pop("draws_array")
      np.savez_compressed(args.draws, **arrays)
    rows.append(row)
    print(f"{row['name']}: median t {row['median_t']:.2f}, frac t>2 {row['frac_t_gt_2']:.2f}, rho(1 pair) "
          f"{math.sqrt(max(row['rho2_per_pair'], 0)):.3f}, cos_half {row['cos_half']:.2f} ({row['seconds']:.0f} s)",
          file=sys.stderr, flush=True)
    if args.json:  # rewritten after every row, so a long run leaves what it measured
      with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"settings": {"optimizer": OPTIMIZER, "optimizer_kwargs": OPTIMIZER_KWARGS,
                                "family": args.family, "family_kwargs": FAMILIES[args.family], "sigma": SIGMA,
                                "pairs_total": args.pairs_total, "seed": args.seed,
                                "jax": jax.__version__}, "rows": rows}, f, indent=1)
  print(markdown(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
