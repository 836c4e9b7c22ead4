"""Does a cheaper orthogonalization keep Muon's quality? Muon with fewer Newton-Schulz iterations on the dev suite.

    python experiments/muon_variants.py [--ns_steps 3 2] [--cache_dir DIR] [--tasks a,b]

Each variant is ``optax.contrib.muon(learning_rate, ns_steps=N)`` (optax's quintic coefficients; its default is 5
iterations) tuned on every dev (``heldout``) task exactly as the shipped Muon baseline is (`evaluate_suite` with a
factory: Muon's 7-point rate grid, constant and warmup+cosine schedules, the same seeds, batches and selection; the
updates one lane at a time on a CPU, as the baseline's), then compared with that shipped baseline paired per (task,
seed): P(variant > Muon) and the IQM difference, on speedups and on loss gains (`metafam.benchmark.paired`). The
shipped curves were computed by earlier code of the same procedure, which differs from today's only in float
rounding; ``--ns_steps 5`` re-runs the baseline itself, the control that shows how far rounding alone moves the
paired statistics. The Newton-Schulz iterations are most of Muon's update cost (`benchmarks/step_cost.py
--muon_ns_steps` times them), so N iterations cost about N/5 of it.

The dev suite only: a design choice is never made on the test suite.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import optax

from metafam.benchmark import baselines as bl
from metafam.benchmark.heldout import (PAIRED_HEADERS, SUMMARY_HEADERS, baseline_evaluations, evaluate_suite,
                                       load_normalizers, paired_rows, summary_row)
from metafam.benchmark.report import format_table


def variant(ns_steps: int):
  """The factory ``learning_rate -> optax.contrib.muon(learning_rate, ns_steps=ns_steps)``, named ``muon_nsN``."""
  factory = functools.partial(optax.contrib.muon, ns_steps=ns_steps)
  factory.__name__ = f"muon_ns{ns_steps}"
  return factory


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--ns_steps", type=int, nargs="+", default=[3], help="Newton-Schulz iterations of each variant")
  p.add_argument("--tasks", default="", help="comma-separated dev tasks (default: all with shipped baselines)")
  p.add_argument("--cache_dir", default=None, help="keep each finished task under DIR/muon_nsN; rerunning resumes")
  args = p.parse_args()
  if any(n < 1 for n in args.ns_steps):
    p.error(f"--ns_steps must be positive integers, got {args.ns_steps}")
  data = load_normalizers(suite="heldout")
  tasks = [t for t in args.tasks.split(",") if t] or None
  unknown = sorted(set(tasks or ()) - set(data["tasks"]))
  if unknown:
    p.error(f"--tasks: {', '.join(unknown)} not among the dev suite's tasks with baselines: "
            f"{', '.join(sorted(data['tasks']))}")
  reference = {"muon (shipped)": baseline_evaluations(data)["muon"]}  # paired on the tasks both have
  rows, paired = [summary_row(reference["muon (shipped)"])], []
  for n in args.ns_steps:
    start = time.perf_counter()
    evaluation = evaluate_suite(variant(n), tasks=tasks, data=data, learning_rates=bl.grid("muon"),
                                schedules=bl.SCHEDULES, lane_chunk=bl.default_lane_chunk("muon"),
                                cache_dir=args.cache_dir and os.path.join(args.cache_dir, f"muon_ns{n}"),
                                cache_identity={"ns_steps": n})
    print(f"muon_ns{n}: {time.perf_counter() - start:.0f} s in this run")
    rows.append(summary_row(evaluation))
    paired += [[f"muon_ns{n} vs {row[0]}"] + row[1:] for row in paired_rows(evaluation, reference)]
  print(format_table(SUMMARY_HEADERS, rows))
  print(format_table(["comparison"] + PAIRED_HEADERS[1:], paired))


if __name__ == "__main__":
  main()
