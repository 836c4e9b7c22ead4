"""Plain-text tables and CSV for benchmark reports.

* `format_table(headers, rows)`: a plain-text table with aligned columns (numbers right-aligned).
* `table_csv(headers, rows)`: the same rows as CSV text.
* `existing_report_files(out_dir)`: the report files (`REPORT_FILES`) a directory already holds, which a new report
  would replace.

The reports themselves are `metafam.benchmark.scoring.SuiteReport`'s (`metafam.benchmark.heldout.format_suite` and
`write_suite_report`).
"""

from __future__ import annotations

import csv
import io
import math
import os
from typing import Any, Sequence, Tuple

import numpy as np

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
