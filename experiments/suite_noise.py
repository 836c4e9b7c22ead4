"""The evaluation noise of a suite's scores: how much a point of a test curve moves with the batches it averages.

    python experiments/suite_noise.py --suite test [--tasks a,b] [--steps N]

Per task: Adam (rate 1e-3, constant) trains one seed for the task's horizon (or ``--steps``) steps, then the trained model's loss is computed
example by example on the whole ``test`` split. A suite point averages ``eval_batches * batch_size`` examples drawn
with replacement, so its standard error is ``sd(per-example loss) / sqrt(examples)``; the table gives it raw and
relative to the mean loss, next to the loss itself, and the seconds of one evaluation of the whole split. Candidate and
baselines see the same examples at the same (seed, step), so what a comparison sees is the noise of the *difference*:
a second model, Adam at rate 3e-3 from the same initialization and batches, gives the paired standard error
``sd(loss_a - loss_b) / sqrt(examples)``, next to the difference of the two mean losses it has to resolve. The
second run (same program, compiled already) also gives the wall time of one single-seed run of the horizon.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam.benchmark import baseline_files as bf
from metafam.tasks.registry import get_task


def per_example_losses(task, params, arrays, batch_size):
  """``f64[N]``: the loss of every example of a split (in batches of one example each, vmapped)."""
  def one(example):
    batch = jax.tree.map(lambda x: x[None], example)
    return task.loss(params, jax.random.key(0), batch)
  fn = jax.jit(jax.vmap(one))
  n = jax.tree.leaves(arrays)[0].shape[0]
  out = [fn(jax.tree.map(lambda x: x[i:i + 1024], arrays)) for i in range(0, n, 1024)]
  return np.concatenate([np.asarray(o, np.float64) for o in out])


def measure(name: str, steps, suite: str):
  task = get_task(name)
  spec = bf.suite_spec(suite)
  steps = steps or spec.horizons[name]
  train = task.datasets.device_data("train")
  init = task.init(jax.random.key(0))

  @jax.jit
  def run(params, key, lr):
    opt = optax.adam(lr)

    def body(carry, k):
      p, s = carry
      kb, kl = jax.random.split(k)
      g = jax.grad(task.loss)(p, kl, train.sample(kb))
      u, s = opt.update(g, s, p)
      return (optax.apply_updates(p, u), s), None
    (p, _), _ = jax.lax.scan(body, (params, opt.init(params)), jax.random.split(key, steps))
    return p

  test = task.datasets.device_data("test")
  start = time.perf_counter()
  losses = per_example_losses(task, run(init, jax.random.key(1), 1e-3), test.arrays, test.batch_size)
  seconds = time.perf_counter() - start
  start = time.perf_counter()
  trained = jax.block_until_ready(run(init, jax.random.key(1), 3e-3))
  run_seconds = time.perf_counter() - start
  other = per_example_losses(task, trained, test.arrays, test.batch_size)
  examples = spec.eval_batches(task) * test.batch_size
  se = losses.std(ddof=1) / np.sqrt(examples)
  paired_se = (losses - other).std(ddof=1) / np.sqrt(examples)
  diff = float(abs(losses.mean() - other.mean()))
  return steps, losses.size, float(losses.mean()), examples, float(se), float(paired_se), diff, seconds, run_seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--suite", default="test", choices=sorted(bf.SUITE_SPECS))
  parser.add_argument("--tasks", default="", help="comma-separated task names (default: the whole suite)")
  parser.add_argument("--steps", type=int, default=None, help="Adam steps before measuring (default: the horizon)")
  args = parser.parse_args()
  if args.steps is not None and args.steps < 1:
    parser.error(f"--steps must be a positive integer, got {args.steps}")
  names = [t for t in args.tasks.split(",") if t] or list(bf.suite_spec(args.suite).horizons)
  print("| task | Adam steps | one run (s) | test examples | mean test loss | examples per point | standard error "
        "| relative | paired standard error | loss difference to resolve | whole-split eval (s) |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for name in names:
    steps, n, mean, examples, se, paired_se, diff, seconds, run_seconds = measure(name, args.steps, args.suite)
    print(f"| {name} | {steps:,} | {run_seconds:.1f} | {n:,} | {mean:.4g} | {examples:,} | {se:.2g} | {se / mean:.2%} "
          f"| {paired_se:.2g} | {diff:.2g} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
  main()
