"""Markdown tables of the heldout and test suites for docs/results/heldout.md and docs/results/test.md.

    python tools/heldout_tables.py tasks       # params, horizon, batch, data, single-run wall time (trains Adam once)
    python tools/heldout_tables.py baselines   # every shipped baseline's metrics (from the normalizer file)
    python tools/heldout_tables.py baselines --suite test   # the same for the test suite, plus a table per task

"Single-run wall time": one Adam run (lr 1e-3, one seed, the task's horizon, the suite's evaluation points),
compilation included, measured with `time.perf_counter` on this machine.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import optax


def tasks_table(only=None) -> str:
  from metafam.benchmark import baselines as bl
  from metafam.benchmark.suites import HORIZONS
  from metafam.benchmark.sweep import train_lanes
  from metafam.tasks._nn import num_params
  from metafam.tasks.registry import get_task
  lines = ["| task | parameters | horizon | batch | data | single-run wall time (s) |",
           "|---|---:|---:|---:|---|---:|"]
  unknown = sorted(set(only or ()) - set(HORIZONS))
  if unknown:
    raise SystemExit(f"--tasks: {unknown} are not heldout tasks; valid: {sorted(HORIZONS)}")
  for name, horizon in HORIZONS.items():
    if only is not None and name not in only:
      continue
    task = get_task(name)
    params = num_params(task.init(jax.random.key(0)))
    start = time.perf_counter()
    train_lanes(task, optax.adam(1e-3), None, num_seeds=1, points=bl.eval_steps(horizon), eval_batches=bl.EVAL_BATCHES,
                key=bl.task_key(name), splits=bl.SPLITS)
    wall = time.perf_counter() - start
    batch = next(iter(task.datasets.abstract_batch.values())).shape[0]
    data = "Shakespeare" if name.startswith("shakespeare") else ("MNIST" if name.startswith("mnist") else
                                                                 "Fashion-MNIST")
    lines.append(f"| `{name}` | {params:,} | {horizon:,} | {batch} | {data} | {wall:.1f} |")
    print(lines[-1], file=sys.stderr)
  return "\n".join(lines)


def baselines_table(suite: str = "heldout") -> str:
  from metafam.benchmark.heldout import LOSS_GAIN_IQM, baseline_evaluations, load_normalizers
  data = load_normalizers(suite=suite)
  evaluations = baseline_evaluations(data)
  lines = ["| optimizer | IQM speedup [95% CI] | median speedup [95% CI] | optimality gap [95% CI] | "
           "IQM loss gain [95% CI] | best final loss on | mean rank | warmup+cosine chosen |",
           "|---|---|---|---|---|---|---:|---:|"]
  finals = {t: {o: e.scores[i].final_loss for o, e in evaluations.items()}
            for i, t in enumerate(data["tasks"])}
  for opt, e in evaluations.items():
    a = e.aggregates
    ci = lambda k: f"{a[k].value:.2f} [{a[k].low:.2f}, {a[k].high:.2f}]"
    wins = [t for t, f in finals.items() if min(f, key=f.get) == opt]
    cosine = sum(s.setting["schedule"] == "warmup_cosine" for s in e.scores)
    rank = sum(s.rank for s in e.scores) / len(e.scores)
    lines.append(f"| {opt} | {ci('iqm')} | {ci('median')} | {ci('optimality_gap')} | {ci(LOSS_GAIN_IQM)} | "
                 f"{', '.join(f'`{w}`' for w in wins) or '-'} | {rank:.1f} | {cosine}/{len(e.scores)} |")
  lines.append("")
  lines.append(f"Tasks: {len(data['tasks'])} complete; pending: {', '.join(data['pending']) or 'none'}.")
  lines += ["", "Per task: speedup (capped at 4), then in brackets the final loss over tuned Adam's and the seeds' "
            "mean loss gain.", "", "| task | " + " | ".join(evaluations) + " |",
            "|---|" + "---|" * len(evaluations)]
  for i, task in enumerate(data["tasks"]):
    cells = [f"{s.speedup:.2f} ({s.loss_ratio:.3f}, {s.loss_gain:.3f})"
             for s in (e.scores[i] for e in evaluations.values())]
    lines.append(f"| `{task}` | " + " | ".join(cells) + " |")
  if "muon" in evaluations:
    lines += ["", muon_facts(data, evaluations)]
  return "\n".join(lines)


def muon_facts(data, evaluations) -> str:
  """Tuned Muon against the other baselines, paired, and what the speedup cap leaves to beat it: the numbers the
  docs' prose quotes, so that they are regenerated with the tables."""
  import numpy as np
  from metafam.benchmark import paired
  from metafam.benchmark.heldout import PAIRED_HEADERS, paired_rows
  muon = evaluations["muon"]
  tasks = list(data["tasks"])
  seeds = muon.seed_speedups(tasks)
  caps = np.array([data["tasks"][t]["reference"]["eval_steps"][-1] / data["tasks"][t]["horizon"]
                   for t in tasks])
  at_cap = seeds >= caps[None, :]
  below = [f"{t} {np.round(seeds[~at_cap[:, i], i], 2).tolist()}" for i, t in enumerate(tasks)
           if not at_cap[:, i].all()]
  ceiling = paired.probability_of_improvement(np.broadcast_to(caps, seeds.shape), seeds)
  headers = ["muon against"] + PAIRED_HEADERS[1:]
  return "\n".join([
      f"Tuned Muon's per-seed speedup is at the cap on {int(at_cap.sum())} of {at_cap.size} (task, seed) pairs; "
      f"below it: {'; '.join(below) or 'none'}. A candidate at the cap on every seed would score P(candidate > muon) "
      f"= {ceiling.value:.2f} [{ceiling.low:.2f}, {ceiling.high:.2f}] on speedups.", "",
      "| " + " | ".join(headers) + " |", "|---" * len(headers) + "|",
      *("| " + " | ".join(map(str, row)) + " |" for row in paired_rows(muon, evaluations))])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("table", choices=["tasks", "baselines"])
  parser.add_argument("--tasks", nargs="+", default=None, help="with `tasks`: only these heldout tasks (default all)")
  parser.add_argument("--suite", choices=["heldout", "test"], default="heldout",
                      help="with `baselines`: the suite whose shipped baselines are tabulated")
  args = parser.parse_args(argv)
  if args.table == "tasks" and args.suite != "heldout":
    parser.error("--suite applies to the `baselines` table; `tasks` lists the heldout suite's tasks")
  print(tasks_table(args.tasks) if args.table == "tasks" else baselines_table(args.suite))


if __name__ == "__main__":
  main()
