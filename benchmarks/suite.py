"""Tunes Adam's learning rate per task on a suite and benchmarks optimizers against it.

    python benchmarks/suite.py                                   # suite "small", 200 steps, 2 seeds
    python benchmarks/suite.py --quick                           # suite "tiny", 100 steps: a smoke test
    python benchmarks/suite.py --suite full --num_steps 1000 --optimizers adam:1e-3 nadamw:1e-3 \
        mlp_lopt:runs/lopt/checkpoint.npz --tune adam sgdm --out results/full

For every task, Adam (and any other ``--tune`` baseline) is swept over ``--num_lrs`` log-spaced learning rates in
[``--lr_min``, ``--lr_max``], rates x seeds vmapped in one program, and the rate with the lowest ``inner_valid`` loss
over the last 10% of ``--num_steps`` steps is selected. Adam is swept for ``--baseline_factor`` times as many steps,
so speedups up to that factor can be measured. Each ``--optimizers`` entry (``adam:LR``, ``sgd:LR``, ``sgdm:LR``,
``nadamw:LR``, or ``mlp_lopt:PATH``, ``learnable_adam:PATH``, ``learnable_sgd:PATH`` for a learned optimizer with
default constructor arguments and its theta from a checkpoint) trains all seeds in one vmapped program. Printed: the
tuned-Adam table (task, best learning rate, final losses), per-run and aggregate tables, and the total wall time.
``--out DIR`` also writes CSV, JSON and (with matplotlib) PNG figures.
"""

from __future__ import annotations

import argparse
import sys
import time


def parse_optimizer(spec: str):
  """``"name:value"`` -> ``(label, optimizer spec for run_benchmark)``."""
  if ":" not in spec:
    raise argparse.ArgumentTypeError(f"optimizer {spec!r} must look like adam:1e-3 or mlp_lopt:PATH.")
  import optax  # pylint: disable=import-outside-toplevel  # here, so that --help is instant
  kind, value = spec.split(":", 1)
  fixed = {"adam": optax.adam, "sgd": optax.sgd, "nadamw": optax.nadamw,
           "sgdm": lambda lr: optax.sgd(lr, momentum=0.9)}
  if kind in fixed:
    try:
      lr = float(value)
    except ValueError:
      raise argparse.ArgumentTypeError(f"learning rate of {spec!r} is not a number.") from None
    return f"{kind}-{lr:g}", fixed[kind](lr)
  if kind in ("mlp_lopt", "learnable_adam", "learnable_sgd"):
    from metafam.optimizers.learned import LearnableAdam, LearnableSGD  # pylint: disable=import-outside-toplevel
    from metafam.optimizers.mlp_lopt import MLPLOpt  # pylint: disable=import-outside-toplevel
    lopt = {"mlp_lopt": MLPLOpt, "learnable_adam": LearnableAdam, "learnable_sgd": LearnableSGD}[kind]()
    return kind, (lopt, value)
  raise argparse.ArgumentTypeError(f"unknown optimizer kind {kind!r} in {spec!r}; use adam, sgd, sgdm, nadamw, "
                                   "mlp_lopt, learnable_adam or learnable_sgd.")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--suite", default="small", help="suite name (tiny, small, full) or one registered task")
  parser.add_argument("--quick", action="store_true", help="suite tiny, 100 steps, eval every 10: a smoke test")
  parser.add_argument("--num_steps", type=int, default=200)
  parser.add_argument("--num_seeds", type=int, default=2)
  parser.add_argument("--eval_every", type=int, default=None, help="default num_steps // 10")
  parser.add_argument("--eval_batches", type=int, default=4)
  parser.add_argument("--optimizers", nargs="*", default=["adam:1e-3"],
                      help="benchmarked optimizers, e.g. adam:1e-3 sgdm:0.05 mlp_lopt:ckpt.npz (default adam:1e-3)")
  parser.add_argument("--tune", nargs="*", default=["adam"], help="tuned baselines: adam, nadamw, sgdm, sgd")
  parser.add_argument("--lr_min", type=float, default=1e-4)
  parser.add_argument("--lr_max", type=float, default=1e-1)
  parser.add_argument("--num_lrs", type=int, default=7)
  parser.add_argument("--baseline_factor", type=int, default=2, help="Adam runs this many times longer")
  parser.add_argument("--metric_split", default="test")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=None, help="directory for CSV / JSON / PNG files (default: print only)")
  parser.add_argument("--no_progress", action="store_true")
  args = parser.parse_args(argv)
  if args.quick:
    args.suite, args.num_steps, args.eval_every = "tiny", 100, 10
  if "adam" not in args.tune:
    parser.error("--tune must include adam (the reference of the speedup).")
  try:
    optimizers = dict(parse_optimizer(s) for s in args.optimizers)
  except argparse.ArgumentTypeError as e:
    parser.error(str(e))

  start = time.perf_counter()
  # Imported here so that --help is instant.
  from metafam.benchmark import print_report, run_benchmark, write_report  # pylint: disable=import-outside-toplevel
  from metafam.benchmark.sweep import default_learning_rates  # pylint: disable=import-outside-toplevel

  result = run_benchmark(args.suite, optimizers, num_steps=args.num_steps, num_seeds=args.num_seeds,
                         eval_every=args.eval_every or max(1, args.num_steps // 10), eval_batches=args.eval_batches,
                         tuned=args.tune, reference="adam",
                         learning_rates=default_learning_rates(args.lr_min, args.lr_max, args.num_lrs),
                         baseline_factor=args.baseline_factor, metric_split=args.metric_split, seed=args.seed,
                         progress=not args.no_progress)
  print_report(result)
  if args.out:
    files = write_report(result, args.out)
    print(f"\nWrote {files.results_csv}, {files.tuned_csv}, {files.aggregates_csv}, {files.json}"
          + (f", {', '.join(files.figures)}" if files.figures else ""))
  print(f"\nTotal wall time: {time.perf_counter() - start:.1f} s (imports included)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
