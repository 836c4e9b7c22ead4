"""The meta-validation curve of the planted annealing schedule (docs/guide/planted.md, problem 5).

    python experiments/planted_schedule_curve.py [--seeds 3] [--steps 300] [--eval_every 25] [--out DIR]

generalist_v3's estimator (`experiments/generalist_v3/recipe_a.json`: FullES over complete trajectories, the loss
over their last 10%, its pairs, sigma, meta-learning rate and lr_spread; trajectories of ``--horizon``) meta-trains
the two knots of a schedule from the flat start (the best constant rate) on `planted.schedule_problem`'s noisy
quadratic, once per seed. Every ``--eval_every`` meta-steps the theta is scored on the same ``--eval_tasks``
held-out instances (the objective the estimator follows, on instances it never trains), so the checks of a run differ
only by theta; the sweep's best schedule and the flat start are scored on them too. Prints the curve (mean and
standard deviation over seeds), whether its last check is below the first by more than that spread, and the
fraction of the flat-to-best gap closed; writes ``curve.json`` and ``curve.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np
import optax

from metafam.benchmark import planted
from metafam.outer_trainers import MetaTrainer
from metafam.outer_trainers.meta_trainer import meta_optimizer
from metafam.runs.recipes import load_recipe
from planted_validation_curve import write_curve  # experiments/, on the path when run as a script

RECIPE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generalist_v3", "recipe_a.json")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seeds", type=int, default=3, help="independent runs (their spread is the criterion's yardstick)")
  p.add_argument("--steps", type=int, default=300, help="meta-steps per run")
  p.add_argument("--eval_every", type=int, default=25, help="meta-steps between checks")
  p.add_argument("--eval_tasks", type=int, default=32, help="held-out instances per check")
  p.add_argument("--horizon", type=int, default=200, help="inner steps per trajectory (training and checks)")
  p.add_argument("--out", default=None, help="write curve.json and curve.png here")
  args = p.parse_args(argv)
  for name in ("seeds", "steps", "eval_every", "eval_tasks", "horizon"):
    if getattr(args, name) < 1:
      p.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
  if args.steps % args.eval_every:
    p.error(f"--steps ({args.steps}) must be a multiple of --eval_every ({args.eval_every})")
  t0 = time.perf_counter()
  recipe = load_recipe(RECIPE_PATH)
  recipe = recipe.replace(trajectory_lengths=(args.horizon, args.horizon))
  problem = planted.schedule_problem(recipe, horizon=args.horizon)
  lopt, initial = problem.learned_opt, problem.learned_opt.init(jax.random.key(0))
  print(f"known answer: best constant rate {problem.best_constant_rate:.4f}; best (start, end) knots "
        f"{tuple(np.round(problem.best_knots, 2))} of {len(problem.knots)} swept ({time.perf_counter() - t0:.0f} s)")
  meta_opt = optax.multi_transform(
      {"train": meta_optimizer(recipe.meta_learning_rate, args.steps), "freeze": optax.set_to_zero()},
      {"log_gain": "freeze", "log_schedule": "train"})
  trainer = MetaTrainer(lopt, recipe.build_estimators(lopt, families=[problem.family]), meta_opt,
                        clip_grad_norm=recipe.clip_grad_norm or None)
  checks = list(range(0, args.steps + 1, args.eval_every))
  held_out = jax.random.key(12345)
  reference = problem.score(planted.with_schedules(initial, [np.zeros(2), problem.best_knots]), held_out,
                            args.eval_tasks).mean(axis=1)
  curves, knots_by_seed = [], []
  for seed in range(args.seeds):
    _, knots = planted.run_recorded(trainer, trainer.init(jax.random.key(seed)), args.steps,
                                    lambda s, m: s.theta["log_schedule"])
    path = np.concatenate([np.zeros((1, 2)), np.asarray(knots, np.float64)])[checks]
    curves.append(problem.score(planted.with_schedules(initial, path), held_out, args.eval_tasks).mean(axis=1))
    knots_by_seed.append(path[-1].tolist())
    print(f"seed {seed}: objective {curves[-1][0]:.4f} -> {curves[-1][-1]:.4f}; knots -> "
          f"{tuple(np.round(path[-1], 2))}; {time.perf_counter() - t0:.0f} s", flush=True)
  values = np.asarray(curves)
  mean, sd = values.mean(axis=0), values.std(axis=0, ddof=1) if args.seeds > 1 else np.zeros(len(checks))
  print("\n| meta-step | held-out objective, mean over seeds | sd over seeds |\n|---|---|---|")
  for s, m, d in zip(checks, mean, sd):
    print(f"| {s} | {m:.4f} | {d:.2g} |")
  drop, spread = float(mean[0] - mean[-1]), float(max(sd[0], sd[-1]))
  closed = float((reference[0] - mean[-1]) / (reference[0] - reference[1]))
  print(f"\nflat start {reference[0]:.4f}, sweep's best {reference[1]:.4f}; last check {mean[-1]:.4f}: "
        f"{100 * closed:.0f}% of the gap closed; the drop {drop:.4f} is {drop / spread if spread else float('inf'):.1f}"
        f" times the seeds' spread. {args.seeds} seeds, {time.perf_counter() - t0:.0f} s.")
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    result = {"steps": checks, "per_seed": values.tolist(), "mean": mean.tolist(), "sd_over_seeds": sd.tolist(),
              "drop": drop, "spread": spread, "gap_closed": closed, "flat": float(reference[0]),
              "sweep_best": float(reference[1]), "sweep_best_knots": problem.best_knots.tolist(),
              "best_constant_rate": problem.best_constant_rate, "final_knots": knots_by_seed,
              "settings": vars(args)}
    write_curve(args.out, result, checks, values,
                references=[(reference[0], ":", "C3", "flat start (best constant rate)"),
                            (reference[1], "--", "C2", "best schedule of the sweep")],
                ylabel=f"loss over the last 10% of {args.horizon} steps (held-out instances)",
                title="meta-validation: planted annealing schedule from a flat start")
  return 0


if __name__ == "__main__":
  sys.exit(main())
