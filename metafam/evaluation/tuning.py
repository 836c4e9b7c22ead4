"""The one way to tune a baseline's learning rate: the grid, the procedure (`tune`) and the selection rule.

Every tuned baseline goes through `tune`: `metafam.evaluation.family_eval.FamilyEvaluator.tune_adam` (the held-out
comparison `metafam meta-train` prints) and `metafam.benchmark.baselines.tune_baseline` (the baselines of every
suite, shipped or custom, and every tuned candidate). They differ only in the engine that trains the lanes, which
`tune` takes as a function.

Procedure (`tune`): every (schedule, rate) pair of the grid trains S seeds (or instances); each schedule's rate is
chosen by `select_best` on the selection split (``inner_valid``); while some schedule's choice is an end of the grid,
two more rates (at the grid's constant ratio) are added beyond that end, at most ``max_extensions`` times; the
schedule with the lower score is kept, ties going to the one listed first.

Grid: `default_learning_rates` (7 log-spaced rates from 1e-4 to 1e-1); `check_learning_rates` validates any other.

Selection (`select_best`): a rate's score is the mean, over seeds (or instances) and over the eval points in the last
``tail_fraction`` of ``select_at`` steps (always including ``select_at``), of its selection-split loss. A rate is
*diverged*, and never selected, if any seed's training or selection-split loss is non-finite anywhere in the run (an
early blow-up disqualifies a rate even when its tail recovered), or its score is non-finite. The lowest score wins;
exact ties go to the smaller rate. If every rate diverged, nothing is selected (``best_index == -1``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from metafam._checks import check_number


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


class Lanes(NamedTuple):
  """The losses of one schedule's lanes, rates first: ``eval_losses {split: [L, S, E]}`` at the eval steps and,
  optionally, ``train_losses [L, S, T]`` (a non-finite training loss marks a rate diverged too)."""
  eval_losses: Mapping[str, np.ndarray]
  train_losses: Optional[np.ndarray] = None

  def take(self, index) -> "Lanes":
    """The lanes of the rates ``index`` (an int or an index array, along the rate axis)."""
    train = None if self.train_losses is None else self.train_losses[index]
    return Lanes({k: v[index] for k, v in self.eval_losses.items()}, train)

  def concatenate(self, other: "Lanes") -> "Lanes":
    """These rates, then ``other``'s."""
    train = None if self.train_losses is None else np.concatenate([self.train_losses, other.train_losses])
    return Lanes({k: np.concatenate([v, other.eval_losses[k]]) for k, v in self.eval_losses.items()}, train)


Trainer = Callable[[np.ndarray, Tuple[str, ...]], Mapping[str, Lanes]]


class GridChoice:
  """What a result holding a rate grid ``learning_rates`` and the chosen ``best_index`` (-1: every rate diverged)
  says about the choice; shared by `Tuned` and its users."""
  learning_rates: np.ndarray
  best_index: int

  @property
  def learning_rate(self) -> float:
    """The chosen rate (NaN if every rate diverged)."""
    return float(self.learning_rates[self.best_index]) if self.best_index >= 0 else float("nan")

  @property
  def at_edge(self) -> bool:
    """The chosen rate is an end of the grid (widen the grid to be sure of the optimum)."""
    return self.best_index in (0, len(self.learning_rates) - 1)


@dataclasses.dataclass(frozen=True)
class Tuned(GridChoice):
  """The result of `tune`.

  Attributes:
    learning_rates: ``f64[L]`` the final grid (the given one plus any extensions), ascending.
    schedules: the schedules tried, in order of preference.
    schedule: the kept one.
    best_index: the kept schedule's chosen rate (-1 if every rate of every schedule diverged).
    scores, diverged, best: per schedule, `select_best`'s ``f64[L]`` scores (inf: diverged), ``bool[L]`` and index.
    lanes: per schedule, the `Lanes` of the final grid (to read the chosen setting's curves from).
  """
  learning_rates: np.ndarray
  schedules: Tuple[str, ...]
  schedule: str
  best_index: int
  scores: Dict[str, np.ndarray]
  diverged: Dict[str, np.ndarray]
  best: Dict[str, int]
  lanes: Dict[str, Lanes]


def tune(train: Trainer, learning_rates: Sequence[float], eval_steps: np.ndarray, *,
         schedules: Sequence[str] = ("constant",), select_at: Optional[int] = None, tail_fraction: float = 0.1,
         selection_split: str = "inner_valid", max_extensions: int = 0) -> Tuned:
  """Tunes a learning rate by the procedure of the module docstring.

  Args:
    train: ``train(rates f64[L], schedules) -> {schedule: Lanes}``, the engine: trains every rate of ``rates``
      under every schedule on the same seeds (seed s of every lane from the same key) and returns their losses at
      ``eval_steps``. It is called once for the grid and once per extension, with only the new rates.
    learning_rates: the grid (`check_learning_rates`: distinct, finite, positive; sorted here).
    eval_steps: ``[E]`` the steps of the lanes' eval losses.
    schedules: labels that ``train`` understands, in order of preference (ties go to the first).
    select_at, tail_fraction: the scored window (`select_best`).
    selection_split: the split of ``eval_losses`` that scores rates (never ``test``, which is for reporting).
    max_extensions: how many times the grid may grow past an end at which a schedule's best rate lies (0: never);
      the grid must then have two or more rates at a constant ratio.
  """
  lrs = check_learning_rates(learning_rates)
  check_number("max_extensions", max_extensions, low=0, integer=True)
  schedules = tuple(dict.fromkeys(schedules))
  if not schedules:
    raise ValueError("schedules must name at least one schedule.")
  if max_extensions and lrs.size < 2:
    raise ValueError("learning_rates needs at least two rates.")
  ratio = lrs[1] / lrs[0] if lrs.size > 1 else None
  runs = dict(train(lrs, schedules))

  def choose():
    return {s: select_best(eval_steps, runs[s].eval_losses[selection_split], runs[s].train_losses, select_at,
                           tail_fraction) for s in schedules}

  for extension in range(max_extensions + 1):
    chosen = choose()
    edges = {b for _, _, b in chosen.values() if b in (0, len(lrs) - 1)}
    if not edges or extension == max_extensions:
      break
    parts = []
    if 0 in edges:
      parts.append(lrs[0] / ratio ** np.arange(2, 0, -1))
    if len(lrs) - 1 in edges:
      parts.append(lrs[-1] * ratio ** np.arange(1, 3))
    new = np.concatenate(parts)
    more = train(new, schedules)
    order = np.argsort(np.concatenate([lrs, new]), kind="stable")
    lrs = np.concatenate([lrs, new])[order]
    runs = {s: runs[s].concatenate(more[s]).take(order) for s in schedules}
  score_of = {s: float(c[0][c[2]]) if c[2] >= 0 else float("inf") for s, c in chosen.items()}
  kept = min(schedules, key=lambda s: (score_of[s], schedules.index(s)))
  return Tuned(learning_rates=lrs, schedules=schedules, schedule=kept, best_index=chosen[kept][2],
               scores={s: c[0] for s, c in chosen.items()}, diverged={s: c[1] for s, c in chosen.items()},
               best={s: c[2] for s, c in chosen.items()}, lanes=runs)
