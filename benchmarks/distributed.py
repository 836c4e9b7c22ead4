"""Meta-training throughput on one process vs several processes (jax.distributed, loopback).

    python benchmarks/distributed.py
    python benchmarks/distributed.py --steps 40 --num_tasks 16 --layouts 1x1,1x2,2x1

Workload: PES meta-steps on the 8x8 image-MLP family with MLPLOpt (``--num_tasks`` antithetic pairs, ``--unroll``
inner steps per estimate within trajectories of 50, Adam meta-optimizer, clipping), as in
`benchmarks/outer_training.py`.
Each layout ``PxD`` is P processes with D CPU devices each, started fresh by this script; the lanes are split over
all P*D devices. After ``--warmup`` meta-steps (compilation), ``--steps`` jitted meta-steps (`MetaTrainer.step`,
blocking on each) are timed; process 0 reports meta-steps/s and inner steps/s. "vs first" is the ratio to the first
layout's rate, measured in the same invocation (the layouts run one after the other, so drift between them counts:
run it alone on an idle machine). On a 2-core machine, 2 processes x 1 device can only show what the 2 cores give
(the same as 1 process x 2 devices at best, minus the Gloo transfer of the gradient); more hosts add cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def child(args) -> None:
  """One process of one layout: meta-train, time the steps, print a JSON line on process 0."""
  if args.pin:  # process i on core i (of those this script may use)
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[args.process_id % len(cores)]})
  import jax
  jax.config.update("jax_num_cpu_devices", args.devices)
  from metafam import distributed
  distributed.initialize(distributed.ProcessGroup(args.num_processes, args.process_id, args.coordinator))
  import optax
  from metafam.inner import ConstantSchedule
  from metafam.optimizers import MLPLOpt
  from metafam.outer_trainers import MetaTrainer, make_estimator
  from metafam.taskfamilies import get_family

  family, lopt = get_family("fmnist_mlp_family_8x8_32"), MLPLOpt()
  n = jax.device_count()
  est = make_estimator("pes", family, lopt, num_tasks=args.num_tasks, unroll_length=args.unroll,
                       schedule=ConstantSchedule(50), sigma=0.01, devices=n if n > 1 else None)
  trainer = MetaTrainer(lopt, [est], optax.adam(3e-3), clip_grad_norm=1.0)
  state = trainer.init(jax.random.key(0))
  for _ in range(args.warmup):
    state, metrics = trainer.step(state)
  jax.block_until_ready(metrics)
  t0 = time.perf_counter()
  for _ in range(args.steps):
    state, metrics = trainer.step(state)
    jax.block_until_ready(metrics)
  seconds = time.perf_counter() - t0
  if distributed.is_main_process():
    print(json.dumps({"processes": jax.process_count(), "devices": n, "seconds": seconds,
                      "meta_steps_per_s": args.steps / seconds,
                      "inner_steps_per_s": args.steps * trainer.inner_steps_per_meta_step / seconds}), flush=True)


def run_layout(processes: int, devices: int, args) -> dict:
  from metafam.distributed import free_port
  base = [sys.executable, os.path.abspath(__file__), "--child", f"--devices={devices}", f"--steps={args.steps}",
          f"--warmup={args.warmup}", f"--num_tasks={args.num_tasks}", f"--unroll={args.unroll}"]
  base += ["--pin"] if args.pin and processes > 1 else []
  port = free_port()
  extra = [[f"--num_processes={processes}", f"--process_id={i}", f"--coordinator=127.0.0.1:{port}"]
           if processes > 1 else [] for i in range(processes)]
  procs = [subprocess.Popen(base + e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for e in extra]
  outputs = [p.communicate() for p in procs]
  for p, (out, err) in zip(procs, outputs):
    if p.returncode:
      raise RuntimeError(f"layout {processes}x{devices} failed:\n{err[-2000:]}")
  return json.loads([line for line in outputs[0][0].splitlines() if line.startswith("{")][-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--layouts", default="1x1,1x2,2x1", help="comma-separated PxD: P processes x D devices each")
  parser.add_argument("--steps", type=int, default=30, help="timed meta-steps per layout")
  parser.add_argument("--warmup", type=int, default=3, help="meta-steps before timing (compilation)")
  parser.add_argument("--num_tasks", type=int, default=8,
                      help="task instances, an antithetic pair of lanes each (lanes = 2 x tasks)")
  parser.add_argument("--unroll", type=int, default=10, help="inner steps per estimate")
  parser.add_argument("--pin", action="store_true", help="pin process i of a multi-process layout to core i")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
  parser.add_argument("--num_processes", type=int, default=1, help=argparse.SUPPRESS)
  parser.add_argument("--process_id", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    return child(args)
  layouts = []
  for text in args.layouts.split(","):
    try:
      p, d = (int(v) for v in text.lower().split("x"))
    except ValueError:
      parser.error(f"--layouts: {text!r} is not PxD (e.g. 2x1)")
    if p < 1 or d < 1 or args.num_tasks % (p * d):
      parser.error(f"--layouts: {text}: {p * d} devices must divide --num_tasks {args.num_tasks}")
    layouts.append((p, d))
  print(f"PES meta-steps, image-MLP 8x8, MLPLOpt, {args.num_tasks} pairs, {args.unroll} inner steps/estimate; "
        f"{args.steps} timed steps per layout")
  print(f"{'layout':>8} {'meta-steps/s':>13} {'inner steps/s':>14} {'vs first':>9}")
  first = None
  for p, d in layouts:
    r = run_layout(p, d, args)
    first = first or r["meta_steps_per_s"]
    print(f"{p}x{d:<6} {r['meta_steps_per_s']:13.2f} {r['inner_steps_per_s']:14,.0f} "
          f"{r['meta_steps_per_s'] / first:9.2f}", flush=True)


if __name__ == "__main__":
  main()
