"""A pretrained optimizer far past its meta-training horizon: does it stay stable?

    python experiments/long_horizon.py [--name generalist_v1] [--steps 20000] [--tasks mnist_mlp_16x16_64_b32 ...]

Trains each heldout task for ``--steps`` inner steps (default 10x the recipe's longest trajectory) with the
pretrained optimizer at a constant learning rate (default: the rate tuned for that task in the heldout evaluation,
passed as ``--learning_rate``, else the entry's default) and with Adam at its shipped tuned rate, 2 seeds each, and
prints the test loss at 10 points along the way. Diverged: a non-finite loss, or a final loss above the initial one.
"""
import argparse
import time

import numpy as np
import optax

import metafam.pretrained as pretrained
from metafam.benchmark.heldout import load_normalizers
from metafam.benchmark.sweep import train_lanes
from metafam.runs.recipes import load_recipe
from metafam.tasks.registry import get_task


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--name", default="generalist_v1")
  p.add_argument("--steps", type=int, default=None, help="default: 10x the recipe's longest trajectory")
  p.add_argument("--learning_rate", type=float, default=None)
  p.add_argument("--tasks", nargs="+", default=["mnist_mlp_16x16_64_b32", "fmnist_conv_16x16_8x16_b32"])
  args = p.parse_args()
  entry = pretrained.info(args.name)
  steps = args.steps or 10 * load_recipe(entry.recipe).trajectory_lengths[1]
  rate = args.learning_rate or entry.default_learning_rate
  data = load_normalizers()
  points = np.linspace(0, steps, 11).astype(np.int64)
  for task_name in args.tasks:
    task = get_task(task_name)
    adam_lr = data["tasks"][task_name]["reference"]["learning_rate"]
    for label, tx in [(f"{args.name} lr={rate:g}", pretrained.optax_transform(args.name, rate, num_steps=steps)),
                      (f"adam lr={adam_lr:g}", optax.adam(adam_lr))]:
      start = time.perf_counter()
      _, evals = train_lanes(task, tx, None, num_seeds=2, points=points, eval_batches=4, key=None, splits=("test",))
      curve = np.asarray(evals["test"])[0].mean(axis=0)
      diverged = not np.all(np.isfinite(curve)) or curve[-1] > curve[0]
      print(f"{task_name} {label}: test loss at {[int(p) for p in points]}: {np.round(curve, 4).tolist()}; "
            f"{'DIVERGED' if diverged else 'stable'} ({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
  main()
