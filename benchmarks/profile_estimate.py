"""Where an estimate's time goes: a per-kernel profile of metafam's PES (or FullES) meta-gradient estimate on CPU.

    python benchmarks/profile_estimate.py                        # PES, MLPLOpt, 8 pairs, 10 steps per estimate
    python benchmarks/profile_estimate.py --pairs 64 --top 15
    python benchmarks/profile_estimate.py --estimator full_es --calls 2
    python benchmarks/profile_estimate.py --shared_theta         # the same unroll with one theta for every lane
    python benchmarks/profile_estimate.py --perturbation low_rank --rank 1   # low-rank ES perturbations

The workload is `outer_training.py`'s (8x8 image-MLP family, batch 128, MLPLOpt, trajectories of 50, meta-loss on
``outer_valid``). ``--calls`` estimates run under `jax.profiler.trace` with XLA's per-kernel trace events on, and the
trace is read back with `jax.profiler.ProfileData`: the time of every compiled kernel (XLA names them after their
root op: ``dot_general.N`` / ``dot.N`` are matrix products, ``*_fusion.N`` fused elementwise/reduction loops,
``copy.N`` copies; the spans of control flow, ``cond.N`` / ``while.N``, contain kernels and are left out), summed per inner step of one lane group, by kind and for
the top ``--top`` kernels. ``--shared_theta`` profiles the same unroll with one theta for every lane instead of the
per-lane ``theta +- eps`` of an ES estimate: the difference is what per-lane learned-optimizer weights cost (their
matrix products are batched over lanes; a batched product of these sizes runs on one core on XLA:CPU, a shared one
on all cores). ``--perturbation low_rank --rank R`` profiles the estimate with low-rank perturbations of the
matrices (shared weights plus per-lane rank-R factors, see `metafam.outer_trainers.base`). Kernel times of one
process; run it alone. ``--smoke`` runs every code path on a tiny workload (4 hidden units, batches of 8, 2 pairs,
2 steps per PES estimate in trajectories of 4, FullES over 4 steps, one call).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import tempfile


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--estimator", default="pes", choices=["pes", "full_es"])
  parser.add_argument("--pairs", type=int, default=8)
  parser.add_argument("--calls", type=int, default=10, help="estimates profiled (after one warm-up call)")
  parser.add_argument("--top", type=int, default=12, help="kernels listed by time")
  parser.add_argument("--shared_theta", action="store_true", help="profile the unroll with one theta for all lanes")
  parser.add_argument("--perturbation", default="full", choices=["full", "low_rank"], help="the estimator's noise")
  parser.add_argument("--rank", type=int, default=1, help="factor rank with --perturbation low_rank")
  parser.add_argument("--smoke", action="store_true",
                      help="a tiny workload, one call: runs every code path in seconds; the numbers mean nothing")
  args = parser.parse_args()
  if args.smoke:
    args.pairs, args.calls = 2, 1
  unroll, trajectory, full_es_trajectory = (2, 4, 4) if args.smoke else (10, 50, 200)
  # Per-kernel trace events of XLA:CPU; must be set before JAX starts its backend.
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()

  import jax
  from jax.profiler import ProfileData
  from metafam.inner import ConstantSchedule
  from metafam.inner.truncated_step import TruncatedStep
  from metafam.optimizers.mlp_lopt import MLPLOpt
  from metafam.outer_trainers import make_estimator
  import bench_common  # benchmarks/ is on sys.path when this runs as a script; imports jax: after XLA_FLAGS

  family = bench_common.image_mlp_family(args.smoke)
  lopt = MLPLOpt()
  theta = lopt.init(jax.random.key(0))
  if args.estimator == "pes":
    est = make_estimator("pes", family, lopt, num_tasks=args.pairs, unroll_length=unroll,
                         schedule=ConstantSchedule(trajectory), sigma=0.01, perturbation=args.perturbation,
                         rank=args.rank)
    steps_per_call = unroll
  else:
    est = make_estimator("full_es", family, lopt, num_tasks=args.pairs, trajectory_length=full_es_trajectory,
                         sigma=0.01, perturbation=args.perturbation, rank=args.rank)
    steps_per_call = full_es_trajectory
  box = {"state": est.init_worker_state(theta, jax.random.key(1)), "key": jax.random.key(2)}

  if args.shared_theta:  # the estimator's own unroll, with the unperturbed theta for every lane
    step = est.step
    lanes = step.init_step_state(theta, jax.random.key(3))
    unroll = jax.jit(lambda step, theta, lanes, keys: TruncatedStep.unroll_fn(step, theta, lanes, keys))

    def call():
      box["key"], key = jax.random.split(box["key"])
      jax.block_until_ready(unroll(step, theta, lanes, jax.random.split(key, steps_per_call)))
  else:
    def call():
      box["key"], key = jax.random.split(box["key"])
      out, box["state"] = est.estimate(theta, box["state"], key)
      jax.block_until_ready(out)

  call()  # compile
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      for _ in range(args.calls):
        call()
    profile = ProfileData.from_file(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0])
  per_kernel, counts = collections.Counter(), collections.Counter()
  for plane in profile.planes:
    for line in plane.lines:
      for event in line.events:
        name = event.name
        # Host-side frames (Python, dispatch, the executor's own spans) are not kernels, and control flow (loops,
        # conditionals, calls) spans the kernels inside it, which are counted themselves.
        if (name.startswith(("$", "ThunkExecutor", "Pjit", "CommonPjRt", "PjRt", "while", "cond", "call"))
            or "." not in name):
          continue
        per_kernel[name] += event.duration_ns
        counts[name] += 1
  steps = args.calls * steps_per_call
  total = sum(per_kernel.values())
  kinds = collections.Counter()
  for name, ns in per_kernel.items():
    kind = name.split(".")[0]
    kinds["matrix products (dot)" if kind in ("dot", "dot_general") else kind] += ns
  theta_kind = "one theta for all lanes" if args.shared_theta else "per-lane theta +- eps"
  if not args.shared_theta and args.perturbation == "low_rank":
    theta_kind += f" (low-rank, rank {args.rank})"
  print(f"jax {jax.__version__}; {args.estimator}, MLPLOpt, {args.pairs} pairs ({2 * args.pairs} lanes), "
        f"{theta_kind}; {args.calls} calls of {steps_per_call} inner steps")
  print(f"kernel time per inner step (all lanes): {total / steps / 1e3:,.0f} us")
  print(f"\n{'us/step':>9} {'share':>6}  kind")
  for kind, ns in kinds.most_common(args.top):
    print(f"{ns / steps / 1e3:>9,.1f} {ns / total:>6.1%}  {kind}")
  print(f"\n{'us/step':>9} {'share':>6} {'runs/step':>9}  kernel")
  for name, ns in per_kernel.most_common(args.top):
    print(f"{ns / steps / 1e3:>9,.1f} {ns / total:>6.1%} {counts[name] / steps:>9.1f}  {name}")


if __name__ == "__main__":
  main()
