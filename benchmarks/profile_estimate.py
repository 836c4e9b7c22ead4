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
import dataclasses
import glob
import os
import re
import tempfile
import time
import warnings

# XLA:CPU's per-kernel trace events: the flag must be in XLA_FLAGS before JAX starts its backend.
CPU_KERNEL_EVENTS_FLAG = "--xla_cpu_enable_xprof_traceme=true"
# HLO ops whose spans contain the kernels they run (counted themselves): left out of the kernel times.
CONTROL_FLOW = ("while", "conditional", "cond", "call")
# Lines of a device plane that the profiler derives from the kernels (summaries of them, not more kernels).
DERIVED_LINES = ("XLA Modules", "XLA Ops", "XLA TraceMe", "Steps", "Framework Ops", "Framework Name Scope",
                 "Source code", "Launch Stats", "SparseCore")


def enable_cpu_kernel_events():
  """Adds `CPU_KERNEL_EVENTS_FLAG` to ``XLA_FLAGS``; call before JAX starts its backend (GPU kernels are traced
  without it, by CUPTI)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if CPU_KERNEL_EVENTS_FLAG not in flags.split():
    os.environ["XLA_FLAGS"] = f"{flags} {CPU_KERNEL_EVENTS_FLAG}".strip()


def trace(call, calls):
  """Calls the blocking ``call`` ``calls`` times under `jax.profiler.trace`; returns the trace read back
  (`jax.profiler.ProfileData`) and the seconds per call (traced: the profiler's own cost included)."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax.profiler import ProfileData  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      start = time.perf_counter()
      for _ in range(calls):
        call()
      seconds = (time.perf_counter() - start) / calls
    return ProfileData.from_file(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0]), seconds


@dataclasses.dataclass
class Kernels:
  """Kernel time of a trace: nanoseconds and runs per kernel label, and where the events were read (``source``)."""
  ns: collections.Counter
  runs: collections.Counter
  source: str

  def kinds(self) -> collections.Counter:
    """Nanoseconds per kind of kernel (`kernel_kind`)."""
    kinds = collections.Counter()
    for label, ns in self.ns.items():
      kinds[kernel_kind(label)] += ns
    return kinds


def kernel_kind(label: str) -> str:
  """A kernel's kind from its label: matrix products (XLA's ``dot``/``dot_general``, cuBLAS/CUTLASS kernels), device
  copies (``memcpy``/``memset``), otherwise the name without its number (``loop_add_fusion``, ``copy``, ``ynn_fusion``:
  XLA:CPU's YNNPACK fusions, products or elementwise). A GPU label ``op: kernel`` is classified by both parts."""
  low = label.lower()
  if re.search(r"(^|[^a-z])(dot|dot_general)([._:\s]|$)|gemm|xmma|cublas|cutlass", low):
    return "matrix products"
  if "memcpy" in low or "memset" in low:
    return "device copies (memcpy/memset)"
  return re.sub(r"([._]\d+)+$", "", label.split(": ")[0].split()[0]) or label


def _stats(event):
  try:
    with warnings.catch_warnings():  # jaxlib 0.12's stats type warns that it has no __module__ (Python 3.12)
      warnings.simplefilter("ignore", DeprecationWarning)
      return dict(event.stats)
  except Exception:  # pylint: disable=broad-except
    return {}


def _hlo_op(stats):
  """The HLO op an event ran, from its stats: ``hlo_op``, or parsed from a kernel annotation (``...hlo_op=NAME...``)."""
  if stats.get("hlo_op"):
    return str(stats["hlo_op"])
  for value in stats.values():
    match = re.search(r"hlo_op=([^,#\s]+)", str(value))
    if match:
      return match.group(1)
  return None


def kernel_times(profile) -> Kernels:
  """The kernels of a `jax.profiler.ProfileData` trace, summed per label.

  With a device plane (``/device:GPU:0``, ...) holding events, those are the kernels: the events of its stream lines
  (CUPTI's kernels, memcpys and memsets; the profiler's derived summary lines are skipped), labelled ``op: kernel``
  when the event names its HLO op and the kernel's name differs (library kernels: cuBLAS's ``sm90_xmma_gemm...``).
  Otherwise (XLA:CPU, with `enable_cpu_kernel_events`) the host plane's events that name an HLO op, less control flow
  (``while``/``conditional``/``call`` spans contain the kernels they run), labelled by the op.
  """
  ns, runs = collections.Counter(), collections.Counter()
  device_planes = [p for p in profile.planes if p.name.startswith("/device:") and "CPU" not in p.name]
  for plane in device_planes:
    lines = [line for line in plane.lines if line.name not in DERIVED_LINES]
    streams = [line for line in lines if line.name.startswith("Stream")]
    for line in streams or lines:
      for event in line.events:
        op = _hlo_op(_stats(event))
        label = event.name if not op or op == event.name else f"{op}: {event.name[:80]}"
        ns[label] += event.duration_ns
        runs[label] += 1
  if ns:
    return Kernels(ns, runs, "device kernels: " + ", ".join(p.name for p in device_planes))
  for plane in profile.planes:
    if not plane.name.startswith("/host:"):
      continue
    for line in plane.lines:
      for event in line.events:
        op = _hlo_op(_stats(event))
        if op is None or op.startswith(CONTROL_FLOW):
          continue
        ns[op] += event.duration_ns
        runs[op] += 1
  note = (" (no device kernel events on " + ", ".join(p.name for p in device_planes) + ": CUPTI unavailable?)"
          if device_planes else "")
  return Kernels(ns, runs, "XLA:CPU kernel events on the host plane" + note)


def trace_contents(profile, max_lines=6) -> str:
  """What a trace holds, for diagnosing a reduction that found nothing: each plane with its lines' event counts."""
  parts = []
  for plane in profile.planes:
    lines = [f"{line.name[:40]} ({sum(1 for _ in line.events):,})" for line in plane.lines]
    more = f", +{len(lines) - max_lines} lines" if len(lines) > max_lines else ""
    parts.append(f"{plane.name}: {', '.join(lines[:max_lines])}{more}" if lines else plane.name)
  return "; ".join(parts)


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
  enable_cpu_kernel_events()  # before JAX starts its backend

  import jax
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
  kernels = kernel_times(trace(call, args.calls)[0])
  per_kernel, counts = kernels.ns, kernels.runs
  steps = args.calls * steps_per_call
  total = sum(per_kernel.values())
  kinds = kernels.kinds()
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
