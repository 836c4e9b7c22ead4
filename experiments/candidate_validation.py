"""A meta-training run's meta-validation curve, anchored at its initial theta and checked over validation seeds.

    python experiments/candidate_validation.py --run_dir /work/runs/generalist_v2_candidate_d \
        --recipe experiments/generalist_v2/recipe_d.json --eval_tasks 16 --eval_steps 500 --out DIR

A run started with ``--eval_every`` records the meta-validation curve (`metafam.runs.MetaValidation`: the
same held-out instances of every family of the recipe, trained ``--eval_steps`` steps from initialization) in its
``metrics.jsonl``, but the loop's first check comes after ``eval_every`` meta-steps. This script adds what the curve
needs to decide whether the run learned:

  * the initial theta's point, with the run's own settings (seed `validation.DEFAULT_SEED`), as step 0;
  * the spread of the measure: the initial and the run's current theta (its ``checkpoint.npz``) scored on
    ``--seeds`` further validation seeds (each a different set of instances and batches), so the drop from first to
    last can be compared with how much the measure moves between instance sets, and paired per seed.

``--measure`` picks the curve: ``mean`` (the normalized loss averaged along the inner steps, what the average-loss
meta-objective follows) or ``final`` (the loss at the horizon). It prints the curve and, per seed, the initial and
trained values and their difference, and writes ``validation.json`` and ``validation.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np

from metafam.benchmark.runner import load_theta
from metafam.io import atomic_write
from metafam.runs import MetaValidation
from metafam.runs.recipes import load_recipe
from metafam.runs.validation import DEFAULT_SEED

KEYS = {"mean": "eval_mean_loss", "final": "eval_final_loss"}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--run_dir", required=True, help="the run's directory (metrics.jsonl, checkpoint.npz)")
  p.add_argument("--recipe", required=True, help="the run's recipe (a shipped name or a JSON file)")
  p.add_argument("--eval_tasks", type=int, default=16, help="the run's --eval_tasks")
  p.add_argument("--eval_steps", type=int, default=200, help="the run's --eval_steps")
  p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="further validation seeds")
  p.add_argument("--measure", choices=sorted(KEYS), default="mean")
  p.add_argument("--out", default=None, help="write validation.json and validation.png here")
  args = p.parse_args()
  metrics = os.path.join(args.run_dir, "metrics.jsonl")
  checkpoint = os.path.join(args.run_dir, "checkpoint.npz")
  for path in (metrics, checkpoint):
    if not os.path.isfile(path):
      p.error(f"--run_dir: no {os.path.basename(path)} in {args.run_dir!r}")
  try:
    recipe = load_recipe(args.recipe)
  except ValueError as e:
    p.error(f"--recipe: {e}")
  key = KEYS[args.measure]
  with open(metrics, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  curve = [(int(r["step"]), float(r[key])) for r in rows if key in r]
  if not curve:
    p.error(f"--run_dir: {metrics} holds no meta-validation checks (was the run started with --eval_every?)")
  built_families = [spec.build() for spec in recipe.families]
  lopt = recipe.build_learned_optimizer()
  initial, trained = lopt.init(jax.random.key(0)), load_theta(checkpoint)

  validations = {}  # one per seed, shared by the initial and the trained theta (its programs compile once)

  def score(theta, seed):
    if seed not in validations:
      validations[seed] = MetaValidation(lopt, built_families, num_tasks=args.eval_tasks, num_steps=args.eval_steps,
                                         seed=seed)
    return validations[seed](theta)

  start = score(initial, DEFAULT_SEED)
  curve = [(0, start[key])] + curve
  print(f"meta-validation curve ({args.measure} normalized outer_valid loss, {args.eval_tasks} instances per family, "
        f"{args.eval_steps} steps, seed {DEFAULT_SEED}; step 0 is the initial theta):")
  for step, value in curve:
    print(f"  {step:6d}  {value:.4f}")
  per_seed = []
  for seed in [DEFAULT_SEED] + list(args.seeds):
    a = start if seed == DEFAULT_SEED else score(initial, seed)
    b = score(trained, seed)
    per_seed.append({"seed": seed, "initial": a, "trained": b})
    print(f"seed {seed:6d}: initial {a[key]:.4f}  trained {b[key]:.4f}  difference {b[key] - a[key]:+.4f}")
  initial_values = np.asarray([r["initial"][key] for r in per_seed])
  diffs = np.asarray([r["trained"][key] - r["initial"][key] for r in per_seed])
  spread = float(np.std(initial_values, ddof=1))
  drop = curve[0][1] - curve[-1][1]
  print(f"drop from first to last check: {drop:.4f}; spread of the measure over the {len(per_seed)} validation seeds "
        f"(sd of the initial theta's value): {spread:.4f}; paired differences over seeds: mean {diffs.mean():+.4f}, "
        f"sd {diffs.std(ddof=1):.4f}; the curve {'goes down' if drop > spread else 'does not go down'} by more "
        "than the spread")
  families = sorted({k.split("/")[1] for k in start if k.startswith("eval/")})
  for name in families:
    fam = f"eval/{name}/{'mean_loss' if args.measure == 'mean' else 'final_loss'}"
    d = np.asarray([r["trained"][fam] - r["initial"][fam] for r in per_seed])
    print(f"  {name}: trained - initial {d.mean():+.4f} (sd over seeds {d.std(ddof=1):.4f})")
  if not args.out:
    return
  os.makedirs(args.out, exist_ok=True)
  result = {"measure": args.measure, "eval_tasks": args.eval_tasks, "eval_steps": args.eval_steps,
            "curve": curve, "per_seed": per_seed, "drop": drop, "spread_over_seeds": spread,
            "checkpoint_step": curve[-1][0]}
  atomic_write(os.path.join(args.out, "validation.json"), (json.dumps(result, indent=2) + "\n").encode())
  try:
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
  except ImportError:
    print("matplotlib is not installed: no validation.png (pip install 'metafam[plot]')")
    return
  fig = Figure(figsize=(6.4, 4.0))
  ax = fig.subplots()
  steps, values = zip(*curve)
  ax.plot(steps, values, "o-", ms=3, color="C0", label=f"validation seed {DEFAULT_SEED}")
  ax.axhspan(values[0] - spread, values[0] + spread, color="C0", alpha=0.15,
             label=f"initial value +- sd over {len(per_seed)} seeds")
  ax.set_xlabel("meta-step")
  ax.set_ylabel(f"{args.measure} normalized outer_valid loss")
  ax.set_title(f"{recipe.name}: meta-validation")
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "validation.png"), dpi=120)
  print(f"wrote {args.out}/validation.json, validation.png")


if __name__ == "__main__":
  main()
