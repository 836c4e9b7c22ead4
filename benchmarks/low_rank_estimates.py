"""Low-rank ES perturbations against full Gaussian noise at the same sigma: per-estimate variance and memory.

    python benchmarks/low_rank_estimates.py
    python benchmarks/low_rank_estimates.py --ranks 1 4 --samples 64 --lopt adafac_muon_mlp_lopt

1. Variance on `outer_training.py`'s workload (8x8 image-MLP family, batch 128, the learned optimizer ``--lopt``,
   PES with 8 pairs, 10 inner steps per estimate within trajectories of 50, sigma 0.01): ``--samples`` estimates
   from one theta and one fresh worker state (staggered lanes, empty accumulators), each with its own key;
   "variance" is the summed per-coordinate variance of an estimate over those keys (the trace of its covariance),
   per noise kind, and its ratio to full noise's; "cos to full mean" is the cosine between the mean estimate of that
   noise kind and that of full noise (both estimate the same smoothed gradient of the first truncation; after
   ``--warmup`` estimates the accumulators would differ between the runs, and so would the means).
2. Exactness on a deterministic learned-optimizer unroll (a small MLPLOpt, 74 meta-parameters, on a fixed quadratic,
   4 inner steps; the workload of tests/optimizers/test_low_rank.py): FullES over ``--pairs_exact`` pairs against
   ``jax.grad`` through the unroll: the mean estimate's projection on the exact gradient (1 when unbiased), its cosine
   with it, and the per-pair variance of the projection.
3. Memory: XLA's memory analysis of the compiled estimate (PES at 8 and 64 pairs, FullES at 8 pairs): temporaries
   and arguments (the worker state: PES keeps the current perturbations as factors, its accumulator dense).
``--smoke`` runs every code path on a tiny workload (4 hidden units, batches of 8, 2 pairs, truncations of 2 steps in
trajectories of 4, 2 samples, 8 exactness pairs, rank 1); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import bench_common  # benchmarks/ is on sys.path when this runs as a script
from metafam.inner import ConstantSchedule
from metafam.optimizers import get_learned_optimizer
from metafam.optimizers.mlp_lopt import MLPLOpt
from metafam.outer_trainers import make_estimator
from metafam.taskfamilies.base import single_task_to_family
from metafam.tasks.base import Task


@dataclasses.dataclass(frozen=True)
class Workload:
  """PES with ``pairs`` pairs and ``unroll`` steps per estimate in trajectories of ``trajectory`` (tables 1 and 3);
  FullES over ``full_es_trajectory`` steps and the pair counts ``memory_pairs`` (table 3); exactness estimates in
  calls of ``pairs_per_call`` pairs (table 2)."""
  pairs: int = 8
  unroll: int = 10
  trajectory: int = 50
  full_es_trajectory: int = 200
  memory_pairs: tuple = (8, 64)
  pairs_per_call: int = 8192


SMOKE = Workload(pairs=2, unroll=2, trajectory=4, full_es_trajectory=4, memory_pairs=(2,), pairs_per_call=8)


def noise_kinds(ranks):
  return [("full", {})] + [(f"rank {r}", dict(perturbation="low_rank", rank=r)) for r in ranks]


def flat(tree):
  return jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(tree)])


def variance_table(lopt, ranks, samples, warmup, family, work):
  theta = lopt.init(jax.random.key(0))
  estimates = {}
  for label, noise in noise_kinds(ranks):
    est = make_estimator("pes", family, lopt, num_tasks=work.pairs, unroll_length=work.unroll,
                         schedule=ConstantSchedule(work.trajectory), sigma=0.01, **noise)
    ws = est.init_worker_state(theta, jax.random.key(1))
    for j in range(warmup):  # the same warm-up keys for every noise kind: lanes mid-trajectory
      _, ws = est.estimate(theta, ws, jax.random.key(100 + j))
    one = jax.jit(lambda ws, k: flat(est.estimate_fn(theta, ws, k)[0].grad))
    estimates[label] = np.stack([np.asarray(one(ws, jax.random.key(1000 + i)), np.float64) for i in range(samples)])
  full_var = estimates["full"].var(0, ddof=1).sum()
  full_mean = estimates["full"].mean(0)
  print(f"\n1. PES, {lopt.name}, {work.pairs} pairs, sigma 0.01: {samples} estimates from one state, {full_mean.size} "
        f"meta-parameters")
  print(f"{'noise':>8} {'variance':>12} {'vs full':>8} {'|mean|':>10} {'cos to full mean':>17}")
  for label, e in estimates.items():
    var, mean = e.var(0, ddof=1).sum(), e.mean(0)
    cos = mean @ full_mean / (np.linalg.norm(mean) * np.linalg.norm(full_mean))
    print(f"{label:>8} {var:>12.4g} {var / full_var:>7.2f}x {np.linalg.norm(mean):>10.4g} {cos:>17.3f}")


class FixedQuadratic(Task):
  def init(self, key):
    return jnp.asarray([[1.0, -2.0, 0.5], [0.3, 1.5, -1.0]], jnp.float32)

  def loss(self, params, key, batch):
    return 0.5 * jnp.sum(jnp.asarray([[0.5], [2.0]]) * params ** 2)


def exactness_table(ranks, total_pairs, pairs_per_call=8192):
  lopt = MLPLOpt(hidden_sizes=(8,), decays=(0.5, 0.9), time_scales=(3.0, 10.0))
  theta = lopt.init(jax.random.key(0))
  family = single_task_to_family(FixedQuadratic())
  common = dict(loss_kind="meta_loss", meta_loss_split="same_batch", random_initial_iteration=False)
  tbptt = make_estimator("tbptt", family, lopt, num_tasks=1, unroll_length=4, schedule=ConstantSchedule(4), **common)
  exact = np.asarray(flat(tbptt.estimate(theta, tbptt.init_worker_state(theta, jax.random.key(1)),
                                         jax.random.key(2))[0].grad), np.float64)
  calls = max(1, total_pairs // pairs_per_call)
  print(f"\n2. FullES on a deterministic MLPLOpt unroll ({exact.size} meta-parameters), {calls * pairs_per_call:,} "
        f"pairs, sigma 0.01, against jax.grad through the unroll")
  print(f"{'noise':>8} {'projection':>11} {'+-':>7} {'cosine':>8} {'var/pair of projection':>23}")
  for label, noise in noise_kinds(ranks):
    est = make_estimator("full_es", family, lopt, num_tasks=pairs_per_call, trajectory_length=4, sigma=0.01,
                         **noise, **common)
    run = jax.jit(lambda k: flat(est.estimate_fn(theta, {}, k)[0].grad))
    per_call = np.stack([np.asarray(run(k), np.float64) for k in jax.random.split(jax.random.key(7), calls)])
    proj = per_call @ exact / (exact @ exact)
    mean = per_call.mean(0)
    cos = mean @ exact / (np.linalg.norm(mean) * np.linalg.norm(exact))
    stderr = proj.std(ddof=1) / np.sqrt(calls)
    print(f"{label:>8} {proj.mean():>11.4f} {stderr:>7.4f} {cos:>8.5f} {proj.var(ddof=1) * pairs_per_call:>23.3f}")


def memory_table(lopt, ranks, family, work):
  theta = lopt.init(jax.random.key(0))
  print(f"\n3. XLA memory analysis of one compiled estimate, {lopt.name} (MiB)")
  print(f"{'estimate':>16} {'noise':>8} {'temporaries':>12} {'arguments':>10} {'outputs':>8}")
  for name, pairs in [("pes", p) for p in work.memory_pairs] + [("full_es", work.memory_pairs[0])]:
    for label, noise in noise_kinds(ranks):
      kw = (dict(unroll_length=work.unroll, schedule=ConstantSchedule(work.trajectory)) if name == "pes"
            else dict(trajectory_length=work.full_es_trajectory))
      est = make_estimator(name, family, lopt, num_tasks=pairs, sigma=0.01, **kw, **noise)
      ws = est.init_worker_state(theta, jax.random.key(1))
      mem = jax.jit(type(est).estimate_fn).lower(est, theta, ws, jax.random.key(2)).compile().memory_analysis()
      mib = lambda b: b / 2 ** 20
      print(f"{f'{name}, {pairs} pairs':>16} {label:>8} {mib(mem.temp_size_in_bytes):>12.1f} "
            f"{mib(mem.argument_size_in_bytes):>10.1f} {mib(mem.output_size_in_bytes):>8.1f}")


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
  parser.add_argument("--samples", type=int, default=64, help="estimates per noise kind (variance table)")
  parser.add_argument("--warmup", type=int, default=0, help="estimates before the variance samples")
  parser.add_argument("--pairs_exact", type=int, default=2 ** 20, help="pairs of the exactness table")
  parser.add_argument("--lopt", default="mlp_lopt", help="learned optimizer of tables 1 and 3 (a registered name)")
  parser.add_argument("--tables", nargs="+", type=int, default=[1, 2, 3])
  bench_common.add_flags(parser, markdown=False)
  args = parser.parse_args()
  work = Workload()
  if args.smoke:
    work, args.ranks, args.samples, args.pairs_exact = SMOKE, [1], 2, SMOKE.pairs_per_call
  lopt = get_learned_optimizer(args.lopt)
  family = bench_common.image_mlp_family(args.smoke)
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}")
  if 1 in args.tables:
    variance_table(lopt, args.ranks, args.samples, args.warmup, family, work)
  if 2 in args.tables:
    exactness_table(args.ranks, args.pairs_exact, work.pairs_per_call)
  if 3 in args.tables:
    memory_table(lopt, args.ranks, family, work)


if __name__ == "__main__":
  main()
