"""A learned optimizer on the heldout suite, with its step scale fixed or tuned per task like a learning rate.

    python experiments/heldout_learned.py [--checkpoint runs/meta_train/checkpoint.npz] [--tune_step]

Without ``--checkpoint`` the optimizer's initial theta is scored. With ``--tune_step`` its updates are scaled by
``rate / --step_mult`` and the rate is tuned per task by the baselines' own procedure (same 7-point grid half a
decade apart, centred on ``--step_mult``; same seeds; selection on ``inner_valid``; constant schedule), which is the
same as tuning the optimizer's ``step_mult`` (its step is linear in it). Prints the suite's aggregates, how many
tasks end below tuned Adam's final loss and above 1.5x of it, and the divergences.
"""
import argparse
import json
import time

import jax
import numpy as np
import optax

from metafam.benchmark import evaluate_suite
from metafam.benchmark.runner import load_theta
from metafam.optimizers.registry import get_learned_optimizer


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--optimizer", default="adafac_muon_mlp_lopt", help="a registered learned optimizer")
  p.add_argument("--kwargs", default="{}", help="JSON object of constructor arguments for an ablation, e.g. "
                 "'{\"orthogonal_momentum\": false}'")
  p.add_argument("--checkpoint", default=None, help="a meta-train checkpoint (default: the initial theta)")
  p.add_argument("--step_mult", type=float, default=1e-2, help="the step scale it was meta-trained with")
  p.add_argument("--tune_step", action="store_true", help="tune the step scale per task like a learning rate")
  p.add_argument("--grid_halfwidth", type=int, default=3,
                 help="with --tune_step: the grid reaches this many half-decades either side of --step_mult")
  p.add_argument("--schedules", nargs="+", default=["constant"], choices=["constant", "warmup_cosine"],
                 help="with --tune_step: the schedules tried per task, as for the baselines")
  p.add_argument("--tasks", nargs="+", default=None, help="a subset of the suite's tasks (default: all)")
  args = p.parse_args()
  lopt = get_learned_optimizer(args.optimizer, **{"step_mult": args.step_mult, **json.loads(args.kwargs)})
  theta = lopt.init(jax.random.key(0)) if args.checkpoint is None else load_theta(args.checkpoint)
  start = time.perf_counter()
  if args.tune_step:
    base = lopt.as_optax(theta)

    def scaled(learning_rate):  # the learned update times rate / step_mult (a schedule or a number)
      rate = learning_rate if callable(learning_rate) else (lambda count: learning_rate)
      return optax.chain(base, optax.scale_by_schedule(lambda count: rate(count) / args.step_mult))

    scaled.__name__ = f"{args.optimizer}_tuned_step"
    grid = args.step_mult * 10 ** (0.5 * np.arange(-args.grid_halfwidth, args.grid_halfwidth + 1))
    evaluation = evaluate_suite(scaled, tasks=args.tasks, learning_rates=grid, schedules=args.schedules)
  else:
    evaluation = evaluate_suite((lopt, theta), tasks=args.tasks)
  wall = time.perf_counter() - start
  for key, a in evaluation.aggregates.items():
    print(f"{key}: {a.value:.2f} [{a.low:.2f}, {a.high:.2f}]")
  ratios = [s.loss_ratio for s in evaluation.scores]
  print(f"final loss below tuned Adam's on {sum(r < 1 for r in ratios)} / {len(ratios)} tasks, above 1.5x on "
        f"{sum(r > 1.5 for r in ratios)}; diverged on {sum(bool(s.diverged) for s in evaluation.scores)}; "
        f"{wall:.0f} s")


if __name__ == "__main__":
  main()
