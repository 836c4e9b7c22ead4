"""Markdown tables of the heldout and test suites for docs/results/heldout.md and docs/results/test.md.

    python tools/heldout_tables.py tasks       # params, horizon, batch, data, single-run wall time (trains Adam once)
    python tools/heldout_tables.py baselines   # every shipped baseline's metrics (from the normalizer file)
    python tools/heldout_tables.py baselines --suite test   # the same for the test suite, plus a table per task
    python tools/heldout_tables.py headline --suite test --ruleset self_tuning   # the headline of docs/results
    python tools/heldout_tables.py docs        # every headline table in README.md and docs/results/, rewritten

``docs``: each block between ``<!-- generated: headline --suite S --ruleset R -->`` and ``<!-- /generated -->`` in
README.md and docs/results/*.md is replaced by that command's table (the README shows the first table only, the
summary without the per-task one); the files are written atomically, and only when a table changed.

``headline``: every shipped baseline and the shipped pretrained optimizers of one suite under one ruleset, in one
pool (`metafam.benchmark.score`): the profile score (AlgoPerf's B over the time ratios to the pool's fastest), the
median time ratio, the tasks where a row is the pool's fastest, VeLO's speedup over tuned Adam with the number of
tasks where it is only a bound (capped at 4), and a per-task table of time ratios. The pretrained optimizers' runs
are read from their cached suite evaluations under experiments/results (`PRETRAINED_RUNS`; a row without one is
listed as not run); under the self-tuning ruleset the baselines' single-setting runs are trained where they differ
from the shipped ones and kept under experiments/results/headline/.

"Single-run wall time": one Adam run (lr 1e-3, one seed, the task's horizon, the suite's evaluation points),
compilation included, measured with `time.perf_counter` on this machine.
"""

from __future__ import annotations

import argparse
import os
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
  from metafam.benchmark.heldout import baseline_evaluations, load_normalizers
  from metafam.evaluation.scores import LOSS_GAIN_IQM
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
  from metafam.benchmark.report import PAIRED_HEADERS, paired_rows
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


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRETRAINED_RUNS = {  # (suite, ruleset) -> {pretrained optimizer: its cached evaluate_suite run}
    ("heldout", "external"): {"generalist_v1": "experiments/results/heldout_generalist_v1_tasks"},
    ("heldout", "self_tuning"): {"generalist_v2": "experiments/results/candidate_e/dev_self_tuning_step2002_tasks"},
    ("test", "external"): {"generalist_v1": "experiments/results/test_generalist_v1_tasks",
                           "generalist_v2": "experiments/results/candidate_e/test_tuned_step2002_tasks"},
    ("test", "self_tuning"): {"generalist_v2": "experiments/results/candidate_e/test_self_tuning_step2002_tasks"},
}


def headline_table(suite: str, ruleset: str) -> str:
  import numpy as np
  from metafam.benchmark import score
  from metafam.benchmark.heldout import in_pool, load_cached_evaluation
  from metafam.evaluation.scores import LOSS_GAIN_IQM, PROFILE_SCORE
  from metafam.pretrained import PRETRAINED
  data = None
  report = score(None, suite=suite, ruleset=ruleset, progress=False, confirm_test=suite == "test",
                 cache_dir=os.path.join(ROOT, "experiments", "results", "headline", f"{suite}_{ruleset}"))
  rows = dict(report.rows)
  tasks = max(([s.task for s in e.scores] for e in rows.values()), key=len)
  missing = []
  for name in PRETRAINED:
    path = PRETRAINED_RUNS.get((suite, ruleset), {}).get(name)
    if path is None:
      missing.append(name)
      continue
    rows[name] = load_cached_evaluation(os.path.join(ROOT, path), suite=suite, tasks=tasks, name=name)
  partial = {k: len(v.scores) for k, v in rows.items() if len(v.scores) < len(tasks)}  # still being generated
  rows = {k: v for k, v in rows.items() if k not in partial}
  rows = in_pool(rows, data, with_baselines=ruleset == "external")
  ci = lambda a: f"{a.value:.2f} [{a.low:.2f}, {a.high:.2f}]"
  lines = [f"Suite `{suite}`, ruleset `{ruleset}`: {len(tasks)} tasks, 3 seeds; one pool of {len(rows)} optimizers.",
           "", "| optimizer | setting | profile score [95% CI] | median time ratio | lowest ratio on | "
           "IQM speedup over tuned Adam [95% CI] | speedup only a bound on | IQM loss gain [95% CI] |",
           "|---|---|---|---:|---:|---|---:|---|"]
  lowest = np.min([[s.time_ratio for s in e.scores] for e in rows.values()], axis=0)
  for name, e in sorted(rows.items(), key=lambda kv: -kv[1].aggregates[PROFILE_SCORE].value):
    ratios = np.array([s.time_ratio for s in e.scores])
    setting = report.settings.get(name, "per task" if ruleset == "external" else "its default rate")
    lines.append(f"| {name} | {setting} | {ci(e.aggregates[PROFILE_SCORE])} | {np.median(ratios):.2f} | "
                 f"{int(np.sum(ratios <= lowest + 1e-9))} | {ci(e.aggregates['iqm'])} | "
                 f"{sum(s.speedup_capped for s in e.scores)} | {ci(e.aggregates[LOSS_GAIN_IQM])} |")
  lines += ["", "Not in the pool (no cached run of this suite and ruleset): " + (", ".join(missing) or "none") + "; "
            "baselines still being generated: " + (", ".join(f"{k} ({n} of {len(tasks)} tasks)"
                                                          for k, n in partial.items()) or "none") + ".",
            "", "Time ratio per task (T over the fewest steps any row needed to reach the row's loss at T; 1.00: nobody "
            "got there sooner):", "",
            "| task | " + " | ".join(rows) + " |", "|---|" + "---:|" * len(rows)]
  for i, task in enumerate(tasks):
    lines.append(f"| `{task}` | " + " | ".join(f"{e.scores[i].time_ratio:.2f}" for e in rows.values()) + " |")
  return "\n".join(lines)


MARKER = "<!-- generated: "
END_MARKER = "<!-- /generated -->"


def _generated(command: str, cache: dict) -> str:
  """The table a marker's command names (``headline --suite S --ruleset R [--summary]``), computed once per run."""
  args = command.split()
  if args[:1] != ["headline"] or "--suite" not in args or "--ruleset" not in args:
    raise SystemExit(f"docs: unknown generated block {command!r}; expected 'headline --suite S --ruleset R'")
  key = (args[args.index("--suite") + 1], args[args.index("--ruleset") + 1])
  if key not in cache:
    cache[key] = headline_table(*key)
  table = cache[key]
  if "--summary" in args:  # the first table alone (the README)
    lines = table.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| optimizer"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    table = "\n".join(lines[start:end])
  return table


def rewrite_docs(paths) -> list:
  """Rewrites every generated block of ``paths`` (see the module docstring); returns the paths changed."""
  from metafam.io import atomic_write
  cache, changed = {}, []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      text = f.read()
    out, pos = [], 0
    while (start := text.find(MARKER, pos)) >= 0:
      head_end = text.index("-->", start) + len("-->")
      end = text.find(END_MARKER, head_end)
      if end < 0:
        raise SystemExit(f"{path}: a generated block opened at offset {start} is never closed with {END_MARKER}")
      command = text[start + len(MARKER):head_end - len("-->")].strip()
      out += [text[pos:head_end], "\n", _generated(command, cache), "\n"]
      pos = end
    new = "".join(out) + text[pos:]
    if new != text:
      atomic_write(path, new.encode("utf-8"))
      changed.append(path)
  return changed


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("table", choices=["tasks", "baselines", "headline", "docs"])
  parser.add_argument("--tasks", nargs="+", default=None, help="with `tasks`: only these heldout tasks (default all)")
  parser.add_argument("--suite", choices=["heldout", "test"], default="heldout",
                      help="with `baselines` or `headline`: the suite whose shipped baselines are tabulated")
  parser.add_argument("--ruleset", choices=["external", "self_tuning"], default="external",
                      help="with `headline`: per-task tuning or one setting for the whole suite")
  args = parser.parse_args(argv)
  if args.table == "tasks" and args.suite != "heldout":
    parser.error("--suite applies to the `baselines` table; `tasks` lists the heldout suite's tasks")
  if args.table == "docs":
    import glob
    paths = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "results", "*.md")))
    changed = rewrite_docs(paths)
    print("rewritten: " + (", ".join(os.path.relpath(p, ROOT) for p in changed) or "nothing (every table is current)"))
  elif args.table == "headline":
    print(headline_table(args.suite, args.ruleset))
  else:
    print(tasks_table(args.tasks) if args.table == "tasks" else baselines_table(args.suite))


if __name__ == "__main__":
  main()
