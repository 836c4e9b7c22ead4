"""Benchmarks optax optimizers on a task suite against learning-rate-tuned Adam and SGD with momentum.

    python examples/benchmark_optax.py --suite tiny --num_steps 200

A candidate is any factory of a float learning rate (here AdamW with its own weight decay, tuned per task like the
baselines) or a whole transformation at a fixed setting (SGD with momentum at 0.05, scored untuned under its name).
The baselines of the suite are made first by the shipped suites' procedure; each report prints the per-task table
(time ratio to the pool's fastest, speedup over tuned Adam, final loss) and the profile score across tasks, and
writes JSON, CSV and (with matplotlib) PNG files to --out.
"""

import argparse
import os

import optax

from metafam.benchmark import score


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--suite", default="tiny")
  parser.add_argument("--num_steps", type=int, default=200, help="a multiple of 8")
  parser.add_argument("--out", default="runs/benchmark_optax")
  args = parser.parse_args()
  candidates = {"adamw(wd=0.01)": lambda lr: optax.adamw(lr, weight_decay=0.01),
                "sgdm(0.05)": optax.sgd(0.05, momentum=0.9)}
  for name, candidate in candidates.items():
    report = score(candidate, suite=args.suite, horizon=args.num_steps, baselines=("adam", "sgdm"), name=name,
                   cache_dir=os.path.join(args.out, "cache"))   # the baselines are trained once, then read
    print(report.format())
    paths = report.write(os.path.join(args.out, name))
    print(f"wrote {', '.join(paths)}\n")


if __name__ == "__main__":
  main()
