"""Meta-gradient estimation throughput and the share of meta-training time spent outside the jitted program.

    python benchmarks/outer_training.py
    python benchmarks/outer_training.py --steps 20 --estimators pes --devices 1

Workload: the image-MLP family at 8x8 (64 -> 32 ReLU -> 10, 2,410 params per task), batch 128 of embedded
Fashion-MNIST, the per-parameter MLP learned optimizer, 8 antithetic pairs (16 lanes), meta-loss on `outer_valid`.
  * PES: trajectories of 50 steps (constant schedule, staggered), 10 inner steps per estimate.
  * FullES: complete trajectories of 200 steps per estimate.
For each, ``--steps`` meta-steps of `MetaTrainer.train` (estimate + Adam meta-update + metric transfer and logging)
and as many bare calls of the compiled meta-step program are timed, in interleaved blocks; "outside" is the share of
the loop's time not spent in that program (host overhead). Target: < 10%.
With ``--devices N`` (default 2; the script asks JAX for N CPU devices) each estimator is also built with
``devices=N`` (lanes split over N devices, same numbers) and the bare meta-step programs of both placements are
timed in the same round-robin; "speedup" is the ratio of the bare programs' median times.
The reference library measured 8.5 PES estimates/s for the same model with 8 lanes and truncations of 20 steps
(TruncatedES 9.7, FullES 9.6; ../shared/README.md); its settings differ, so compare with care.
With ``--reference_src DIR`` (the unpacked google/learned_optimization source, see `reference_lo.py`) the
reference library's own `TruncatedPES` runs in this process on the PES workload above (its MLPLOpt, 8 antithetic
pairs, 10 inner steps per estimate within trajectories of 50), timed round-robin against metafam's `PES.estimate`
alone (no meta-update, like LO's `compute_gradient_estimate`) on one device and on ``--devices``, for both meta-loss
definitions side by side (the same on both sides): LO's default, the normalized train-batch loss before each update
(metafam: ``meta_loss_split=None, loss_kind="normalized_loss"``), and metafam's default, the normalized loss of the
updated params on an ``outer_valid`` batch (LO: ``train_and_meta=True``), which costs an extra forward pass per step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import optax

from metafam.inner import ConstantSchedule
from metafam.optimizers.mlp_lopt import MLPLOpt
from metafam.outer_trainers import MetaTrainer, make_estimator
from metafam.taskfamilies.image_mlp import ImageMLPFamily


META_LOSSES = {  # setting -> (metafam estimator arguments, LO's TruncatedPES train_and_meta)
    "outer_valid": (dict(), True),  # loss of the updated params on an outer_valid batch: metafam's default
    "train batch": (dict(meta_loss_split=None, loss_kind="normalized_loss"), False),  # LO's default
}


def build(name, family, lopt, devices, **kwargs):
  if name == "pes":
    return make_estimator("pes", family, lopt, num_tasks=8, unroll_length=10, schedule=ConstantSchedule(50),
                          sigma=0.01, devices=devices, **kwargs)
  return make_estimator("full_es", family, lopt, num_tasks=8, trajectory_length=200, sigma=0.01, devices=devices)


def time_round_robin(runs, steps, rounds=5):
  """Median seconds per meta-step, in the loop (`MetaTrainer.train`: step, metric transfer, logging) and as bare
  calls of the compiled step, for every trainer in ``runs``; blocks of ``steps // rounds`` steps are interleaved
  (loop, bare, next trainer, ...), so machine-speed drift hits all of them alike."""
  per_block = max(1, steps // rounds)
  times = {(name, kind): [] for name in runs for kind in ("loop", "bare")}
  for _ in range(rounds):
    for name, box in runs.items():
      trainer = box["trainer"]
      start = time.perf_counter()
      box["state"], _ = trainer.train(int(box["state"].step) + per_block, state=box["state"], progress=False)
      times[name, "loop"].append((time.perf_counter() - start) / per_block)
      start = time.perf_counter()
      for _ in range(per_block):
        box["state"], metrics = trainer.step(box["state"])
      jax.block_until_ready((box["state"], metrics))
      times[name, "bare"].append((time.perf_counter() - start) / per_block)
  return {key: statistics.median(t) for key, t in times.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--estimators", nargs="+", default=["pes", "full_es"], choices=["pes", "full_es"])
  parser.add_argument("--steps", type=int, default=30, help="meta-steps timed per estimator")
  parser.add_argument("--devices", type=int, default=2, help="also time the estimators with devices=N (1: skip)")
  parser.add_argument("--reference_src", metavar="DIR",
                      help="unpacked learned_optimization source: time its TruncatedPES in this run")
  args = parser.parse_args()
  if args.devices > 1:
    jax.config.update("jax_num_cpu_devices", args.devices)  # before JAX starts its CPU backend
  lo = None
  if args.reference_src:
    import reference_lo  # benchmarks/ is on sys.path when this runs as a script
    lo = reference_lo.load(args.reference_src)
  family = ImageMLPFamily((32,), image_size=8, batch_size=128, activations=("relu",), label_noise_range=(0.0, 0.0))
  lopt = MLPLOpt()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {family.name}; MLPLOpt; {args.steps} meta-steps")
  placements = [None] + ([args.devices] if args.devices > 1 else [])
  rows = []
  for name in args.estimators:
    runs = {}
    for devices in placements:
      est = build(name, family, lopt, devices)
      trainer = MetaTrainer(lopt, [est], optax.adam(1e-3))
      state, metrics = trainer.step(trainer.init(jax.random.key(0)))  # compile
      jax.block_until_ready(metrics)
      runs[devices or 1] = {"trainer": trainer, "state": state, "est": est}
    times = time_round_robin(runs, args.steps)
    for devices, box in runs.items():
      rows.append((name, devices, box["est"].inner_steps_per_estimate, times[devices, "loop"],
                   times[devices, "bare"], times[1, "bare"] / times[devices, "bare"]))
  print(f"\n{'estimator':>10} {'devices':>7} {'estimates/s':>11} {'inner steps/s':>13} {'loop s/step':>11} "
        f"{'jit s/step':>10} {'outside':>7} {'speedup':>7}")
  for name, devices, inner, loop, bare, speedup in rows:
    print(f"{name:>10} {devices:>7} {1 / loop:>11.2f} {inner / loop:>13,.0f} {loop:>11.4f} {bare:>10.4f} "
          f"{max(0.0, 1 - bare / loop):>7.1%} {speedup:>6.2f}x")
  if lo:
    compare_reference(lo, family, lopt, placements, args.steps)


def compare_reference(lo, family, lopt, placements, steps, rounds=5):
  """PES estimates/s: LO's TruncatedPES against metafam's `PES.estimate`, blocks of calls interleaved, for each
  meta-loss definition of `META_LOSSES` (the same one on both sides: same data, same loss, normalized)."""
  import reference_lo
  runs = {}
  for setting, (kwargs, train_and_meta) in META_LOSSES.items():
    runs[setting, "LO TruncatedPES"] = reference_lo.setup_pes(lo, family, num_pairs=8, unroll_length=10,
                                                              trajectory_length=50, sigma=0.01,
                                                              train_and_meta=train_and_meta)
    for devices in placements:
      est = build("pes", family, lopt, devices, **kwargs)
      box = {"theta": lopt.init(jax.random.key(0)), "key": jax.random.key(2)}
      box["state"] = est.init_worker_state(box["theta"], jax.random.key(1))

      def run(est=est, box=box):
        box["key"], key = jax.random.split(box["key"])
        out, box["state"] = est.estimate(box["theta"], box["state"], key)
        jax.block_until_ready(out)
      runs[setting, f"metafam PES x{devices or 1}"] = run
  for run in runs.values():
    run()  # compile
  per_block = max(1, steps // rounds)
  times = {name: [] for name in runs}
  for _ in range(rounds):
    for name, run in runs.items():
      start = time.perf_counter()
      for _ in range(per_block):
        run()
      times[name].append((time.perf_counter() - start) / per_block)
  print(f"\n{'PES, estimate only':>20} {'meta-loss':>12} {'estimates/s':>11} {'vs LO':>6}")
  for (setting, name), t in times.items():
    lo_time = statistics.median(times[setting, "LO TruncatedPES"])
    print(f"{name:>20} {setting:>12} {1 / statistics.median(t):>11.2f} {lo_time / statistics.median(t):>5.2f}x")


if __name__ == "__main__":
  main()
