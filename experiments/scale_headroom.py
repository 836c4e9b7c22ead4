"""What a learned optimizer's few meta-parameters could gain on a set of families: named theta points, paired.

    python experiments/scale_headroom.py --recipe experiments/generalist_v3/recipe_b.json \
        --point a=experiments/generalist_v3/theta_a_step300.npz --point "other-=log_gain[1]=-0.35" \
        --eval_tasks 8 --eval_steps 1000 --seeds 12345 1 --out DIR

A meta-gradient estimate says which way to move theta; this script answers the question before it: at the scale of
a recipe's families, is there anything to move towards? Every point is a theta of the recipe's learned optimizer:
its initial theta (always scored, the reference), a theta file (``NAME=PATH.npz``), or the initial theta with some
entries set (``NAME=LEAF[I]=VALUE[,LEAF[I]=VALUE...]``, e.g. ``log_gain[1]=-0.35``); a file's point may also set
entries (``NAME=PATH.npz,LEAF[I]=VALUE``). Each point is trained from the same held-out instances
(`metafam.runs.MetaValidation`: ``--eval_tasks`` instances per family, ``--eval_steps`` steps, the loss on
``outer_valid``) for every validation seed, and the difference from the initial theta is paired per seed and family:
the spread between seeds (different instances and batches) is much larger than the differences between nearby
thetas, so only paired differences can see them.

It prints, per point, the mean over seeds of ``point - initial`` in the final normalized loss (``--measure final``, the
loss at the horizon) per family and averaged over families, with the standard deviation over seeds, and writes
``headroom.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from metafam.benchmark.runner import fit_theta, load_theta
from metafam.io import atomic_write
from metafam.runs import MetaValidation
from metafam.runs.checkpoint import CheckpointError
from metafam.runs.recipes import load_recipe
from metafam.runs.validation import DEFAULT_SEED

KEYS = {"mean": "mean_loss", "final": "final_loss"}
_SETTING = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\[(\d+)\]=(.+)$")


def parse_point(text: str, lopt, initial, error):
  """``NAME=SPEC`` -> (NAME, theta); SPEC is a comma-separated list: an optional theta file first, then
  ``LEAF[I]=VALUE`` settings (``I`` indexes the leaf's entries in row-major order)."""
  name, sep, spec = text.partition("=")
  if not sep or not name or not spec:
    error(f"--point: expected NAME=PATH.npz or NAME=LEAF[I]=VALUE[,...], got {text!r}")
  theta = initial
  for position, part in enumerate(spec.split(",")):
    match = _SETTING.match(part)
    if match is None:
      if not part.endswith(".npz") or not os.path.isfile(part):
        error(f"--point {name}: {part!r} is neither a theta file (.npz) nor a setting LEAF[I]=VALUE")
      if position:
        error(f"--point {name}: the theta file {part} must come first (it would replace the settings before it)")
      try:
        theta = fit_theta(lopt, load_theta(part))
      except (CheckpointError, ValueError) as e:
        error(f"--point {name}: {part} is not a theta of the recipe's learned optimizer: {e}")
      continue
    leaf, index, value = match.group(1), int(match.group(2)), match.group(3)
    if not isinstance(theta, dict) or leaf not in theta:
      error(f"--point {name}: theta has no entry {leaf!r}; it has {sorted(theta) if isinstance(theta, dict) else []}")
    try:
      number = float(value)
    except ValueError:
      error(f"--point {name}: {value!r} is not a number")
    if not np.isfinite(number):
      error(f"--point {name}: {leaf}[{index}] must be finite, got {value!r}")
    entries = jnp.asarray(theta[leaf])
    if not 0 <= index < entries.size:
      error(f"--point {name}: {leaf} has {entries.size} entries, index {index} is out of range")
    theta = dict(theta)
    theta[leaf] = entries.reshape(-1).at[index].set(number).reshape(entries.shape)
  return name, theta


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--recipe", required=True, help="its families and learned optimizer (a shipped name or a JSON file)")
  p.add_argument("--point", action="append", default=[], help="NAME=PATH.npz or NAME=LEAF[I]=VALUE[,...] (repeat)")
  p.add_argument("--eval_tasks", type=int, default=8, help="held-out instances per family")
  p.add_argument("--eval_steps", type=int, default=1000, help="inner steps per instance (the horizon)")
  p.add_argument("--seeds", type=int, nargs="+", default=[DEFAULT_SEED, 1], help="validation seeds")
  p.add_argument("--measure", choices=sorted(KEYS), default="final")
  p.add_argument("--out", default=None, help="write headroom.json here")
  args = p.parse_args()
  if not args.point:
    p.error("--point: give at least one theta point to compare with the initial theta")
  if args.eval_tasks < 1 or args.eval_steps < 1:
    p.error("--eval_tasks and --eval_steps must be positive")
  if len(set(args.seeds)) < 2:
    p.error("--seeds: give at least two different seeds (the spread over seeds is part of the answer)")
  try:
    recipe = load_recipe(args.recipe)
  except ValueError as e:
    p.error(f"--recipe: {e}")
  lopt = recipe.build_learned_optimizer()
  initial = lopt.init(jax.random.key(0))
  points = dict([("initial", initial)] + [parse_point(text, lopt, initial, p.error) for text in args.point])
  families = [spec.build() for spec in recipe.families]

  scores = {name: {} for name in points}  # point -> seed -> {family: value}
  for seed in args.seeds:
    validation = MetaValidation(lopt, families, num_tasks=args.eval_tasks, num_steps=args.eval_steps, seed=seed)
    for name, theta in points.items():
      start = time.perf_counter()
      result = validation(theta)
      scores[name][seed] = {k.split("/")[1]: float(v) for k, v in result.items()
                            if k.startswith("eval/") and k.endswith("/" + KEYS[args.measure])}
      print(f"seed {seed}, {name}: {np.mean(list(scores[name][seed].values())):.4f} "
            f"({time.perf_counter() - start:.0f} s)", flush=True)

  names = sorted(scores["initial"][args.seeds[0]])
  print(f"\n{args.measure} normalized outer_valid loss, point - initial, mean (sd) over {len(args.seeds)} seeds; "
        f"{args.eval_tasks} instances per family, {args.eval_steps} steps")
  print(f"{'point':24s} {'all families':>18s}  " + "  ".join(f"{n:>28s}" for n in names))
  table = {}
  for name in points:
    diffs = np.asarray([[scores[name][s][n] - scores["initial"][s][n] for n in names] for s in args.seeds])
    overall = diffs.mean(axis=1)
    row = {"all": (float(overall.mean()), float(overall.std(ddof=1)))}
    row.update({n: (float(diffs[:, i].mean()), float(diffs[:, i].std(ddof=1))) for i, n in enumerate(names)})
    table[name] = row
    cells = [f"{m:+.4f} ({s:.4f})" for m, s in row.values()]
    print(f"{name:24s} {cells[0]:>18s}  " + "  ".join(f"{c:>28s}" for c in cells[1:]))
  initial_all = np.asarray([np.mean(list(scores["initial"][s].values())) for s in args.seeds])
  print(f"initial theta: {initial_all.mean():.4f}, sd over seeds {initial_all.std(ddof=1):.4f}")
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    result = {"recipe": recipe.name, "measure": args.measure, "eval_tasks": args.eval_tasks,
              "eval_steps": args.eval_steps, "seeds": args.seeds, "points": args.point,
              "scores": {n: {str(s): v for s, v in per.items()} for n, per in scores.items()}, "paired": table}
    atomic_write(os.path.join(args.out, "headroom.json"), (json.dumps(result, indent=2) + "\n").encode())
    print(f"wrote {args.out}/headroom.json")


if __name__ == "__main__":
  main()
