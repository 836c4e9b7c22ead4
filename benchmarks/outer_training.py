"""Meta-gradient estimation throughput and the share of meta-training time spent outside the jitted program.

    python benchmarks/outer_training.py                     # PES and FullES, 1 and 2 devices, full and low-rank noise
    python benchmarks/outer_training.py --reference_src /tmp/lo/learned_optimization-0.0.1   # + the reference library
    python benchmarks/outer_training.py --steps 20 --estimators pes --devices 1 --perturbations full

Workload: the image-MLP family at 8x8 (64 -> 32 ReLU -> 10, 2,410 params per task), batch 128 of embedded
Fashion-MNIST, the per-parameter MLP learned optimizer, 8 antithetic pairs (16 lanes), meta-loss on `outer_valid`.
  * PES: trajectories of 50 steps (constant schedule, staggered), 10 inner steps per estimate.
  * FullES: complete trajectories of 200 steps per estimate.
For each, ``--steps`` meta-steps of `MetaTrainer.train` (estimate + Adam meta-update + metric transfer and logging)
and as many bare calls of the compiled meta-step program are timed, in interleaved blocks; "outside" is the share of
the loop's time not spent in that program (host overhead). Target: <= 5%.
With ``--devices N`` (default 2; the script asks JAX for N CPU devices) each estimator is also built with
``devices=N`` (lanes split over N devices, same numbers) and the bare meta-step programs of both placements are
timed in the same round-robin; "speedup" is the ratio of the bare programs' median times.
The reference library measured 8.5 PES estimates/s for the same model with 8 lanes and truncations of 20 steps
(TruncatedES 9.7, FullES 9.6; ../shared/README.md); its settings differ, so compare with care.
With ``--reference_src DIR`` (the unpacked google/learned_optimization source, see `reference_lo.py`) the
reference library's own estimators run in this process and are timed round-robin against metafam's ``estimate``
alone (no meta-update, like LO's ``compute_gradient_estimate``), on one device and on ``--devices``, after a table of
the compared settings side by side:
  * PES: LO's `TruncatedPES` (its MLPLOpt, ``--pairs`` antithetic pairs, default 8 and 64, 10 inner steps per
    estimate within trajectories of 50) against `PES` with the same settings;
  * FullES: LO's `FullES` (the first of ``--pairs``, 8, complete 200-step trajectories, ``loss_type="avg"``, host
    data per 10 steps) against `FullES` (8 pairs, trajectories of 200, ``loss_type="avg"``);
each for both meta-loss definitions (the same on both sides): LO's default, the normalized train-batch loss before
each update (metafam: ``meta_loss_split=None, loss_kind="normalized_loss"``), and metafam's default, the normalized
loss of the updated params on an ``outer_valid`` batch (LO: ``train_and_meta=True``), which costs an extra forward
pass per step. Targets (issue 16): PES >= 2.5x LO at 8 pairs and >= 2x at 64 pairs on one device, FullES >= 2x,
"outside" <= 5%.
``--perturbations`` (default ``full low_rank:1 low_rank:4``) times each of metafam's estimators with each kind of ES
noise (full Gaussian, or low-rank factors of rank R for the matrices: ``perturbation="low_rank", rank=R``) on each
placement in the same round-robin; ``--lopt NAME`` swaps the learned optimizer (a registered name, e.g.
``adafac_muon_mlp_lopt``) on metafam's side (LO keeps its MLPLOpt). ``--markdown PATH`` also writes the tables as
Markdown; ``--smoke`` runs every code path on a tiny workload (4 hidden units, batches of 8, 2 pairs, trajectories of
4 steps, one round).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import jax
import optax

import bench_common  # benchmarks/ is on sys.path when this runs as a script
from metafam.inner import ConstantSchedule
from metafam.optimizers import get_learned_optimizer
from metafam.outer_trainers import MetaTrainer, make_estimator
from metafam.runs import train


META_LOSSES = {  # setting -> (metafam estimator arguments, LO's TruncatedPES train_and_meta)
    "outer_valid": (dict(), True),  # loss of the updated params on an outer_valid batch: metafam's default
    "train batch": (dict(meta_loss_split=None, loss_kind="normalized_loss"), False),  # LO's default
}


DEFAULT_PERTURBATIONS = ("full", "low_rank:1", "low_rank:4")


@dataclasses.dataclass(frozen=True)
class Workload:
  """The estimators' sizes: PES ``unroll`` steps per estimate in trajectories of ``trajectory``; FullES whole
  trajectories of ``full_es_trajectory``; timing ``rounds``."""
  unroll: int = 10
  trajectory: int = 50
  full_es_trajectory: int = 200
  rounds: int = 5


SMOKE = Workload(unroll=2, trajectory=4, full_es_trajectory=4, rounds=1)


def build(name, family, lopt, devices, work, num_tasks=8, **kwargs):
  if name == "pes":
    return make_estimator("pes", family, lopt, num_tasks=num_tasks, unroll_length=work.unroll,
                          schedule=ConstantSchedule(work.trajectory), sigma=0.01, devices=devices, **kwargs)
  return make_estimator("full_es", family, lopt, num_tasks=num_tasks, trajectory_length=work.full_es_trajectory,
                        sigma=0.01, devices=devices, **kwargs)


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
      box["state"], _ = train(trainer, int(box["state"].step) + per_block, state=box["state"], progress=False)
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
  parser.add_argument("--pairs", type=int, nargs="+", default=[8, 64],
                      help="antithetic pair counts of the PES comparison with the reference library")
  parser.add_argument("--reference_src", metavar="DIR",
                      help="unpacked learned_optimization source: time its TruncatedPES in this run")
  parser.add_argument("--perturbations", nargs="+", default=None, type=perturbation_kwargs,
                      help="ES noise of metafam's estimators: full, or low_rank:R (rank R); each is timed "
                           f"(default: {' '.join(DEFAULT_PERTURBATIONS)})")
  parser.add_argument("--lopt", default="mlp_lopt", help="metafam's learned optimizer (a registered name)")
  parser.add_argument("--tiny", action="store_true",
                      help="the host-bound proxy: the smoke workload's sizes (4 hidden units, batches of 8, 2 pairs, "
                           "trajectories of 4) timed for --steps meta-steps in 5 rounds, so that the loop's host work "
                           "is a large share of each meta-step and 'outside' shows it")
  bench_common.add_flags(parser)
  args = parser.parse_args()
  # argparse applies `type` to command-line values only, not to a list default: convert the default here.
  noises = args.perturbations or [perturbation_kwargs(text) for text in DEFAULT_PERTURBATIONS]
  work = SMOKE if args.smoke else dataclasses.replace(SMOKE, rounds=5) if args.tiny else Workload()
  steps, pairs = (1, [2]) if args.smoke else (args.steps, [2] if args.tiny else args.pairs)
  if args.devices > 1:
    jax.config.update("jax_num_cpu_devices", args.devices)  # before JAX starts its CPU backend
  lo = None
  if args.reference_src:
    import reference_lo  # pylint: disable=import-outside-toplevel
    lo = reference_lo.load(args.reference_src)
  family = bench_common.image_mlp_family(args.smoke or args.tiny)
  lopt = get_learned_optimizer(args.lopt)
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {family.name}; {lopt.name}; {steps} meta-steps")
  placements = [None]
  if args.devices > 1 and len(jax.devices()) >= args.devices:
    placements.append(args.devices)
  elif args.devices > 1:  # e.g. one GPU: only CPU devices can be multiplied by the flag above
    print(f"--devices {args.devices}: only {len(jax.devices())} device(s) here; timing one device only")
  variants = [(devices, noise) for noise in noises for devices in placements]
  rows = []
  for name in args.estimators:
    runs = {}
    for devices, noise in variants:
      est = build(name, family, lopt, devices, work, num_tasks=2 if args.tiny else 8, **noise)
      trainer = MetaTrainer(lopt, [est], optax.adam(1e-3))
      state, metrics = trainer.step(trainer.init(jax.random.key(0)))  # compile
      jax.block_until_ready(metrics)
      runs[devices or 1, noise_label(noise)] = {"trainer": trainer, "state": state, "est": est}
    times = time_round_robin(runs, steps, work.rounds)
    for (devices, noise), box in runs.items():
      rows.append((name, devices, noise, box["est"].inner_steps_per_estimate, times[(devices, noise), "loop"],
                   times[(devices, noise), "bare"], times[(1, "full"), "bare"] / times[(devices, noise), "bare"]
                   if (1, "full") in runs else float("nan")))
  print(f"\n{'estimator':>10} {'devices':>7} {'noise':>10} {'estimates/s':>11} {'inner steps/s':>13} "
        f"{'loop s/step':>11} {'jit s/step':>10} {'outside':>7} {'speedup':>7}")
  for name, devices, noise, inner, loop, bare, speedup in rows:
    print(f"{name:>10} {devices:>7} {noise:>10} {1 / loop:>11.2f} {inner / loop:>13,.0f} {loop:>11.4f} "
          f"{bare:>10.4f} {max(0.0, 1 - bare / loop):>7.1%} {speedup:>6.2f}x")
  sections = [bench_common.markdown_table(
      f"MetaTrainer loop, {lopt.name}, {family.name}",
      ["estimator", "devices", "noise", "estimates/s", "inner steps/s", "outside", "bare-step speedup"],
      [(name, devices, noise, 1 / loop, inner / loop, f"{max(0.0, 1 - bare / loop):.1%}", speedup)
       for name, devices, noise, inner, loop, bare, speedup in rows],
      [f"`python benchmarks/outer_training.py{' --smoke' if args.smoke else ''}`: {steps} meta-steps per run in "
       f"{work.rounds} interleaved rounds; speedup = the bare meta-step of devices 1, full noise / this one's."])]
  if lo:
    sections.append(compare_reference(lo, family, lopt, variants, steps, pairs, work))
  bench_common.write_markdown(args.markdown, sections)


def perturbation_kwargs(text):
  """``"full"`` or ``"low_rank:R"`` as estimator arguments."""
  if text == "full":
    return {}
  kind, _, rank = text.partition(":")
  if kind != "low_rank" or not rank.isdigit() or int(rank) < 1:
    raise argparse.ArgumentTypeError(f"expected full or low_rank:R with R >= 1, got {text!r}")
  return {"perturbation": "low_rank", "rank": int(rank)}


def noise_label(noise):
  return f"rank {noise['rank']}" if noise else "full"


def compare_reference(lo, family, lopt, variants, steps, pairs_list, work):
  """Estimates/s of metafam's estimators alone (``estimate``, no meta-update) against the reference library's,
  blocks of calls interleaved: PES vs LO's `TruncatedPES` at each pair count of ``pairs_list`` for each meta-loss
  definition of `META_LOSSES` (the same one on both sides), and FullES vs LO's `FullES` (the first pair count);
  metafam's for every ``(devices, noise)`` of ``variants``. Returns the comparison as a Markdown section."""
  import reference_lo
  print_settings()
  runs = {}
  for num_tasks in pairs_list:
    for setting, (kwargs, train_and_meta) in META_LOSSES.items():
      group = (f"PES, {num_tasks} pairs", setting)
      runs[group, "LO"] = reference_lo.setup_pes(lo, family, num_tasks=num_tasks, unroll_length=work.unroll,
                                                 trajectory_length=work.trajectory, sigma=0.01,
                                                 train_and_meta=train_and_meta)
      for devices, noise in variants:
        est = build("pes", family, lopt, devices, work, num_tasks=num_tasks, **kwargs, **noise)
        runs[group, variant_label(devices, noise)] = estimate_call(est, lopt)
  for setting, (kwargs, train_and_meta) in META_LOSSES.items():
    group = (f"FullES, {pairs_list[0]} pairs", setting)
    runs[group, "LO"] = reference_lo.setup_full_es(lo, family, num_tasks=pairs_list[0],
                                                   trajectory_length=work.full_es_trajectory, sigma=0.01,
                                                   train_and_meta=train_and_meta,
                                                   steps_per_jit=min(10, work.full_es_trajectory))
    for devices, noise in variants:
      runs[group, variant_label(devices, noise)] = estimate_call(
          build("full_es", family, lopt, devices, work, num_tasks=pairs_list[0], **kwargs, **noise), lopt)
  for run in runs.values():
    run()  # compile
  groups = list(dict.fromkeys(group for group, _ in runs))
  times = {name: [] for name in runs}
  for _ in range(work.rounds):
    for group in groups:
      # FullES estimates take ~10x longer than PES ones: fewer calls per block keep the rounds comparable.
      per_block = max(1, (steps if group[0].startswith("PES") else steps // 5) // work.rounds)
      for name in [n for n in runs if n[0] == group]:
        start = time.perf_counter()
        for _ in range(per_block):
          runs[name]()
        times[name].append((time.perf_counter() - start) / per_block)
  labels = [variant_label(devices, noise) for devices, noise in variants]
  print(f"\n{'estimate only':>18} {'meta-loss':>12} {'LO est/s':>9} " +
        " ".join(f"{label:>18} {'vs LO':>6}" for label in labels))
  table = []
  for group in groups:
    lo_time = statistics.median(times[group, "LO"])
    cells, row = [], [group[0], group[1], 1 / lo_time]
    for label in labels:
      t = statistics.median(times[group, label])
      cells.append(f"{1 / t:>18.2f} {lo_time / t:>5.2f}x")
      row += [1 / t, f"{lo_time / t:.2f}x"]
    print(f"{group[0]:>18} {group[1]:>12} {1 / lo_time:>9.2f} " + " ".join(cells))
    table.append(row)
  return bench_common.markdown_table(
      "Estimate only: metafam against learned_optimization (LO) in the same process",
      ["estimate only", "meta-loss", "LO est/s"] + [c for label in labels for c in (f"{label} est/s", "vs LO")],
      table, ["Estimates per second of `estimate` alone (no meta-update), medians of interleaved blocks."])


def variant_label(devices, noise):
  return f"metafam x{devices or 1} {noise_label(noise)}"


def estimate_call(est, lopt):
  """A blocking call of ``est.estimate`` (worker state carried over between calls, a fresh key per call)."""
  box = {"theta": lopt.init(jax.random.key(0)), "key": jax.random.key(2)}
  box["state"] = est.init_worker_state(box["theta"], jax.random.key(1))

  def run():
    box["key"], key = jax.random.split(box["key"])
    out, box["state"] = est.estimate(box["theta"], box["state"], key)
    jax.block_until_ready(out)
  return run


def print_settings():
  """The compared settings, side by side (what makes the comparison exact)."""
  rows = [
      ("task", "8x8 image MLP 64-32-10, ReLU, batch 128", "the same model and data (a twin written on LO's Task)"),
      ("learned optimizer", "MLPLOpt 19-32-32-2 (LOLv2 features)", "its MLPLOpt, summaries off"),
      ("PES truncation", "10 inner steps per estimate, trajectories of 50, staggered",
       "trunc_length=10, steps_per_jit=10, ConstantTruncationSchedule(50), random offsets"),
      ("antithetic pairs", "N pairs = 2N lanes in one vmap (interleaved)", "num_tasks=N, halves as two unrolls"),
      ("sigma", "0.01", "std=0.01"),
      ("meta-loss 'outer_valid'", "normalized loss of the updated params, outer_valid batch",
       "train_and_meta=True (the same)"),
      ("meta-loss 'train batch'", "meta_loss_split=None, loss_kind='normalized_loss'",
       "train_and_meta=False: normalized train loss before the update"),
      ("FullES", "8 pairs, trajectories of 200 from fresh instances, loss_type 'avg'",
       "num_tasks=8, unroll_length=200, steps_per_jit=10, loss_type='avg'"),
      ("data", "sampled on the device inside the program", "assembled on the host per steps_per_jit, copied"),
  ]
  print(f"\n{'setting':>24} | {'metafam':<62} | LO")
  for name, ours, theirs in rows:
    print(f"{name:>24} | {ours:<62} | {theirs}")


if __name__ == "__main__":
  main()
