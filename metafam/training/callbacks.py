"""Trainer callbacks: hooks on steps, evaluations and the end of training, and `EarlyStopping`.

Steps between evaluations run as one jitted scan, so `Callback.on_step` is replayed on the host for each step of a
chunk once the chunk has finished. A callback stops training by setting ``trainer.stop_training = True``; the
trainer checks it after every evaluation, so training always ends at an evaluation point.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import numpy as np

from metafam._checks import check_positive_int
from metafam.datasets.base import SPLITS


class Callback:
  """Base class; override any hook. ``trainer`` is the running `metafam.training.Trainer`.

  Losses are Python floats for a single model and ``f32[M]`` numpy arrays for an ensemble of M members.
  """

  def on_train_begin(self, trainer: Any) -> None:
    """Called once before the first evaluation (step 0); reset per-run state here."""

  def on_step(self, trainer: Any, step: int, loss: Any) -> None:
    """Step ``step`` (0-based) had training loss ``loss`` (measured before its update)."""

  def on_eval(self, trainer: Any, step: int, losses: Dict[str, Any]) -> None:
    """After ``step`` updates the evaluated splits have mean losses ``losses`` (``{split: loss}``)."""

  def on_train_end(self, trainer: Any, result: Any) -> None:
    """Called once with the final `TrainResult`."""


def monitored_value(losses: Dict[str, Any], split: str) -> float:
  """The scalar a monitor compares: the loss of ``split``, averaged over ensemble members."""
  return float(np.mean(losses[split]))


class EarlyStopping(Callback):
  """Stops training when the ``monitor`` split's loss has not improved for ``patience`` evaluations.

  An evaluation improves when its loss is below ``best - min_delta`` (NaN never improves); the step-0 evaluation
  sets the first best. For ensembles the monitored loss is the mean over members.

  Attributes (after training): ``best`` (best monitored loss), ``best_step``, ``wait`` (evaluations since the last
  improvement) and ``stopped_step`` (the step at which it stopped training, or None).
  """

  def __init__(self, monitor: str = "inner_valid", patience: int = 5, min_delta: float = 0.0):
    if monitor not in SPLITS:
      raise ValueError(f"monitor must be one of {SPLITS}, got {monitor!r}.")
    check_positive_int("patience (evaluations without improvement)", patience)
    if not isinstance(min_delta, (int, float, np.floating)) or not min_delta >= 0:
      raise ValueError(f"min_delta must be a non-negative number, got {min_delta!r}.")
    self.monitor, self.patience, self.min_delta = monitor, int(patience), float(min_delta)
    self.on_train_begin(None)

  def on_train_begin(self, trainer: Any) -> None:
    self.best, self.best_step, self.wait = math.inf, None, 0
    self.stopped_step: Optional[int] = None

  def on_eval(self, trainer: Any, step: int, losses: Dict[str, Any]) -> None:
    value = monitored_value(losses, self.monitor)
    if value < self.best - self.min_delta:
      self.best, self.best_step, self.wait = value, step, 0
      return
    self.wait += 1
    if self.wait >= self.patience:
      self.stopped_step = step
      trainer.stop_training = True

  def __repr__(self) -> str:
    return f"EarlyStopping(monitor={self.monitor!r}, patience={self.patience}, min_delta={self.min_delta:g})"
