"""Does a cheaper orthogonalization keep Muon's quality? Muon with fewer Newton-Schulz iterations on the dev suite.

    python experiments/muon_variants.py [--ns_steps 3 2] [--conv_kernels matrix] [--cache_dir DIR] [--tasks a,b]

Each variant is ``optax.contrib.muon(learning_rate, ns_steps=N)`` (optax's quintic coefficients; its default is 5
iterations) tuned on every dev (``heldout``) task exactly as the shipped Muon baseline is (`evaluate_suite` with a
factory: Muon's 7-point rate grid, constant and warmup+cosine schedules, the same seeds, batches and selection; the
updates one lane at a time on a CPU, as the baseline's), then compared with that shipped baseline paired per (task,
seed): P(variant > Muon) and the IQM difference, on speedups and on loss gains (`metafam.benchmark.paired`). The
shipped curves were computed by earlier code of the same procedure, which differs from today's only in float
rounding; ``--ns_steps 5`` re-runs the baseline itself, the control that shows how far rounding alone moves the
paired statistics, and the other variants of the same command are then also paired with it (no rounding difference).
The Newton-Schulz iterations are most of Muon's update cost (`benchmarks/step_cost.py --muon_ns_steps` times them),
so N iterations cost about N/5 of it.

The dev suite only: a design choice is never made on the test suite.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import optax

from metafam.benchmark import baselines as bl
from metafam.benchmark.heldout import baseline_evaluations, evaluate_suite, load_normalizers
from metafam.benchmark.report import PAIRED_HEADERS, SUMMARY_HEADERS, format_table, paired_rows, summary_row
from metafam.optimizers.muon_lopt import CONV_KERNELS, muon_dimension_numbers

DEFAULT_NS_STEPS = 5  # optax.contrib.muon's


def variant(ns_steps: int, conv_kernels: str = "adam"):
  """The factory ``learning_rate -> optax.contrib.muon(learning_rate, ns_steps=ns_steps, ...)``, named ``muon_nsN``
  (``muon_nsN_convmat`` with conv kernels orthogonalized as matrices)."""
  factory = functools.partial(optax.contrib.muon, ns_steps=ns_steps,
                              muon_weight_dimension_numbers=muon_dimension_numbers(conv_kernels))
  factory.__name__ = f"muon_ns{ns_steps}" + ("_convmat" if conv_kernels == "matrix" else "")
  return factory


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--ns_steps", type=int, nargs="+", default=[3], help="Newton-Schulz iterations of each variant")
  p.add_argument("--conv_kernels", default="adam", choices=CONV_KERNELS,
                 help="conv kernels get the Adam part (optax's default) or are orthogonalized as matrices")
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

  def evaluate(n, conv_kernels):
    start, factory = time.perf_counter(), variant(n, conv_kernels)
    identity = {"ns_steps": n} if conv_kernels == "adam" else {"ns_steps": n, "conv_kernels": conv_kernels}
    evaluation = evaluate_suite(factory, tasks=tasks, data=data, learning_rates=bl.grid("muon"),
                                schedules=bl.SCHEDULES, lane_chunk=bl.default_lane_chunk("muon"),
                                cache_dir=args.cache_dir and os.path.join(args.cache_dir, factory.__name__),
                                cache_identity=identity)
    print(f"{factory.__name__}: {time.perf_counter() - start:.0f} s in this run")
    return factory.__name__, evaluation

  variants = {}
  for n in args.ns_steps:
    name, variants[name] = evaluate(n, args.conv_kernels)
    rows.append(summary_row(variants[name]))
    references = dict(reference)
    if args.conv_kernels != "adam":  # the same N with optax's default rule, run now: isolates the conv kernels
      plain_name, references[plain_name] = evaluate(n, "adam")
      rows.append(summary_row(references[plain_name]))
    paired += [[f"{name} vs {row[0]}"] + row[1:] for row in paired_rows(variants[name], references)]
  control = variant(DEFAULT_NS_STEPS, args.conv_kernels).__name__
  if control in variants:  # optax's iteration count computed in this run: the others paired with it, rounding alike
    for name, evaluation in variants.items():
      if name != control:
        rows_vs_control = paired_rows(evaluation, {control: variants[control]})
        paired += [[f"{name} vs {control}"] + row[1:] for row in rows_vs_control]
  print(format_table(SUMMARY_HEADERS, rows))
  print(format_table(["comparison"] + PAIRED_HEADERS[1:], paired))


if __name__ == "__main__":
  main()
