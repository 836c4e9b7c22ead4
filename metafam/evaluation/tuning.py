"""The one learning-rate grid and selection rule of every tuned baseline.

Both tuned-Adam baselines use this module: `metafam.evaluation.family_eval.FamilyEvaluator.tune_adam` (the held-out
comparison `metafam meta-train` prints) and `metafam.benchmark.sweep.tune_learning_rate` (`metafam benchmark`).

Grid: `default_learning_rates` (7 log-spaced rates from 1e-4 to 1e-1); `check_learning_rates` validates any other.

Selection (`select_best`): a rate's score is the mean, over seeds (or instances) and over the eval points in the last
``tail_fraction`` of ``select_at`` steps (always including ``select_at``), of its selection-split loss. A rate is
*diverged*, and never selected, if any seed's training or selection-split loss is non-finite anywhere in the run (an
early blow-up disqualifies a rate even when its tail recovered), or its score is non-finite. The lowest score wins;
exact ties go to the smaller rate. If every rate diverged, nothing is selected (``best_index == -1``).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def default_learning_rates(low: float = 1e-4, high: float = 1e-1, num: int = 7) -> np.ndarray:
  """``f64[num]`` log-spaced rates from ``low`` to ``high`` (default 1e-4, 3.2e-4, ..., 1e-1)."""
  if not 0 < low < high or num < 2:
    raise ValueError(f"need 0 < low < high and num >= 2, got low={low!r}, high={high!r}, num={num!r}.")
  return np.logspace(np.log10(low), np.log10(high), int(num))


def check_learning_rates(learning_rates: Sequence[float]) -> np.ndarray:
  """``f64[L]`` sorted ascending; raises ValueError unless they are distinct finite positive numbers."""
  lrs = np.sort(np.asarray(learning_rates, np.float64).ravel())
  if lrs.size == 0 or not np.all(np.isfinite(lrs)) or np.any(lrs <= 0) or np.unique(lrs).size != lrs.size:
    raise ValueError(f"learning_rates must be distinct finite positive numbers, got {np.asarray(learning_rates)!r}.")
  return lrs


def select_best(eval_steps: np.ndarray, selection_losses: np.ndarray, train_losses: Optional[np.ndarray] = None,
                select_at: Optional[int] = None, tail_fraction: float = 0.1) -> tuple:
  """Scores rates and picks the best one; see the module docstring for the rule.

  Args:
    eval_steps: ``[E]`` ascending evaluation steps.
    selection_losses: ``[L, S, E]`` selection-split losses per rate and seed.
    train_losses: optional ``[L, S, T]`` training losses (non-finite values mark a rate diverged).
    select_at: the step whose tail is scored (default the last eval step; must be an eval step).
    tail_fraction: the scored window is ``[(1 - tail_fraction) * select_at, select_at]``.

  Returns:
    ``(scores f64[L], diverged bool[L], best_index int)``: ``scores`` is inf for diverged rates and ``best_index``
    is -1 when every rate diverged.
  """
  eval_steps = np.asarray(eval_steps)
  losses = np.asarray(selection_losses, np.float64)
  if losses.ndim != 3 or losses.shape[-1] != eval_steps.shape[0]:
    raise ValueError(f"selection_losses must be [L, S, E] with E = {eval_steps.shape[0]}, got {losses.shape}.")
  if not 0 <= tail_fraction < 1:
    raise ValueError(f"tail_fraction must lie in [0, 1), got {tail_fraction!r}.")
  select_at = int(eval_steps[-1] if select_at is None else select_at)
  if select_at not in eval_steps:
    raise ValueError(f"select_at={select_at} is not an eval step ({eval_steps.tolist()}).")
  window = (eval_steps >= (1.0 - tail_fraction) * select_at) & (eval_steps <= select_at)
  diverged = ~np.all(np.isfinite(losses), axis=(1, 2))
  if train_losses is not None:
    diverged |= ~np.all(np.isfinite(np.asarray(train_losses, np.float64)), axis=(1, 2))
  with np.errstate(invalid="ignore", over="ignore"):
    scores = losses[:, :, window].mean(axis=(1, 2))
  diverged |= ~np.isfinite(scores)
  scores = np.where(diverged, np.inf, scores)
  best = int(np.argmin(scores)) if not np.all(diverged) else -1  # argmin returns the first (smallest-rate) minimum
  return scores, diverged, best


def last_steps_fraction(num_steps: int, count: int) -> float:
  """The ``tail_fraction`` whose window over eval points ``1..num_steps`` holds exactly the last ``count`` steps."""
  if not 1 <= count <= num_steps:
    raise ValueError(f"need 1 <= count <= num_steps, got count={count!r}, num_steps={num_steps!r}.")
  return (count - 0.5) / num_steps  # window starts at num_steps - count + 0.5: steps num_steps - count + 1 onwards
