"""The main job's closing report: learned optimizers against tuned Adam on fresh instances of a family.

`compare_with_tuned_adam(evaluator, learned_opt, thetas, key)` trains ``evaluator.num_tasks`` fresh instances of the
evaluator's family for T = ``evaluator.num_steps`` steps with Adam at the learning rate `FamilyEvaluator.tune_adam`
selects (on ``inner_valid``) and with each learned optimizer, all on the same instances and batches, and scores the
updated params after every step on ``evaluator.split`` (normally ``test``). Tuned Adam also runs on to
``REFERENCE_FACTOR`` x T steps on the same instances: the reference of the speedups, as in the suites.

The scores are the suites' (`metafam.evaluation.scores`, the one engine), with the instances as the seeds: each
optimizer is a `SuiteEvaluation` of one task (the family) in one pool (tuned Adam and every theta given). Per
instance and on the instance-mean curve:

* the **speedup** is VeLO's, as everywhere in metafam: the steps tuned Adam needs to reach the optimizer's loss at
  T, over T; 2 means Adam needs twice the budget to get where the optimizer got. Above ``REFERENCE_FACTOR`` it is
  not resolved and counts as that cap (``at_cap`` says on how many instances); an instance that ends non-finite
  scores 0. Across instances: the **median** (``statistic="iqm"`` also accepted) with a seeded 95% percentile
  bootstrap interval over instances (`metafam.evaluation.metrics.stratified_aggregate` with one stratum);
* the **time ratio** to the pool's fastest (AlgoPerf's; 1 = no optimizer of the table got there sooner) and its
  profile score, the suites' headline;
* the loss ratio to tuned Adam and the loss gains.

Every step scores one fresh batch of the split, so a single instance's curve is noisy (on the 8x8 image-MLP family
the step-to-step standard deviation, about 0.05, exceeds what tuned Adam gains between steps 100 and 200). The
curves are therefore scored smoothed (`smooth_curves`): the loss at step t is the mean of the last ``smoothing``
per-step losses (default ``T // 10``), which averages ``smoothing`` test batches and lags every curve alike. The
final and mean losses of the table are those of the raw curves.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metafam.evaluation.family_eval import FamilyEvaluator
from metafam.evaluation.metrics import STATISTICS, Aggregate
from metafam.evaluation.scores import (REFERENCE, REFERENCE_FACTOR, SuiteEvaluation, score_task,
                                       suite_evaluation)


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


def _adam_label(lr: float) -> str:
  return f"Adam (tuned lr={lr:.2g})"


def _finite_mean(x: np.ndarray) -> float:
  return float(np.mean(x)) if np.all(np.isfinite(x)) else float("nan")


def _num(x: Any) -> Optional[float]:
  return float(x) if x is not None and np.isfinite(x) else None


def _interval(a: Aggregate) -> Dict[str, Any]:
  return {"statistic": a.statistic, "value": _num(a.value), "low": _num(a.low), "high": _num(a.high),
          "confidence": a.confidence}


@dataclasses.dataclass(frozen=True)
class HeldOutComparison:
  """Result of `compare_with_tuned_adam`.

  Attributes:
    family: the family's name.
    split: the scored split (normally "test"); Adam's lr was selected on ``select_split``.
    select_split: the split tune_adam selected the lr on.
    num_tasks, num_steps: held-out instances and inner steps (T).
    adam_lr: the selected Adam learning rate.
    adam_select_scores: ``{lr: mean select_split loss over the last 10% of steps}`` of the sweep (inf, null in JSON,
      for a diverged lr: see `metafam.evaluation.tuning`).
    adam_curves: ``f64[num_steps, num_tasks]`` Adam's raw per-instance curves at ``adam_lr``.
    curves: ``{name: f64[num_steps, num_tasks]}`` each learned theta's raw per-instance curves, in the order given.
    scores: ``{name: SuiteEvaluation}`` of every theta and, last under `adam_label`, of tuned Adam: one task (the
      family), the instances as seeds, the smoothed curves as scored.
    statistic, confidence: how per-instance speedups are summarized (``scores[name].aggregates`` holds them all).
    smoothing: the trailing window (steps) of the scored curves.
  """
  family: str
  split: str
  select_split: str
  num_tasks: int
  num_steps: int
  adam_lr: float
  adam_select_scores: Dict[float, float]
  adam_curves: np.ndarray
  curves: Dict[str, np.ndarray]
  scores: Dict[str, SuiteEvaluation]
  statistic: str
  confidence: float
  smoothing: int

  @property
  def adam_label(self) -> str:
    return _adam_label(self.adam_lr)

  @property
  def learned(self) -> Dict[str, SuiteEvaluation]:
    """The learned thetas' scores, in the order given (``scores`` without tuned Adam's)."""
    return {k: v for k, v in self.scores.items() if k != self.adam_label}

  def raw_curves(self, name: str) -> np.ndarray:
    """``f64[num_steps, num_tasks]`` raw per-instance curves of a theta or of tuned Adam (`adam_label`)."""
    return self.adam_curves if name == self.adam_label else self.curves[name]

  def final_loss(self, name: str) -> float:
    """Mean over instances of the raw loss after the last step (NaN if any instance is non-finite)."""
    return _finite_mean(self.raw_curves(name)[-1])

  def mean_loss(self, name: str) -> float:
    """Mean over steps and instances of the raw curves (NaN if anything is non-finite)."""
    return _finite_mean(self.raw_curves(name))

  def speedup(self, name: str) -> Aggregate:
    """The ``statistic`` over instances of the per-instance speedups over tuned Adam, with its interval."""
    return self.scores[name].aggregates[self.statistic]

  def at_cap(self, name: str) -> int:
    """Instances whose speedup is at the cap (``REFERENCE_FACTOR``: tuned Adam never got there in its run)."""
    return int(np.sum(np.asarray(self.scores[name].scores[0].seed_speedups) >= REFERENCE_FACTOR))

  @property
  def adam_final_loss(self) -> float:
    return self.final_loss(self.adam_label)

  def mean_curves(self) -> Dict[str, np.ndarray]:
    """``{label: f64[num_steps]}`` instance-mean raw curves, learned optimizers first, then Adam (for plots)."""
    return {name: self.raw_curves(name).mean(axis=1) for name in self.scores}

  def to_json(self) -> Dict[str, Any]:
    """A JSON-able summary (no per-step curves; per-instance scores and final losses included)."""
    def entry(name):
      e = self.scores[name]
      s = e.scores[0]
      return {"final_loss": _num(self.final_loss(name)), "mean_loss": _num(self.mean_loss(name)),
              "final_loss_per_instance": [_num(x) for x in self.raw_curves(name)[-1]],
              "speedup": _interval(self.speedup(name)),
              "speedup_per_instance": [_num(x) for x in s.seed_speedups],
              "speedup_of_mean_curve": _num(s.speedup), "at_cap": self.at_cap(name),
              "time_ratio_per_instance": [_num(x) for x in s.seed_time_ratios],
              "time_ratio_of_mean_curve": _num(s.time_ratio),
              "profile_score": _interval(e.aggregates["profile_score"]),
              "loss_ratio": _num(s.loss_ratio), "loss_gain": _interval(e.aggregates["loss_gain_iqm"])}
    return {"family": self.family, "split": self.split, "select_split": self.select_split, "tasks": self.num_tasks,
            "inner_steps": self.num_steps, "reference_steps": REFERENCE_FACTOR * self.num_steps,
            "adam": {"lr": self.adam_lr, **entry(self.adam_label),
                     "select_scores": {f"{lr:g}": _num(s) for lr, s in self.adam_select_scores.items()}},
            "learned": {name: entry(name) for name in self.learned},
            "smoothing": self.smoothing,
            "speedup_definition": (f"{self.statistic} over instances of (steps tuned Adam, run to "
                                   f"{REFERENCE_FACTOR}T, needs to reach the optimizer's best loss by T) / T, at most "
                                   f"{REFERENCE_FACTOR} (at_cap: instances there), 0 where the optimizer diverged; "
                                   f"curves smoothed by a trailing mean over {self.smoothing} steps; "
                                   f"{self.confidence:.0%} bootstrap interval over instances "
                                   "(metafam.evaluation.scores)"),
            "time_ratio_definition": ("T over the fewest steps any optimizer of this comparison needs to reach the "
                                      "optimizer's best loss by T (1: the fastest); profile_score: the mean over "
                                      "instances of (4 - min(ratio, 4)) / 3")}

  def format_table(self) -> str:
    """An aligned text table: final and mean loss, the speedup over tuned Adam with its interval and the profile
    score, per optimizer."""
    pct = f"{self.confidence:.0%}"
    head = (f"held-out comparison: {self.num_tasks} fresh instances of {self.family}, {self.num_steps} inner steps, "
            f"normalized {self.split} loss; Adam's lr tuned on {self.select_split}")
    rows = [("optimizer", "final loss", "mean loss", f"speedup vs tuned Adam [{pct} CI]", f"at {REFERENCE_FACTOR}x",
             f"profile score [{pct} CI]")]
    for name, e in self.scores.items():
      a, p = self.speedup(name), e.aggregates["profile_score"]
      rows.append((name, f"{self.final_loss(name):.4f}", f"{self.mean_loss(name):.4f}",
                   f"{a.value:.2f} [{a.low:.2f}, {a.high:.2f}]", f"{self.at_cap(name)}/{self.num_tasks}",
                   f"{p.value:.2f} [{p.low:.2f}, {p.high:.2f}]"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = [head] + ["  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in
                                enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.append(f"speedup: {self.statistic} over instances of the steps tuned Adam (run to {REFERENCE_FACTOR}T) "
                 f"needs to reach the optimizer's loss at T, over T (at most {REFERENCE_FACTOR}); profile score: "
                 f"1 where no optimizer above got there sooner, 0 at 4x slower; curves averaged over the last "
                 f"{self.smoothing} steps (metafam.evaluation.scores, as in `metafam benchmark`)")
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
  """Compares ``learned_opt`` at each of ``thetas`` with tuned Adam on the same held-out instances (module docstring).

  Args:
    evaluator_or_family: a `FamilyEvaluator` (its family, instances, steps, split and Adam lr grid are used) or a
      `TaskFamily` (then a ``FamilyEvaluator(family, num_tasks or 16, num_steps or 200)`` on the test split).
    learned_opt: the learned optimizer; ``thetas``: ``{label: theta}``, e.g. ``{"learned (init)": theta0,
      "learned (final)": theta}``.
    key: selects the instances and batches (the same for every optimizer).
    statistic: "median" (default) or "iqm" of the per-instance speedups; ``confidence``, ``num_resamples`` and
      ``seed`` set the bootstrap intervals.
    min_tasks: refuse fewer instances than this (an interval over a handful of instances means little); 1 disables.
    smoothing: trailing window (steps) of the scored curves (default ``num_steps // 10``, at least 1; 1 disables).
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
  reference = ev.instance_curves(ev.adam, adam_theta, key, num_steps=REFERENCE_FACTOR * ev.num_steps)
  raw = {str(name): ev.instance_curves(learned_opt, theta, key) for name, theta in thetas.items()}
  return score_comparison(getattr(ev.family, "name", type(ev.family).__name__), adam_curves, reference, raw,
                          adam_lr=float(tuned["best_lr"]),
                          adam_select_scores={lr: float(s) for lr, s in zip(ev.adam_lrs, tuned["select_scores"])},
                          split=ev.split, select_split=ev.select_split, statistic=statistic, confidence=confidence,
                          num_resamples=num_resamples, seed=seed, smoothing=smoothing)


def score_comparison(family: str, adam_curves: np.ndarray, reference: np.ndarray, curves: Mapping[str, np.ndarray],
                     *, adam_lr: float, adam_select_scores: Optional[Mapping[float, float]] = None,
                     split: str = "test", select_split: str = "inner_valid", statistic: str = "median",
                     confidence: float = 0.95, num_resamples: int = 2000, seed: int = 0,
                     smoothing: int = 1) -> HeldOutComparison:
  """The `HeldOutComparison` of raw per-instance curves ``f64[T, N]`` (loss after steps 1..T): tuned Adam's
  ``adam_curves``, its ``reference`` run ``f64[REFERENCE_FACTOR * T, N]`` on the same instances, and ``curves``
  (``{name: f64[T, N]}``), scored by `metafam.evaluation.scores.score_task` after `smooth_curves` over
  ``smoothing`` steps (the module docstring); `compare_with_tuned_adam` without the training."""
  adam_curves, reference = np.asarray(adam_curves, np.float64), np.asarray(reference, np.float64)
  num_steps, num_tasks = adam_curves.shape if adam_curves.ndim == 2 else (0, 0)
  raw = {str(k): np.asarray(v, np.float64) for k, v in curves.items()}
  bad = [k for k, v in raw.items() if v.shape != adam_curves.shape]
  if num_steps < 1 or bad or reference.shape != (REFERENCE_FACTOR * num_steps, num_tasks):
    raise ValueError(f"curves must be [num_steps, num_tasks] like Adam's {adam_curves.shape} (not: {bad}) and the "
                     f"reference [{REFERENCE_FACTOR} * num_steps, num_tasks], got {reference.shape}.")
  adam_label = _adam_label(adam_lr)
  scored = {name: smooth_curves(c, smoothing).T for name, c in {**raw, adam_label: adam_curves}.items()}
  steps = np.arange(1, num_steps + 1)
  entry = {"horizon": num_steps, "eval_steps": steps,
           "baselines": {REFERENCE: {"test_curves": scored[adam_label]}},
           "reference": {"eval_steps": np.arange(1, REFERENCE_FACTOR * num_steps + 1),
                         "test_curves": smooth_curves(reference, smoothing).T}}
  scores = {}
  for name, c in scored.items():
    score = score_task(family, entry, c, exclude=(REFERENCE,) if name == adam_label else (), pool=scored)
    scores[name] = suite_evaluation(name, [score], {family: (steps, c)}, suite="family",
                                    num_resamples=num_resamples, confidence=confidence, seed=seed)
  return HeldOutComparison(family=family, split=split, select_split=select_split, num_tasks=num_tasks,
                           num_steps=num_steps, adam_lr=float(adam_lr),
                           adam_select_scores=dict(adam_select_scores or {}), adam_curves=adam_curves, curves=raw,
                           scores=scores, statistic=statistic, confidence=confidence, smoothing=int(smoothing))
