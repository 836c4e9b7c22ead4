"""The report `metafam meta-train` writes after meta-training: ``summary.json`` and (with matplotlib) two PNG plots.

`write_meta_train_report(output_dir, history, comparison, config, meta_steps=..., train_seconds=...)` writes

* ``summary.json`` (`meta_train_summary`): the run's config, meta-steps, training seconds, the held-out comparison
  (`HeldOutComparison.to_json`) and the first and last 10 meta-losses (null where not finite), as indented, key-sorted
  JSON, atomically;
* ``meta_loss.png``: the raw meta-loss per meta-step, its bias-corrected EMA, and the held-out test loss where the
  history logged one (``eval_final_loss``);
* ``inner_curves.png``: the instance-mean held-out curves of each learned theta and of tuned Adam (log scale);
* ``meta_validation.png``, when the history holds meta-validation checks (``eval_every``,
  `metafam.runs.validation.MetaValidation`): the loss at the horizon of the same held-out instances at
  every check, per family and averaged, with a band of one standard deviation over instances (`plot_meta_validation`).

Every file goes through `metafam.io.atomic_write`. Without matplotlib only ``summary.json`` is written.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Mapping, Sequence

import numpy as np

from metafam.io import save_figure, write_json

SUMMARY_NAME = "summary.json"
PLOT_NAMES = ("meta_loss.png", "inner_curves.png")
VALIDATION_PLOT_NAME = "meta_validation.png"


def _json_number(value: Any) -> Any:
  """A float for JSON: None where it is missing or not finite (JSON has no NaN)."""
  return float(value) if value is not None and math.isfinite(value) else None


def meta_train_totals(history: Sequence[Mapping[str, Any]], meta_steps: int,
                      inner_steps_per_meta_step: int) -> Dict[str, Any]:
  """``meta_step_seconds_total`` (the meta-steps' own times summed over every session of a resumed run; evaluations
  and checkpoints not included) and ``inner_steps_total`` (every lane's inner steps, antithetic lanes included)."""
  return {"meta_step_seconds_total": float(sum(h.get("seconds", 0.0) for h in history)),
          "inner_steps_total": int(meta_steps) * int(inner_steps_per_meta_step)}


def meta_train_summary(history: Sequence[Mapping[str, Any]], comparison: Any, config: Mapping[str, Any],
                       meta_steps: int, train_seconds: float, inner_steps_per_meta_step: int = 0) -> Dict[str, Any]:
  """The JSON-able dict of ``summary.json`` (see the module docstring), with `meta_train_totals`."""
  meta_losses = [h.get("meta_loss") for h in history]
  return {"config": dict(config), "meta_steps": int(meta_steps), "train_seconds_this_session": train_seconds,
          **meta_train_totals(history, meta_steps, inner_steps_per_meta_step),
          "eval": comparison.to_json(),
          "meta_loss_first_10": [_json_number(v) for v in meta_losses[:10]],
          "meta_loss_last_10": [_json_number(v) for v in meta_losses[-10:]]}


def ema(values: Sequence[float], decay: float) -> List[float]:
  """Bias-corrected exponential moving average that skips NaN (skipped meta-steps)."""
  out, avg, weight = [], 0.0, 0.0
  for v in values:
    if math.isfinite(v):
      avg, weight = decay * avg + (1 - decay) * v, decay * weight + (1 - decay)
    out.append(avg / weight if weight else float("nan"))
  return out


def plot_meta_train(output_dir: str, history: Sequence[Mapping[str, Any]],
                    curves: Mapping[str, np.ndarray]) -> List[str]:
  """Writes ``meta_loss.png`` and ``inner_curves.png`` (``curves``: ``{label: instance-mean curve}``) and returns
  their names; ``[]`` without matplotlib."""
  try:
    from matplotlib.figure import Figure  # the object-oriented API: no pyplot state, no backend switch
  except ImportError:
    return []
  steps = [h["step"] for h in history]
  raw = [float(h.get("meta_loss", float("nan"))) for h in history]
  fig = Figure(figsize=(6.5, 4))
  ax = fig.subplots()
  ax.plot(steps, raw, lw=0.6, alpha=0.35, color="C0", label="meta-loss")
  decay = min(0.99, max(0.0, 1.0 - 10.0 / max(len(raw), 1)))
  ax.plot(steps, ema(raw, decay), lw=1.6, color="C0", label=f"meta-loss, EMA (decay {decay:.2f})")
  ax.set(xlabel="meta-step", ylabel="meta-loss (normalized)", title="meta-training")
  evals = [(h["step"], h["eval_final_loss"]) for h in history if "eval_final_loss" in h]
  if evals:
    ax.plot(*zip(*evals), "o-", ms=3, color="C3", label="held-out test loss after the inner steps")
  ax.legend(fontsize=8)
  save_figure(fig, os.path.join(output_dir, PLOT_NAMES[0]))
  fig = Figure(figsize=(6.5, 4))
  ax = fig.subplots()
  for name, curve in curves.items():
    ax.plot(range(1, len(curve) + 1), curve, label=name)
  ax.set(xlabel="inner step", ylabel="normalized test loss (mean over instances)", title="held-out inner training",
         yscale="log")
  ax.legend(fontsize=8)
  save_figure(fig, os.path.join(output_dir, PLOT_NAMES[1]))
  return list(PLOT_NAMES) + plot_meta_validation(output_dir, history)


def validation_series(history: Sequence[Mapping[str, Any]]) -> Dict[str, Dict[str, np.ndarray]]:
  """The meta-validation checks of ``history`` as ``{label: {"step", "final_loss", "final_loss_sd"}}`` arrays: one
  series per family (``eval/FAMILY/...`` keys) and ``"mean over families"`` (``eval_final_loss``); ``{}`` if none."""
  checks = [h for h in history if "eval_final_loss" in h]
  if not checks:
    return {}
  families = sorted({k[len("eval/"):-len("/final_loss")] for h in checks for k in h
                     if k.startswith("eval/") and k.endswith("/final_loss")})
  prefixes = {f"eval/{f}/": f for f in families}
  prefixes["eval_"] = "mean over families" if families else "held-out loss"
  out = {}
  for prefix, label in prefixes.items():
    rows = [h for h in checks if f"{prefix}final_loss" in h]
    out[label] = {"step": np.asarray([h["step"] for h in rows], np.int64),
                  "final_loss": np.asarray([float(h[f"{prefix}final_loss"]) for h in rows]),
                  "final_loss_sd": np.asarray([float(h.get(f"{prefix}final_loss_sd", float("nan"))) for h in rows])}
  return out


def plot_meta_validation(output_dir: str, history: Sequence[Mapping[str, Any]]) -> List[str]:
  """Writes ``meta_validation.png`` (see the module docstring) and returns ``[its name]``; ``[]`` without
  matplotlib or without checks in ``history``."""
  series = validation_series(history)
  try:
    from matplotlib.figure import Figure
  except ImportError:
    return []
  if not series:
    return []
  fig = Figure(figsize=(6.5, 4))
  ax = fig.subplots()
  for i, (label, s) in enumerate(series.items()):
    mean = label in ("mean over families", "held-out loss")
    ax.plot(s["step"], s["final_loss"], "o-", ms=3, lw=2.0 if mean else 1.0, color="k" if mean else f"C{i}",
            label=label)
    sd = np.where(np.isfinite(s["final_loss_sd"]), s["final_loss_sd"], np.nan)
    if not mean and np.any(np.isfinite(sd)):
      ax.fill_between(s["step"], s["final_loss"] - sd, s["final_loss"] + sd, color=f"C{i}", alpha=0.15, lw=0)
  ax.set(xlabel="meta-step", ylabel="normalized loss at the horizon (same instances)", title="meta-validation")
  ax.legend(fontsize=8)
  save_figure(fig, os.path.join(output_dir, VALIDATION_PLOT_NAME))
  return [VALIDATION_PLOT_NAME]


def write_meta_train_report(output_dir: str, history: Sequence[Mapping[str, Any]], comparison: Any,
                            config: Mapping[str, Any], *, meta_steps: int, train_seconds: float,
                            inner_steps_per_meta_step: int = 0) -> List[str]:
  """Writes ``summary.json`` and the plots into ``output_dir``; returns the names written, summary first.

  Args:
    output_dir: an existing directory (the run's output directory).
    history: the meta-training records (`metafam.runs.read_metrics`; ``[]`` if none).
    comparison: the `metafam.evaluation.comparison.HeldOutComparison` of the run.
    config: the run's configuration (JSON-able).
    meta_steps: meta-steps trained in total; train_seconds: seconds of meta-training in this session.
  """
  write_json(os.path.join(output_dir, SUMMARY_NAME),
             meta_train_summary(history, comparison, config, meta_steps, train_seconds,
                                inner_steps_per_meta_step))
  return [SUMMARY_NAME] + plot_meta_train(output_dir, history, comparison.mean_curves())
