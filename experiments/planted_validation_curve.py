"""The meta-validation curve of a planted run: does the curve show learning where the answer is known?

    python experiments/planted_validation_curve.py [--seeds 3] [--steps 2000] [--eval_every 100] [--out DIR]

The planted step-gain problem of `docs/guide/planted.md` (`tests/benchmark/test_planted.py`): `muon_residual_lopt` with
the generalist_v2 recipe's estimator settings (NRES, 4 antithetic pairs, truncations of 20, trajectories log-uniform in
200-2,000, sigma 0.01, Adam at 3e-3 with its warmup-cosine decay, residual frozen, no clip), its step gain planted
``--factor`` times below Muon's best constant rate on an 8x8 matrix-quadratic family. Each seed meta-trains with
`metafam.runs.MetaValidation` as the loop's ``evaluate`` every ``--eval_every`` meta-steps: the same
``--eval_tasks`` held-out instances trained ``--eval_steps`` steps from initialization at every check, so the checks
of one run differ only by theta. The script prints, per check, the ``--measure`` (default ``mean``: the normalized
loss averaged along the ``--eval_steps`` inner steps, what the estimator's average-loss meta-objective follows;
``final``: the loss at the horizon, which for Muon's fixed-size orthogonalized steps is a noise floor that a smaller
rate lowers) averaged over seeds with its standard deviation over seeds, and whether the last check is below the first by more than that
spread (the issue's criterion for a curve that learns), and writes ``curve.json`` and ``curve.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np
import optax

from metafam.benchmark import planted
from metafam.io import atomic_write
from metafam.outer_trainers import MetaTrainer
from metafam.runs import MetaValidation, train
from metafam.outer_trainers.meta_trainer import meta_optimizer
from metafam.runs.recipes import load_recipe

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE_PATH = os.path.join(HERE, "generalist_v2", "recipe_c.json")
BEST_RATE = 0.313  # Muon's best constant rate on the 8x8 family, by the rate sweep of docs/guide/planted.md


def build(step_mult: float, num_steps: int):
  """The planted run's learned optimizer, family and trainer (as `tests/benchmark/test_planted.py` builds them)."""
  recipe = load_recipe(RECIPE_PATH).replace(step_mult=float(step_mult))
  family = planted.MatrixQuadraticFamily((8, 8))
  lopt = recipe.build_learned_optimizer()
  meta_opt = optax.multi_transform({"train": meta_optimizer(recipe.meta_learning_rate, num_steps),
                                    "freeze": optax.set_to_zero()},
                                   {"mlp": "freeze", "log_gain": "train", "shape_power": "train"})
  trainer = MetaTrainer(lopt, recipe.build_estimators(lopt, families=[family]), meta_opt)
  return lopt, family, trainer


def write_curve(out, result, steps, values, *, ylabel, title, band=None, references=(), yscale="linear"):
  """Writes ``result`` to ``out/curve.json`` and, with matplotlib, ``out/curve.png``: each seed's curve
  (``values[seed]`` at ``steps``), their mean, an optional +- ``band`` around it and horizontal ``references``
  ``(value, linestyle, colour, label)``. Shared by the planted curves' scripts."""
  atomic_write(os.path.join(out, "curve.json"), (json.dumps(result, indent=2) + "\n").encode())
  try:
    from matplotlib.figure import Figure
  except ImportError:
    print("matplotlib is not installed: no curve.png (pip install 'metafam[plot]')")
    return
  from metafam.io import save_figure
  mean = np.mean(values, axis=0)
  fig = Figure(figsize=(6.5, 4))
  ax = fig.subplots()
  for row in values:
    ax.plot(steps, row, lw=0.8, alpha=0.5, color="C0")
  ax.plot(steps, mean, "o-", ms=3, lw=2, color="C0", label=f"mean of {len(values)} seeds")
  if band is not None:
    ax.fill_between(steps, mean - band, mean + band, color="C0", alpha=0.15, lw=0, label="+- 1 sd over seeds")
  for value, style, colour, label in references:
    ax.axhline(value, color=colour, ls=style, label=label)
  ax.set(xlabel="meta-step", ylabel=ylabel, title=title, yscale=yscale)
  ax.legend(fontsize=8)
  save_figure(fig, os.path.join(out, "curve.png"))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seeds", type=int, default=3, help="independent runs (their spread is the criterion's yardstick)")
  p.add_argument("--steps", type=int, default=2000, help="meta-steps per run")
  p.add_argument("--eval_every", type=int, default=100, help="meta-steps between meta-validation checks")
  p.add_argument("--eval_tasks", type=int, default=16, help="held-out instances per check")
  p.add_argument("--eval_steps", type=int, default=200, help="inner steps per held-out instance (the horizon)")
  p.add_argument("--factor", type=float, default=4.0, help="how many times below the best rate the gain starts")
  p.add_argument("--measure", choices=("mean", "final"), default="mean",
                 help="the validation number: the loss averaged along the inner steps, or at the horizon")
  p.add_argument("--out", default=None, help="write curve.json and curve.png here")
  args = p.parse_args(argv)
  for name in ("seeds", "steps", "eval_every", "eval_tasks", "eval_steps"):
    if getattr(args, name) < 1:
      p.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
  if not np.isfinite(args.factor) or args.factor <= 0:
    p.error(f"--factor must be a positive number, got {args.factor}")
  if args.steps % args.eval_every:
    p.error(f"--steps ({args.steps}) must be a multiple of --eval_every ({args.eval_every}), so that every run "
            "ends on a check")
  start = BEST_RATE / args.factor
  curves, gains, t0 = [], [], time.perf_counter()
  # One trainer and one validation for every seed: the seeds share the compiled programs and differ only by key.
  lopt, family, trainer = build(start, args.steps)
  validation = MetaValidation(lopt, [family], num_tasks=args.eval_tasks, num_steps=args.eval_steps)
  for seed in range(args.seeds):
    first = validation(trainer.initial_theta(jax.random.key(seed)))  # the check at meta-step 0
    state, history = train(trainer, args.steps, key=jax.random.key(seed), evaluate=validation,
                           eval_every=args.eval_every, progress=False, max_skipped_steps=None)
    key = f"eval_{args.measure}_loss"
    checks = [(0, first[key])] + [(h["step"], h[key]) for h in history if key in h]
    curves.append(checks)
    gains.append(start * float(np.exp(planted.matrix_log_gain(lopt, state.theta, (8, 8)))))
    print(f"seed {seed}: validation loss ({args.measure}) {checks[0][1]:.4g} -> {checks[-1][1]:.4g}; step gain {start:.3f} -> "
          f"{gains[-1]:.3f} (best constant rate {BEST_RATE}); {time.perf_counter() - t0:.0f} s", flush=True)
  steps = [s for s, _ in curves[0]]
  values = np.asarray([[v for _, v in c] for c in curves])  # [seeds, checks]
  mean, sd = values.mean(axis=0), values.std(axis=0, ddof=1) if args.seeds > 1 else np.zeros(len(steps))
  print(f"\n| meta-step | validation loss ({args.measure}), mean over seeds | sd over seeds |\n|---|---|---|")
  for s, m, d in zip(steps, mean, sd):
    print(f"| {s} | {m:.4g} | {d:.2g} |")
  drop, spread = mean[0] - mean[-1], float(max(sd[0], sd[-1]))
  learns = bool(drop > spread)
  print(f"\nlast below first by {drop:.4g}; the larger seed spread of the two checks is {spread:.2g}: "
        f"{'the curve goes down by more than its spread' if learns else 'not beyond the spread'}. "
        f"{args.seeds} seeds, {time.perf_counter() - t0:.0f} s.")
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    result = {"steps": steps, "per_seed": values.tolist(), "mean": mean.tolist(), "sd_over_seeds": sd.tolist(),
              "drop": float(drop), "spread": spread, "learns": learns, "final_gains": gains, "start_gain": start,
              "best_rate": BEST_RATE, "settings": vars(args)}
    what = "along" if args.measure == "mean" else "after"
    write_curve(args.out, result, steps, values, band=sd, yscale="log",
                ylabel=f"normalized loss {what} {args.eval_steps} inner steps (same instances)",
                title=f"meta-validation: planted step gain, started {args.factor:g}x too small")
  return 0


if __name__ == "__main__":
  sys.exit(main())
