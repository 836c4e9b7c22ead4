"""Tables, files and figures of a `BenchmarkResult`.

* `format_table(headers, rows)`: plain-text table with aligned columns (numbers right-aligned).
* `results_table`, `tuned_table`, `aggregates_table`: the three tables as ``(headers, rows)``.
* `print_report(result)`: all tables to a stream.
* `write_report(result, out_dir)`: ``results.csv``, ``tuned.csv``, ``aggregates.csv`` and ``results.json`` (written
  atomically: a temporary file in the same directory, then `os.replace`), plus ``curves.png`` (normalized loss
  curves per task, one line per optimizer) and ``speedup.png`` (IQM speedup over the reference with bootstrap CI
  bars) when matplotlib is importable. Without matplotlib it warns once per call, naming ``pip install matplotlib``,
  and still writes the tables.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import sys
import warnings
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

import numpy as np

from metafam.benchmark.runner import TUNED_SUFFIX, BenchmarkResult
from metafam.io import atomic_write, save_figure

REPORT_FILES = ("results.csv", "tuned.csv", "aggregates.csv", "results.json", "curves.png", "speedup.png",
                "heldout.json", "heldout_tasks.csv", "profile.png", "heldout_curves.png")  # the last four: heldout
MATPLOTLIB_HINT = "pip install matplotlib  (or the `plot` extra: pip install \"metafam[plot]\")"
Table = Tuple[List[str], List[List[Any]]]


# -- formatting ---------------------------------------------------------------------------------------------------
def _fmt(value: Any) -> str:
  if value is None:
    return "-"
  if isinstance(value, (bool, np.bool_)):
    return "yes" if value else "no"
  if isinstance(value, (int, np.integer)):
    return str(int(value))
  if isinstance(value, (float, np.floating)):
    v = float(value)
    if math.isnan(v):
      return "nan"
    if math.isinf(v):
      return "inf" if v > 0 else "-inf"
    return f"{v:.3g}" if (v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e4)) else f"{v:.4f}"
  return str(value)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A plain-text table: a header line, a rule, then one line per row; numbers right-aligned, text left-aligned."""
  cells = [[_fmt(v) for v in row] for row in rows]
  widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
  numeric = [bool(rows) and all(_is_number(r[i]) or r[i] is None for r in rows) for i in range(len(headers))]

  def line(values):
    return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

  return "\n".join([line(list(headers)), "  ".join("-" * w for w in widths)] + [line(r) for r in cells])


# -- tables -------------------------------------------------------------------------------------------------------
def results_table(result: BenchmarkResult) -> Table:
  """One row per (task, optimizer): normalized final and best loss, speedup over the reference, flags."""
  headers = ["task", "optimizer", "learning_rate", "final_loss", "best_loss", "speedup", "speedup_capped",
             "diverged"]
  rows = [[m.task, m.optimizer, m.learning_rate, m.final_loss, m.best_loss, m.speedup, m.speedup_capped, m.diverged]
          for m in result.metrics]
  return headers, rows


def tuned_table(result: BenchmarkResult) -> Table:
  """One row per (task, tuned baseline): selected rate, its losses at the benchmark horizon, sweep diagnostics."""
  split = result.settings["metric_split"]
  headers = ["task", "baseline", "best_lr", "at_grid_edge", "final_inner_valid", f"final_{split}_normalized",
             "diverged_lrs", "sweep_steps", "sweep_seconds"]
  rows = []
  for task in result.tasks:
    for base, sweep in result.sweeps.get(task, {}).items():
      rows.append([task, base, sweep.best_lr if sweep.best_index >= 0 else None,
                   sweep.at_edge if sweep.best_index >= 0 else None, sweep.final_loss("inner_valid"),
                   sweep.final_loss(split, normalized=True), int(sweep.diverged.sum()),
                   int(sweep.eval_steps[-1]), sweep.wall_time])
  return headers, rows


def aggregates_table(result: BenchmarkResult) -> Table:
  """One row per (optimizer, metric, statistic) with its bootstrap CI."""
  headers = ["optimizer", "metric", "statistic", "value", "ci_low", "ci_high", "num_tasks", "num_excluded"]
  rows = []
  for opt in result.optimizers:
    for key, agg in result.aggregates.get(opt, {}).items():
      metric = key[:-len(agg.statistic) - 1]
      rows.append([opt, metric, agg.statistic, agg.value, agg.low, agg.high, agg.num_tasks, agg.num_excluded])
  return headers, rows


def print_report(result: BenchmarkResult, file: Optional[TextIO] = None) -> None:
  """Prints the tuned-baseline, per-run and aggregate tables and the wall time."""
  file = file or sys.stdout
  s = result.settings
  print(f"Benchmark: {len(result.tasks)} tasks x {len(result.optimizers)} optimizers, {s['num_steps']} steps, "
        f"{s['num_seeds']} seeds, metrics on normalized {s['metric_split']} loss (seed mean).", file=file)
  if result.sweeps and any(result.sweeps.values()):
    print(f"\nTuned baselines (rate selected on inner_valid at step {s['num_steps']} from "
          f"{len(s['learning_rates'])} rates in [{min(s['learning_rates']):g}, {max(s['learning_rates']):g}]):",
          file=file)
    print(format_table(*tuned_table(result)), file=file)
  ref = s.get("reference")
  print(f"\nPer task (speedup: steps {ref}{TUNED_SUFFIX} needs to reach the final loss / {s['num_steps']}; "
        f"capped at {s['baseline_factor']} = yes means it never got there):" if ref else "\nPer task:", file=file)
  print(format_table(*results_table(result)), file=file)
  print(f"\nAcross tasks (bootstrap {100 * s['confidence']:g}% CI, {s['num_resamples']} resamples):", file=file)
  print(format_table(*aggregates_table(result)), file=file)
  print(f"\nTotal wall time: {result.wall_time:.1f} s", file=file)


# -- files --------------------------------------------------------------------------------------------------------
def _csv_value(value: Any) -> Any:
  if value is None:
    return ""
  if isinstance(value, (np.bool_, bool)):
    return bool(value)
  if isinstance(value, (np.integer, np.floating)):
    return value.item()
  return value


def table_csv(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  writer.writerow(headers)
  for row in rows:
    writer.writerow([_csv_value(v) for v in row])
  return buf.getvalue()


def _jsonable(value: Any) -> Any:
  """Plain JSON types; NaN and infinities become None (strict JSON has no such numbers)."""
  if isinstance(value, dict):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if isinstance(value, np.ndarray):
    return _jsonable(value.tolist())
  if isinstance(value, (np.bool_, bool)):
    return bool(value)
  if isinstance(value, (np.integer, int)):
    return int(value)
  if isinstance(value, (np.floating, float)):
    v = float(value)
    return v if math.isfinite(v) else None
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return _jsonable(dataclasses.asdict(value))
  return value


def result_json(result: BenchmarkResult) -> Dict[str, Any]:
  """The JSON document of ``results.json``: settings, tables as records, seed-mean normalized eval curves."""
  def records(table):
    headers, rows = table
    return [dict(zip(headers, row)) for row in rows]

  curves = {task: {opt: {"eval_steps": c.eval_steps,
                         **{split: c.mean_curve(split) for split in c.normalized_eval_losses}}
                   for opt, c in by_opt.items()}
            for task, by_opt in result.runs.items()}
  return _jsonable({"settings": result.settings, "wall_time": result.wall_time,
                    "results": records(results_table(result)), "tuned": records(tuned_table(result)),
                    "aggregates": records(aggregates_table(result)), "curves_normalized_seed_mean": curves})


@dataclasses.dataclass(frozen=True)
class ReportFiles:
  """Paths written by `write_report`; ``figures`` is empty when matplotlib is missing (``figures_skipped`` says why)."""
  results_csv: str
  tuned_csv: str
  aggregates_csv: str
  json: str
  figures: Tuple[str, ...]
  figures_skipped: Optional[str] = None


def existing_report_files(out_dir: str) -> Tuple[str, ...]:
  """The names of `write_report`'s files already present in ``out_dir`` (which `write_report` would replace)."""
  return tuple(name for name in REPORT_FILES if os.path.exists(os.path.join(out_dir, name)))


def write_report(result: BenchmarkResult, out_dir: str, figures: bool = True) -> ReportFiles:
  """Writes the CSV tables, ``results.json`` and (with matplotlib) the PNG figures into ``out_dir``."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {name: os.path.join(out_dir, f"{name}.csv") for name in ("results", "tuned", "aggregates")}
  for name, table in (("results", results_table(result)), ("tuned", tuned_table(result)),
                      ("aggregates", aggregates_table(result))):
    atomic_write(paths[name], table_csv(*table).encode())
  json_path = os.path.join(out_dir, "results.json")
  atomic_write(json_path, (json.dumps(result_json(result), indent=1, allow_nan=False) + "\n").encode())
  written: Tuple[str, ...] = ()
  skipped = None
  if figures:
    try:
      written = _write_figures(result, out_dir)
    except ImportError as e:
      skipped = f"matplotlib is not installed ({e}); figures skipped, tables written. To get them: {MATPLOTLIB_HINT}"
      warnings.warn(skipped, stacklevel=2)
  else:
    skipped = "figures=False"
  return ReportFiles(paths["results"], paths["tuned"], paths["aggregates"], json_path, written, skipped)


# -- figures ------------------------------------------------------------------------------------------------------
def _write_figures(result: BenchmarkResult, out_dir: str) -> Tuple[str, ...]:
  """``curves.png`` and (with a reference) ``speedup.png``; raises ImportError without matplotlib."""
  # The object-oriented API without pyplot: no global figure registry, no backend switch.
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel

  split = result.settings["metric_split"]
  paths = []
  n = len(result.tasks)
  cols = min(4, n)
  rows = int(math.ceil(n / cols))
  fig = Figure(figsize=(4.2 * cols, 3.2 * rows))
  axes = fig.subplots(rows, cols, squeeze=False)
  for ax, task in zip(axes.ravel(), result.tasks):
    for opt in result.optimizers:
      curves = result.runs[task].get(opt)
      if curves is None:
        continue
      mean = curves.mean_curve(split)
      lo = np.min(curves.normalized_eval_losses[split], axis=0)
      hi = np.max(curves.normalized_eval_losses[split], axis=0)
      (line,) = ax.plot(curves.eval_steps, mean, label=opt)
      if curves.num_seeds > 1:
        ax.fill_between(curves.eval_steps, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_title(task, fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel(f"normalized {split} loss")
    positive = [c.mean_curve(split) for c in result.runs[task].values()]
    if positive and all(np.all(np.asarray(p)[np.isfinite(p)] > 0) for p in positive):
      ax.set_yscale("log")
  for ax in axes.ravel()[n:]:
    ax.set_visible(False)
  axes.ravel()[0].legend(fontsize=7)
  fig.tight_layout()
  paths.append(os.path.join(out_dir, "curves.png"))
  save_figure(fig, paths[-1])

  ref = result.settings.get("reference")
  if ref is not None:
    names = list(result.optimizers)
    aggs = [result.aggregates[o]["speedup_iqm"] for o in names]
    fig = Figure(figsize=(max(4.0, 1.1 * len(names) + 1.5), 3.4))
    ax = fig.subplots()
    x = np.arange(len(names))
    values = np.array([a.value for a in aggs])
    err = np.array([[max(a.value - a.low, 0.0), max(a.high - a.value, 0.0)] for a in aggs]).T
    ax.bar(x, np.nan_to_num(values), yerr=np.nan_to_num(err), capsize=4, color="tab:blue", alpha=0.8)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"speedup over {ref}{TUNED_SUFFIX} (IQM)")
    ax.set_title(f"{len(result.tasks)} tasks, {100 * result.settings['confidence']:g}% bootstrap CI "
                 f"(capped at {result.settings['baseline_factor']})", fontsize=9)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "speedup.png"))
    save_figure(fig, paths[-1])
  return tuple(paths)
