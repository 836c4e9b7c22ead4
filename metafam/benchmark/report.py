"""The reports of a suite evaluation: plain-text tables, CSV, the JSON record and the figures.

* `format_table(headers, rows)`: a plain-text table with aligned columns (numbers right-aligned).
* `table_csv(headers, rows)`: the same rows as CSV text.
* `existing_report_files(out_dir)`: the report files (`REPORT_FILES`) a directory already holds, which a new report
  would replace.
* `summary_row`, `task_rows`, `paired_rows` (with `SUMMARY_HEADERS`, `TASK_HEADERS`, `PAIRED_HEADERS`) and
  `few_tasks_note`: the tables of a `metafam.evaluation.scores.SuiteEvaluation`; `format_suite` prints them and
  `write_suite_report` writes the files (`metafam.benchmark.scoring.SuiteReport` is their caller).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from metafam.benchmark import paired
from metafam.evaluation.metrics import PROFILE_MAX, Aggregate
from metafam.evaluation.scores import LOSS_GAIN_IQM, PROFILE_SCORE, SuiteEvaluation

REPORT_FILES = tuple(f"{suite}{part}" for suite in ("heldout", "test", "custom")
                     for part in (".json", "_tasks.csv", "_curves.png")) + ("profile.png",)


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


def existing_report_files(out_dir: str) -> Tuple[str, ...]:
  """The names of `REPORT_FILES` already present in ``out_dir`` (which a new report would replace)."""
  return tuple(name for name in REPORT_FILES if os.path.exists(os.path.join(out_dir, name)))


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


# -- tables and figures ---------------------------------------------------------------------------------------------
def _interval(a: Aggregate) -> str:
  return f"{a.value:.2f} [{a.low:.2f}, {a.high:.2f}]"


def summary_row(evaluation: SuiteEvaluation) -> List[Any]:
  """``[name, profile score, median, IQM, optimality gap of the speedups, IQM of the loss gains (with intervals),
  tasks, diverged]``."""
  a = evaluation.aggregates
  return [evaluation.name, _interval(a[PROFILE_SCORE]), _interval(a["median"]), _interval(a["iqm"]),
          _interval(a["optimality_gap"]), _interval(a[LOSS_GAIN_IQM]), len(evaluation.scores),
          evaluation.num_diverged]


SUMMARY_HEADERS = ["optimizer", "profile score [95% CI]", "median speedup [95% CI]", "IQM speedup [95% CI]",
                   "optimality gap [95% CI]", "IQM loss gain [95% CI]", "tasks", "diverged"]
TASK_HEADERS = ["task", "T", "final loss", "time ratio", "speedup", "capped", "loss ratio", "loss gain", "rank",
                "diverged", "setting"]


def task_rows(evaluation: SuiteEvaluation) -> List[List[Any]]:
  """Per task: `TASK_HEADERS` (the normalized final loss, time ratio and speedup of the seed-mean curve; the loss
  gain is `TaskScore.loss_gain`, the seeds' mean)."""
  rows = []
  for s in evaluation.scores:
    setting = "-" if s.setting is None else f"{s.setting['schedule']} lr={s.setting['learning_rate']:.3g}"
    rows.append([s.task, s.horizon, s.final_loss, s.time_ratio, s.speedup, s.speedup_capped, s.loss_ratio, s.loss_gain,
                 f"{s.rank}/{s.num_ranked}", s.diverged, setting])
  return rows


PAIRED_HEADERS = ["baseline", "P(higher profile score) [95% CI]", "profile-score difference [95% CI]",
                  "P(candidate > baseline) [95% CI]", "IQM difference [95% CI]",
                  "P(lower loss) [95% CI]", "IQM loss-gain difference [95% CI]", "tasks"]


def paired_rows(evaluation: SuiteEvaluation, baselines: Mapping[str, SuiteEvaluation]) -> List[List[Any]]:
  """Per baseline: `metafam.benchmark.paired.probability_of_improvement` and the paired `difference` (mean) of the
  candidate's per-seed profile scores against the baseline's, then the same (IQM difference) of the per-seed
  speedups and of the per-seed loss gains, on the tasks both were scored on. ``tasks`` counts the tasks of the
  profile scores' comparison."""
  rows = []
  for b in baselines.values():
    if b is evaluation:
      continue
    common = [s.task for s in evaluation.scores if s.task in {t.task for t in b.scores}]
    row, tasks = [b.name], []
    for scores, statistic in ((SuiteEvaluation.seed_profile_scores, "mean"), (SuiteEvaluation.seed_speedups, "iqm"),
                              (SuiteEvaluation.seed_loss_gains, "iqm")):
      a_scores, b_scores = scores(evaluation, common), scores(b, common)
      p = paired.probability_of_improvement(a_scores, b_scores)
      d = paired.difference(a_scores, b_scores, statistic)
      row += [f"{p.value:.2f} [{p.low:.2f}, {p.high:.2f}]", f"{d.value:+.2f} [{d.low:+.2f}, {d.high:+.2f}]"]
      tasks.append(p.num_tasks)
    rows.append(row + [tasks[0]])
  return rows


FEW_TASKS = 5  # below this many tasks, tables show the per-seed values beside the aggregates


def few_tasks_note(evaluations: Sequence[SuiteEvaluation]) -> str:
  """For aggregates over fewer than `FEW_TASKS` tasks: each optimizer's per-seed time ratios and speedups, and what
  an interval over that few means; empty otherwise."""
  evaluations = [e for e in evaluations if 0 < len(e.scores) < FEW_TASKS]
  if not evaluations:
    return ""
  n = len(evaluations[0].scores)
  lines = [f"Over {n} task{'s' if n > 1 else ''}, an aggregate is mostly seed noise: its interval resamples only "
           "the seeds of each task and says nothing of other tasks, and the pooled per-seed values need not match "
           "the table's value of the seed-mean curve. Per seed (time ratio / speedup):"]
  for e in evaluations:
    for s in e.scores:
      per_seed = ", ".join(f"{r:.2f} / {v:.2f}" for r, v in zip(s.seed_time_ratios, s.seed_speedups))
      lines.append(f"  {e.name} on {s.task}: {per_seed}")
  return "\n".join(lines)


def format_suite(evaluation: SuiteEvaluation, baselines: Optional[Mapping[str, SuiteEvaluation]] = None) -> str:
  """Per-task table, the summary of the candidate (and of the baselines, if given), the paired comparisons with each
  baseline, then the win fractions."""
  head = f"suite: {evaluation.suite}" + (f", evaluated {evaluation.evaluated_at}" if evaluation.evaluated_at else "")
  parts = [head, format_table(TASK_HEADERS, task_rows(evaluation)), ""]
  rows = [summary_row(evaluation)] + [summary_row(b) for b in (baselines or {}).values()]
  parts += [format_table(SUMMARY_HEADERS, rows), ""]
  if baselines:
    parts += [format_table(PAIRED_HEADERS, paired_rows(evaluation, baselines)), ""]
  parts.append(format_table(["baseline", f"{evaluation.name} beats it on"],
                            [[o, f"{w:.0%} of tasks"] for o, w in evaluation.win_fraction.items()]))
  note = few_tasks_note([evaluation, *(baselines or {}).values()])
  if note:
    parts += ["", note]
  if evaluation.pending:
    parts.append(f"\nnot evaluated (no shipped baselines yet): {', '.join(evaluation.pending)}")
  return "\n".join(parts)


def write_suite_report(evaluation: SuiteEvaluation, out_dir: str,
                       baselines: Optional[Mapping[str, SuiteEvaluation]] = None) -> List[str]:
  """``<suite>.json`` and ``<suite>_tasks.csv`` (atomic; the JSON records the suite, when the candidate ran and the
  paired comparisons), plus ``profile.png`` (performance profiles: fraction of tasks with speedup at least x, per
  optimizer) and ``<suite>_curves.png`` (per-task mean test curves of the candidate and every baseline) when
  matplotlib is importable. Returns the paths written."""
  from metafam.io import atomic_write, write_json
  os.makedirs(out_dir, exist_ok=True)
  label = evaluation.name if evaluation.name not in (baselines or {}) else f"{evaluation.name} (candidate)"
  everyone = {label: evaluation, **(baselines or {})}  # a candidate named like a baseline keeps both rows
  paired_table = [dict(zip(PAIRED_HEADERS, row)) for row in paired_rows(evaluation, baselines or {})]
  record = {"candidate": label, "suite": evaluation.suite, "evaluated_at": evaluation.evaluated_at,
            "wall_time": evaluation.wall_time, "pending": list(evaluation.pending), "paired": paired_table,
            "summary": {name: {k: dataclasses.asdict(a) for k, a in e.aggregates.items()}
                        for name, e in everyone.items()},
            "win_fraction": evaluation.win_fraction, "num_diverged": evaluation.num_diverged,
            "tasks": [dataclasses.asdict(s) for s in evaluation.scores]}
  suite = evaluation.suite
  paths = [os.path.join(out_dir, f"{suite}.json"), os.path.join(out_dir, f"{suite}_tasks.csv")]
  write_json(paths[0], json.loads(json.dumps(record, default=float)))
  atomic_write(paths[1], table_csv(TASK_HEADERS, task_rows(evaluation)).encode())
  try:  # the object-oriented API without pyplot: no global figure registry, no process-wide backend switch
    from matplotlib.figure import Figure
  except ImportError:
    return paths
  from metafam.io import save_figure
  thresholds = np.linspace(1.0, PROFILE_MAX, 61)
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  for e in everyone.values():
    ratios = np.array([s.time_ratio for s in e.scores], np.float64)
    ax.step(thresholds, np.mean(ratios[None, :] <= thresholds[:, None], axis=1), where="post",
            label=e.name, linewidth=2.5 if e is evaluation else 1.0)
  ax.set(xlabel="time ratio to the pool's fastest, at most", ylabel="fraction of tasks", ylim=(0, 1.02),
         xlim=(1.0, PROFILE_MAX))
  ax.legend(fontsize=7)
  save_figure(fig, os.path.join(out_dir, "profile.png"))
  names = list(evaluation.curves)
  cols = 4
  fig = Figure(figsize=(4 * cols, 3 * ((len(names) + 3) // 4)))
  axes = fig.subplots((len(names) + cols - 1) // cols, cols, squeeze=False)
  for ax, task in zip(axes.ravel(), names):
    for e in everyone.values():
      if task in e.curves:
        steps, c = e.curves[task]
        ax.plot(steps, np.mean(c, axis=0), label=e.name, linewidth=2.5 if e is evaluation else 1.0)
    ax.set_title(task, fontsize=7)
    ax.set_yscale("log")
  for ax in axes.ravel()[len(names):]:
    ax.axis("off")
  axes.ravel()[0].legend(fontsize=6)
  save_figure(fig, os.path.join(out_dir, f"{suite}_curves.png"))
  return paths + [os.path.join(out_dir, "profile.png"), os.path.join(out_dir, f"{suite}_curves.png")]
