"""Benchmarks an optax optimizer on a task suite against learning-rate-tuned Adam.

    python examples/benchmark_optax.py --suite tiny --num_steps 200

Any optax transformation works; here SGD with momentum at a fixed learning rate and AdamW. Prints the per-task table
(final / best normalized test loss, speedup over tuned Adam) and the median / IQM across tasks, and writes CSV, JSON
and (with matplotlib) PNG files to --out.
"""

import argparse

import optax

from metafam.benchmark import print_report, run_benchmark, write_report


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--suite", default="tiny")
  parser.add_argument("--num_steps", type=int, default=200)
  parser.add_argument("--out", default="runs/benchmark_optax")
  args = parser.parse_args()
  result = run_benchmark(args.suite, {"sgdm(0.05)": optax.sgd(0.05, momentum=0.9), "adamw(3e-3)": optax.adamw(3e-3)},
                         num_steps=args.num_steps, num_seeds=2)
  print_report(result)
  files = write_report(result, args.out)
  print(f"wrote {files.results_csv} and friends")


if __name__ == "__main__":
  main()
