"""Held-out comparison of learned optimizers with tuned Adam: losses, per-instance curves and speedups.

`compare_with_tuned_adam(evaluator, learned_opt, thetas, key)` trains ``evaluator.num_tasks`` fresh instances of the
evaluator's family for ``evaluator.num_steps`` steps with Adam at the learning rate `FamilyEvaluator.tune_adam`
selects (on ``inner_valid``) and with each learned optimizer, all on the same instances and batches, and scores the
updated params after every step on ``evaluator.split`` (normally ``test``).

Every step scores one fresh batch of the split, so a single instance's curve is noisy (on the 8x8 image-MLP family
the step-to-step standard deviation, about 0.05, exceeds what tuned Adam gains between steps 100 and 200). Speedups
are therefore computed on smoothed curves (`smooth_curves`): the loss at step t is the mean of the last ``smoothing``
per-step losses (default ``T // 10``), which averages ``smoothing`` test batches and lags both curves equally.

Speedup over tuned Adam, per instance ``i`` (`instance_speedups`): the target is Adam's final smoothed loss on
instance ``i`` (the running minimum of its smoothed curve at the last step T, as in
`metafam.evaluation.metrics.speedup_over_baseline`, applied by `metafam.evaluation.metrics.paired_speedups`);
``s_i`` is the first (log-interpolated) step at which the learned optimizer's smoothed running-minimum curve reaches that target, and the speedup is ``T / s_i``:
reaching Adam's step-T loss by step T / 2 scores 2. The trailing window delays the learned optimizer's crossing by up
to ``smoothing / 2`` steps more than it moves Adam's target, so speedups err low (a true 2.0 reads about 1.9 with the
defaults). An instance on which the learned optimizer never reaches the target within T steps has a speedup below 1
of unknown size; it counts as 0, the most conservative value, and the fraction of instances reached is reported
beside it.

Across instances the statistic is the **median** of the per-instance speedups (``statistic="iqm"`` is also accepted)
with a seeded 95% percentile-bootstrap interval over instances (`metafam.evaluation.metrics.aggregate`). The median is
the statistic that does not depend on how the unreached instances are counted, as long as fewer than half of them
are unreached (any value below the median gives the same median), and it is robust to the heavy right tail of
``T / s_i`` (an instance reached at step 5 scores 40). ``mean_curve_speedup`` is the same crossing computed once on
the instance-mean curves (a ratio of steps of the average learning curves), given for reference.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metafam.evaluation.metrics import STATISTICS, Aggregate, Speedup, aggregate, paired_speedups
from metafam.evaluation.family_eval import FamilyEvaluator

UNREACHED_SPEEDUP = 0.0  # the speedup counted for an instance whose target was never reached


def instance_curves(evaluator: FamilyEvaluator, learned_opt: Any, theta: Any, key: jax.Array) -> np.ndarray:
  """``f64[num_steps, num_tasks]``: per-instance normalized ``evaluator.split`` loss after each step (inf where a step
  went non-finite); `FamilyEvaluator.instance_curves`, with the evaluator's programs (compiled once per learned
  optimizer, which they do not keep alive). ``evaluator.evaluate(learned_opt, theta, key)`` is their mean."""
  return evaluator.instance_curves(learned_opt, theta, key)


def smooth_curves(curves: np.ndarray, window: int) -> np.ndarray:
  """Trailing means over ``window`` steps along axis 0 (fewer at the start: step t averages steps 1..t when
  ``t < window``); non-finite values stay non-finite in every window that holds them."""
  if not isinstance(window, (int, np.integer)) or window < 1:
    raise ValueError(f"window must be a positive int, got {window!r}.")
  x = np.asarray(curves, np.float64)
  cumsum = np.cumsum(np.where(np.isfinite(x), x, 0.0), axis=0)
  bad = np.cumsum(~np.isfinite(x), axis=0)
  total, nbad = cumsum.copy(), bad.copy()
  total[window:] -= cumsum[:-window]
  nbad[window:] -= bad[:-window]
  count = np.minimum(np.arange(1, x.shape[0] + 1), window).reshape((-1,) + (1,) * (x.ndim - 1))
  return np.where(nbad > 0, np.inf, total / count)


def _check_curves(learned: np.ndarray, adam: np.ndarray) -> tuple:
  learned, adam = np.asarray(learned, np.float64), np.asarray(adam, np.float64)
  if learned.ndim != 2 or learned.shape != adam.shape or learned.shape[0] < 1:
    raise ValueError(f"curves must both be [num_steps, num_tasks] with num_steps >= 1, got {learned.shape} and "
                     f"{adam.shape}.")
  return learned, adam, np.arange(1, learned.shape[0] + 1, dtype=np.float64)


def _over_adam(s: Speedup, num_steps: int) -> tuple:
  """``(speedup, reached, learned steps)`` from a `Speedup` in which Adam's curve was the "optimizer" (its final
  loss the target) and the learned optimizer's the "baseline" that has to reach it."""
  reached = bool(s.reached and np.isfinite(s.target))
  needed = s.baseline_steps_needed if reached else float("nan")
  return (num_steps / max(needed, 1e-12) if reached else UNREACHED_SPEEDUP), reached, needed


def instance_speedups(learned: np.ndarray, adam: np.ndarray) -> tuple:
  """Per-instance speedups over Adam from (smoothed) curves ``[num_steps, num_tasks]`` (loss after steps 1..T).

  Returns ``(speedups f64[num_tasks], reached bool[num_tasks], learned_steps f64[num_tasks])``: ``learned_steps`` is
  the step at which the learned optimizer first reaches Adam's final loss (NaN if never) and the speedup is
  ``T / learned_steps``, or ``UNREACHED_SPEEDUP`` (0) where never reached. See the module docstring.
  """
  learned, adam, steps = _check_curves(learned, adam)
  _, per_instance = paired_speedups(steps, adam, steps, learned, axis=1)
  speedups, reached, needed = zip(*(_over_adam(s, learned.shape[0]) for s in per_instance))
  return np.asarray(speedups), np.asarray(reached), np.asarray(needed)


def mean_curve_speedup(learned: np.ndarray, adam: np.ndarray) -> float:
  """``T / s`` for the instance-mean of (smoothed) curves (``s``: the step at which the learned mean curve first
  reaches Adam's final mean loss); ``UNREACHED_SPEEDUP`` if it never does."""
  learned, adam, steps = _check_curves(learned, adam)
  mean, _ = paired_speedups(steps, adam, steps, learned, axis=1, per_seed=False)
  return float(_over_adam(mean, learned.shape[0])[0])


def _finite_mean(x: np.ndarray) -> float:
  return float(np.mean(x)) if np.all(np.isfinite(x)) else float("nan")


@dataclasses.dataclass(frozen=True)
class LearnedResult:
  """One learned optimizer (one theta) on the held-out instances.

  Attributes:
    name: the label it was given.
    curves: ``f64[num_steps, num_tasks]`` per-instance normalized losses after each step (unsmoothed).
    speedups: ``f64[num_tasks]`` per-instance speedups over tuned Adam (0 where Adam's final loss is never reached).
    reached: ``bool[num_tasks]``: whether the learned optimizer reached Adam's final loss on that instance.
    learned_steps: ``f64[num_tasks]``: the step at which it did (NaN if never).
    speedup: `Aggregate` of ``speedups`` (median or IQM with a bootstrap interval over instances).
    mean_curve_speedup: the crossing computed on the instance-mean curves.
  """
  name: str
  curves: np.ndarray
  speedups: np.ndarray
  reached: np.ndarray
  learned_steps: np.ndarray
  speedup: Aggregate
  mean_curve_speedup: float

  @property
  def final_loss(self) -> float:
    """Mean over instances of the loss after the last step (NaN if any instance is non-finite)."""
    return _finite_mean(self.curves[-1])

  @property
  def mean_loss(self) -> float:
    """Mean over steps and instances (NaN if anything is non-finite)."""
    return _finite_mean(self.curves)

  @property
  def fraction_reached(self) -> float:
    return float(np.mean(self.reached))


@dataclasses.dataclass(frozen=True)
class HeldOutComparison:
  """Result of `compare_with_tuned_adam`.

  Attributes:
    family: the family's name.
    split: the scored split (normally "test"); Adam's lr was selected on ``select_split``.
    select_split: the split tune_adam selected the lr on.
    num_tasks, num_steps: held-out instances and inner steps.
    adam_lr: the selected Adam learning rate.
    adam_select_scores: ``{lr: mean select_split loss over the last 10% of steps}`` of the sweep (inf, null in JSON,
      for a diverged lr: see `metafam.evaluation.tuning`).
    adam_curves: ``f64[num_steps, num_tasks]`` Adam's per-instance curves at ``adam_lr``.
    learned: ``{name: LearnedResult}`` in the order given.
    statistic, confidence: how per-instance speedups were aggregated.
    smoothing: the trailing window (steps) of the curves the speedups were computed on.
  """
  family: str
  split: str
  select_split: str
  num_tasks: int
  num_steps: int
  adam_lr: float
  adam_select_scores: Dict[float, float]
  adam_curves: np.ndarray
  learned: Dict[str, LearnedResult]
  statistic: str
  confidence: float
  smoothing: int

  @property
  def adam_final_loss(self) -> float:
    return _finite_mean(self.adam_curves[-1])

  @property
  def adam_mean_loss(self) -> float:
    return _finite_mean(self.adam_curves)

  def mean_curves(self) -> Dict[str, np.ndarray]:
    """``{label: f64[num_steps]}`` instance-mean curves, learned optimizers first, then Adam (for plots)."""
    curves = {name: r.curves.mean(axis=1) for name, r in self.learned.items()}
    curves[self.adam_label] = self.adam_curves.mean(axis=1)
    return curves

  @property
  def adam_label(self) -> str:
    return f"Adam (tuned lr={self.adam_lr:.2g})"

  def to_json(self) -> Dict[str, Any]:
    """A JSON-able summary (no per-step curves; per-instance speedups and final losses included)."""
    def num(x):
      return float(x) if np.isfinite(x) else None

    learned = {}
    for name, r in self.learned.items():
      learned[name] = {
          "final_loss": num(r.final_loss), "mean_loss": num(r.mean_loss),
          "final_loss_per_instance": [num(x) for x in r.curves[-1]],
          "speedup": {"statistic": r.speedup.statistic, "value": num(r.speedup.value), "low": num(r.speedup.low),
                      "high": num(r.speedup.high), "confidence": r.speedup.confidence},
          "speedup_per_instance": [num(x) for x in r.speedups],
          "steps_to_adam_final_loss": [num(x) for x in r.learned_steps],
          "fraction_reached": r.fraction_reached, "mean_curve_speedup": num(r.mean_curve_speedup)}
    return {"family": self.family, "split": self.split, "select_split": self.select_split, "tasks": self.num_tasks,
            "inner_steps": self.num_steps,
            "adam": {"lr": self.adam_lr, "final_loss": num(self.adam_final_loss), "mean_loss": num(self.adam_mean_loss),
                     "final_loss_per_instance": [num(x) for x in self.adam_curves[-1]],
                     "select_scores": {f"{lr:g}": num(s) for lr, s in self.adam_select_scores.items()}},
            "learned": learned,
            "smoothing": self.smoothing,
            "speedup_definition": (f"{self.statistic} over instances of T / (first step the learned optimizer reaches "
                                   f"tuned Adam's step-T loss on that instance), 0 where never reached; curves "
                                   f"smoothed by a trailing mean over {self.smoothing} steps; {self.confidence:.0%} "
                                   f"bootstrap interval over instances")}

  def format_table(self) -> str:
    """An aligned text table: final and mean loss per optimizer, speedup over tuned Adam with its interval."""
    pct = f"{self.confidence:.0%}"
    head = (f"held-out comparison: {self.num_tasks} fresh instances of {self.family}, {self.num_steps} inner steps, "
            f"normalized {self.split} loss; Adam's lr tuned on {self.select_split}")
    rows = [("optimizer", "final loss", "mean loss", f"speedup vs Adam [{pct} CI]", "reached")]
    for name, r in self.learned.items():
      a = r.speedup
      rows.append((name, f"{r.final_loss:.4f}", f"{r.mean_loss:.4f}",
                   f"{a.value:.2f} [{a.low:.2f}, {a.high:.2f}]", f"{int(r.reached.sum())}/{self.num_tasks}"))
    rows.append((self.adam_label, f"{self.adam_final_loss:.4f}", f"{self.adam_mean_loss:.4f}", "1 (reference)", ""))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = [head] + ["  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in
                                enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.append(f"speedup: {self.statistic} over instances of T / (step at which the learned optimizer first reaches "
                 f"tuned Adam's final loss on that instance; 0 if never), on curves averaged over the last "
                 f"{self.smoothing} steps")
    return "\n".join(lines)


def _as_evaluator(evaluator_or_family: Any, num_tasks: Optional[int], num_steps: Optional[int]) -> FamilyEvaluator:
  if isinstance(evaluator_or_family, FamilyEvaluator):
    ev = evaluator_or_family
    if (num_tasks is not None and num_tasks != ev.num_tasks) or (num_steps is not None and num_steps != ev.num_steps):
      raise ValueError(f"num_tasks/num_steps ({num_tasks}/{num_steps}) differ from the evaluator's "
                       f"({ev.num_tasks}/{ev.num_steps}); leave them out or build another FamilyEvaluator.")
    return ev
  return FamilyEvaluator(evaluator_or_family, 16 if num_tasks is None else num_tasks,
                         200 if num_steps is None else num_steps)


def compare_with_tuned_adam(evaluator_or_family: Any, learned_opt: Any, thetas: Mapping[str, Any], key: jax.Array,
                            num_tasks: Optional[int] = None, num_steps: Optional[int] = None,
                            statistic: str = "median", confidence: float = 0.95, num_resamples: int = 2000,
                            seed: int = 0, min_tasks: int = 16, smoothing: Optional[int] = None
                            ) -> HeldOutComparison:
  """Compares ``learned_opt`` at each of ``thetas`` with tuned Adam on the same held-out instances.

  Args:
    evaluator_or_family: a `FamilyEvaluator` (its family, instances, steps, split and Adam lr grid are used) or a
      `TaskFamily` (then a ``FamilyEvaluator(family, num_tasks or 16, num_steps or 200)`` on the test split).
    learned_opt: the learned optimizer; ``thetas``: ``{label: theta}``, e.g. ``{"learned (init)": theta0,
      "learned (final)": theta}``.
    key: selects the instances and batches (the same for every optimizer).
    statistic: "median" (default) or "iqm" of the per-instance speedups; ``confidence``, ``num_resamples`` and
      ``seed`` set its bootstrap interval (`metafam.evaluation.metrics.aggregate`).
    min_tasks: refuse fewer instances than this (an interval over a handful of instances means little); 1 disables.
    smoothing: trailing window (steps) of the curves the speedups are computed on (default ``num_steps // 10``, at
      least 1; 1 disables); final and mean losses are those of the raw curves.
  """
  ev = _as_evaluator(evaluator_or_family, num_tasks, num_steps)
  if not thetas:
    raise ValueError("thetas must name at least one theta, e.g. {'learned': theta}.")
  if statistic not in STATISTICS:
    raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}.")
  if ev.num_tasks < min_tasks:
    raise ValueError(f"a speedup interval needs at least {min_tasks} held-out instances, got {ev.num_tasks}; build "
                     f"the FamilyEvaluator with num_tasks >= {min_tasks} (or lower min_tasks).")
  smoothing = max(1, ev.num_steps // 10) if smoothing is None else smoothing
  if not isinstance(smoothing, (int, np.integer)) or not 1 <= smoothing <= ev.num_steps:
    raise ValueError(f"smoothing must be an int in [1, num_steps={ev.num_steps}], got {smoothing!r}.")
  tuned = ev.tune_adam(key)
  adam_theta = dict(ev.adam.init(None), log_lr=jnp.log(jnp.float32(tuned["best_lr"])))
  adam_curves = ev.instance_curves(ev.adam, adam_theta, key)  # the program tune_adam's curve came from
  adam_smooth = smooth_curves(adam_curves, smoothing)
  results = {}
  for name, theta in thetas.items():
    curves = ev.instance_curves(learned_opt, theta, key)
    smooth = smooth_curves(curves, smoothing)
    speedups, reached, needed = instance_speedups(smooth, adam_smooth)
    agg = aggregate(speedups, statistic=statistic, num_resamples=num_resamples, confidence=confidence, seed=seed)
    results[str(name)] = LearnedResult(str(name), curves, speedups, reached, needed, agg,
                                       mean_curve_speedup(smooth, adam_smooth))
  scores = {lr: float(s) for lr, s in zip(ev.adam_lrs, tuned["select_scores"])}
  return HeldOutComparison(family=getattr(ev.family, "name", type(ev.family).__name__), split=ev.split,
                           select_split=ev.select_split, num_tasks=ev.num_tasks, num_steps=ev.num_steps,
                           adam_lr=float(tuned["best_lr"]), adam_select_scores=scores, adam_curves=adam_curves,
                           learned=results, statistic=statistic, confidence=confidence, smoothing=int(smoothing))
