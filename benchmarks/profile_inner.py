"""Where an inner unroll's time goes, kernel by kernel: metafam's `TruncatedStep.unroll` against the minimal program.

    python benchmarks/profile_inner.py                               # MLPLOpt and Adam, 1,024 lanes
    python benchmarks/profile_inner.py --optimizers mlp_lopt --lanes 256 --top 20 --markdown profile.md

The two programs of `inner_training.py`, built by its own functions (`setup_metafam`, `setup_minimal`: same family,
8x8 image MLP, batch 128; one 50-step unroll per call): metafam's `TruncatedStep.unroll` on one device and the
hand-written ``jit(scan(vmap(step)))`` of the same math. Each runs once untraced, then ``--calls`` calls under
`jax.profiler.trace`, one trace per program, and each trace is read back with `jax.profiler.ProfileData` and reduced
per kernel by `profile_estimate.kernel_times`: on a GPU the kernels, memcpys and memsets on the device plane's streams
(CUPTI), labelled ``HLO op: kernel`` where a library kernel runs an op (cuBLAS's gemms); on CPU XLA's per-kernel events
(``--xla_cpu_enable_xprof_traceme``, set here before JAX starts). Printed and written (``--markdown PATH``) per
optimizer: each program's wall time per call under the profiler, its kernel time per call and per inner step, the
kernels' share of the wall time (what is left is the device waiting: launches, host round trips, synchronization)
and kernel runs per inner step; then each program's top ``--top`` kernels (runs per inner step, total and per-step
time, share of the program's kernel time). If the trace holds no kernel events, the table says what it holds.
``--smoke``: the tiny workload (4 hidden units, batches of 8), 2 lanes, one call. Run it alone: kernel times of one
process.
"""

from __future__ import annotations

import argparse

import profile_estimate  # benchmarks/ is on sys.path when this runs as a script; imports no JAX


def profile_program(run, calls, steps_per_call):
  """``run`` (a blocking call, compiled) traced for ``calls`` calls: a summary dict and the `Kernels`."""
  run()  # compiled already (the setup lowered it); an untraced call, so that the trace holds no first-call work
  profile, seconds = profile_estimate.trace(run, calls)
  kernels = profile_estimate.kernel_times(profile)
  steps = calls * steps_per_call
  total = sum(kernels.ns.values())
  return {"wall_ms": 1e3 * seconds, "kernel_ms": total / calls / 1e6, "step_us": total / steps / 1e3,
          "busy": total / 1e9 / (seconds * calls) if seconds else float("nan"),
          "runs": sum(kernels.runs.values()) / steps, "steps": steps, "total": total,
          "contents": "" if total else profile_estimate.trace_contents(profile)}, kernels


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--optimizers", nargs="+", default=["mlp_lopt", "adam"],
                      choices=["mlp_lopt", "adam", "adafac_mlp_lopt", "adafac_muon_mlp_lopt"])
  parser.add_argument("--lanes", type=int, default=1024)
  parser.add_argument("--calls", type=int, default=3, help="unrolls profiled per program (after one untraced call)")
  parser.add_argument("--top", type=int, default=15, help="kernels listed per program")
  parser.add_argument("--smoke", action="store_true",
                      help="a tiny workload, 2 lanes, one call: runs every code path in seconds; the numbers mean "
                           "nothing")
  parser.add_argument("--markdown", metavar="PATH", help="also write the tables as Markdown to PATH")
  args = parser.parse_args()
  if args.lanes < 1 or args.calls < 1 or args.top < 1:
    parser.error("--lanes, --calls and --top must be positive")
  if args.smoke:
    args.lanes, args.calls = 2, 1
  profile_estimate.enable_cpu_kernel_events()  # before JAX starts its backend

  import jax  # pylint: disable=import-outside-toplevel
  import bench_common  # pylint: disable=import-outside-toplevel
  import inner_training  # pylint: disable=import-outside-toplevel
  from metafam.optimizers.learned import HandDesigned  # pylint: disable=import-outside-toplevel

  family = bench_common.image_mlp_family(args.smoke)
  unroll = inner_training.UNROLL
  device = jax.devices()[0]
  print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}); {family.name}, {args.lanes} lanes, "
        f"unroll {unroll}; {args.calls} traced calls per program")
  sections, failures = [], 0
  for name in args.optimizers:
    theta, opt = inner_training.make_optimizer(name)
    if theta is None:  # a plain Optimizer: wrapped as inner_training.py does
      opt, theta = HandDesigned(opt), {}
    programs = {"metafam": inner_training.setup_metafam(family, opt, theta, args.lanes, None)[0],
                "minimal": inner_training.setup_minimal(family, opt, theta, args.lanes)[0]}
    results, failed = {}, {}
    for program, run in programs.items():
      try:  # a profiler that fails on this machine: said in the file, which the other program's tables still fill
        results[program] = profile_program(run, args.calls, unroll)
      except Exception as e:  # pylint: disable=broad-except
        failed[program] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        print(f"{name}, {program}: profiling failed: {failed[program]}")
    summary, tops = [], []
    print(f"\n== {name}, {args.lanes} lanes")
    for program, error in failed.items():
      summary.append([program] + ["-"] * 7 + [f"profiling failed: {error}".replace("|", "/")])
    for program, (info, kernels) in results.items():
      print(f"{program}: {info['wall_ms']:,.2f} ms per call traced, kernels {info['kernel_ms']:,.2f} ms per call "
            f"({info['busy']:.0%} of it), {info['step_us']:,.1f} us and {info['runs']:,.1f} kernel runs per inner "
            f"step; {kernels.source}")
      kinds = ", ".join(f"{kind} {ns / info['total']:.0%}" for kind, ns in kernels.kinds().most_common(4))
      summary.append([program, info["wall_ms"], info["kernel_ms"], f"{info['busy']:.0%}", info["step_us"],
                      info["runs"], len(kernels.ns), kinds or "-", kernels.source])
      if not info["total"]:
        print(f"  no kernel events; the trace holds: {info['contents']}")
        tops.append(f"{name}, {program}: no kernel events. The trace holds: {info['contents']}\n")
        continue
      rows = []
      for label, ns in kernels.ns.most_common(args.top):
        rows.append([f"`{label[:100]}`".replace("|", "\\|"), profile_estimate.kernel_kind(label),
                     kernels.runs[label] / info["steps"], ns / 1e6, ns / info["steps"] / 1e3,
                     f"{ns / info['total']:.1%}"])
        print(f"  {ns / info['steps'] / 1e3:>9,.2f} us/step {ns / info['total']:>6.1%} "
              f"{kernels.runs[label] / info['steps']:>6.2f} runs/step  {label}")
      tops.append(bench_common.markdown_table(
          f"{name}, {args.lanes} lanes, {program}: top {len(rows)} of {len(kernels.ns)} kernels", [
              "kernel", "kind", "runs / step", "total ms", "us / step", "share"], rows,
          [f"Over {args.calls} traced calls ({info['steps']} inner steps of {args.lanes} lanes); share of the "
           f"program's kernel time."]))
    step_us = {program: info["step_us"] for program, (info, _) in results.items() if info["total"]}
    ratio = step_us["metafam"] / step_us["minimal"] if len(step_us) == 2 else float("nan")
    sections.append(bench_common.markdown_table(
        f"Inner unroll profile: {name}, {args.lanes} lanes, unroll {unroll}",
        ["program", "wall ms / call (traced)", "kernel ms / call", "kernel share of wall", "kernel us / step",
         "kernel runs / step", "distinct kernels", "top kinds (share of kernel time)", "events read"],
        sorted(summary, key=lambda row: row[0]),
        [f"`python benchmarks/profile_inner.py{' --smoke' if args.smoke else ''}`: {args.calls} calls per program "
         f"under `jax.profiler.trace`; kernel time metafam / minimal: {ratio:.2f}x. Wall time minus kernel time is "
         f"the device waiting (launches, host round trips, synchronization); the profiler adds its own cost."]))
    sections += tops
    bench_common.write_markdown(args.markdown, sections)  # after each optimizer: a step stopped later keeps it
    failures += len(failed)
  if failures:
    raise SystemExit(f"profiling failed for {failures} program(s); see the tables")


if __name__ == "__main__":
  main()
