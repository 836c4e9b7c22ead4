"""What the meta-training loop says about non-finite values: masked inner steps and skipped meta-updates.

`NonFiniteLog` reads each meta-step's record (the metrics `metafam.outer_trainers.meta_trainer.MetaTrainer.step_fn`
computes and the loop fetches anyway: ``nonfinite_fraction``, ``nonfinite_fraction/LABEL``, the causes'
counts, ``update_skipped``, ``nonfinite_grad_entries``) and reports as the trainer's ``on_nonfinite`` says
(`metafam.nonfinite`): with "warn", one warning at the first meta-step whose estimates masked inner steps, one at the
first skipped meta-update, and a summary when the loop ends if more meta-steps had them; with "raise", a
`metafam.nonfinite.NonFiniteError` at the first.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

from metafam.nonfinite import report


class NonFiniteLog:
  """The non-finite bookkeeping of one `metafam.runs.loop.train` call (see the module docstring)."""

  def __init__(self, trainer: Any):
    self.trainer = trainer
    self.on_nonfinite = getattr(trainer, "on_nonfinite", "warn")
    estimators = list(getattr(trainer, "estimators", []))
    self.labels = getattr(trainer, "estimator_labels", [getattr(e, "name", "estimator") for e in estimators])
    self.estimators = estimators
    self.masked: List[Tuple[int, float]] = []  # (meta-step, nonfinite_fraction) of each meta-step that had some
    self.skipped: List[int] = []

  def observe(self, record: Dict[str, Any]) -> None:
    """Counts meta-step ``record``'s masked steps and skipped update; reports the first of each."""
    if self.on_nonfinite == "ignore":
      return
    step, fraction = record["step"], float(record.get("nonfinite_fraction", 0.0) or 0.0)
    if fraction > 0:
      self.masked.append((step, fraction))
      if len(self.masked) == 1:
        report(self.masked_message(record), self.on_nonfinite, stacklevel=4)
    if record.get("update_skipped"):
      self.skipped.append(step)
      if len(self.skipped) == 1:
        report(self.skipped_message(record), self.on_nonfinite, stacklevel=4)

  def masked_message(self, record: Dict[str, Any]) -> str:
    step = record["step"]
    if len(self.estimators) == 1 and hasattr(self.estimators[0], "nonfinite_message"):
      text = self.estimators[0].nonfinite_message(record, float(record.get("meta_loss", math.nan)),
                                                  prefix=f"meta-step {step}: ", where="nonfinite_fraction")
    else:
      shares = ", ".join(f"{label} {100 * float(record.get(f'nonfinite_fraction/{label}', 0.0)):.1f}%"
                         for label in self.labels)
      text = f"meta-step {step}: the estimates masked inner steps that went non-finite ({shares} of their steps)."
    return (f"{text} It is the first meta-step of this session with masked steps; every meta-step's record "
            "(metrics.jsonl) holds its nonfinite_fraction.")

  def skipped_message(self, record: Dict[str, Any]) -> str:
    entries = int(record.get("nonfinite_grad_entries", 0) or 0)
    why = (f"the averaged meta-gradient had {entries} non-finite entries" if entries else
           "an estimate had no finite step or pair (its meta-loss is NaN)")
    return (f"meta-step {record['step']}: the meta-update was skipped because {why}; theta and the meta-optimizer "
            "state are unchanged (update_skipped=1 in metrics.jsonl), and max_skipped_steps such meta-steps in a "
            "row stop the run.")

  def summary(self, num_steps: int) -> None:
    """At the end of the loop: one warning if more than one meta-step had masked steps or skipped its update."""
    if self.on_nonfinite != "warn" or (len(self.masked) < 2 and len(self.skipped) < 2):
      return
    done = max([s for s, _ in self.masked] + self.skipped)
    parts = []
    if self.masked:
      worst_step, worst = max(self.masked, key=lambda m: m[1])
      mean = sum(f for _, f in self.masked) / len(self.masked)
      parts.append(f"{len(self.masked)} meta-steps had masked (non-finite) inner steps (a mean {100 * mean:.1f}% of "
                   f"their estimates' steps, the most {100 * worst:.1f}% at meta-step {worst_step})")
    if self.skipped:
      parts.append(f"{len(self.skipped)} meta-updates were skipped (meta-steps {', '.join(map(str, self.skipped[:8]))}"
                   + (" ..." if len(self.skipped) > 8 else "") + ")")
    report(f"meta-training to meta-step {max(done, num_steps)}: " + "; ".join(parts)
           + " (metrics.jsonl: nonfinite_fraction, update_skipped).", "warn", stacklevel=4)

