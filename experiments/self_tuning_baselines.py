"""Each dev-suite baseline's best single learning rate (the self-tuning rule), and optionally its curves at that rate.

    python experiments/self_tuning_baselines.py                      # the table, from the shipped sweeps only
    python experiments/self_tuning_baselines.py --train [--tasks a,b] [--optimizers adam,muon] [--cache_dir DIR]

Without ``--train`` it prints, per baseline of the heldout (development) suite, the single (schedule, rate) with
the lowest geometric-mean regret over the suite's 17 tasks (`metafam.benchmark.single_rate.best_single_rate`, from
the selection scores the shipped sweeps hold), the number of tasks whose tuned rate is within one grid step (half a
decade) of it, and the number of tasks where its curves are not the shipped ones (its tuned setting differs), which
``--train`` must train.

With ``--train`` the baselines run at their single setting on ``--tasks`` (default every dev task; shipped curves are
reused where the tuned setting is the single one) and are scored like a candidate; the script prints and writes
(``--out``, Markdown) per baseline the IQM speedup and loss gain at its single setting and tuned per task on the same
tasks, and the paired comparison of the two (P(single > tuned) with its bootstrap interval, and the IQM differences):
what dropping per-task tuning costs each baseline. ``--cache_dir`` keeps each trained (baseline, task) so an
interrupted run resumes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from metafam.benchmark import baseline_files as bf
from metafam.benchmark import heldout
from metafam.benchmark import report
from metafam.benchmark import self_tuning as st
from metafam.benchmark import single_rate as sr
from metafam.evaluation.scores import LOSS_GAIN_IQM

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "self_tuning_baselines.md")


def markdown(headers, rows):
  lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
  lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
  return "\n".join(lines)


def interval(a):
  return f"{a.value:.2f} [{a.low:.2f}, {a.high:.2f}]"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--optimizers", default="", help="comma-separated baselines (default: all nine)")
  parser.add_argument("--tasks", default="", help="comma-separated dev tasks to train on with --train (default: all)")
  parser.add_argument("--train", action="store_true", help="run the baselines at their single setting and score them")
  parser.add_argument("--cache_dir", default=None, help="keep each trained (baseline, task) here (resumable)")
  parser.add_argument("--out", default=DEFAULT_OUT, help="the Markdown file --train writes")
  args = parser.parse_args(argv)
  data = heldout.load_normalizers(suite="heldout")
  everyone = list(bf.suite_spec("heldout").optimizers)
  optimizers = [o for o in args.optimizers.split(",") if o] or everyone
  tasks = [t for t in args.tasks.split(",") if t] or list(data["tasks"])
  bad = [o for o in optimizers if o not in everyone]
  if bad:
    parser.error(f"--optimizers: {bad} are not baselines of the heldout suite; valid: {everyone}")
  bad = [t for t in tasks if t not in data["tasks"]]
  if bad:
    parser.error(f"--tasks: {bad} are not heldout tasks; valid: {list(data['tasks'])}")
  choices = {o: sr.best_single_rate(data, o) for o in optimizers}
  table = markdown(sr.CHOICE_HEADERS, sr.choice_rows(choices))
  print(table, flush=True)
  if not args.train:
    return 0
  start = time.perf_counter()
  _, single = st.self_tuning_baselines(suite="heldout", data=data, dev_data=data, optimizers=optimizers, tasks=tasks,
                                       cache_dir=args.cache_dir, progress=True)
  wall = time.perf_counter() - start
  headers = ["baseline", "single setting", "trained runs", "IQM speedup, single", "IQM speedup, tuned",
             "IQM loss gain, single", "IQM loss gain, tuned", "P(single > tuned)", "IQM difference",
             "P(lower loss)", "IQM loss-gain difference", "tasks"]
  rows = []
  for o in optimizers:
    entries = {t: data["tasks"][t]["baselines"][o] for t in tasks}
    tuned = st.score_curves(f"{o} tuned", {t: e["test_curves"] for t, e in entries.items()}, data, exclude=(o,),
                            settings={t: {"learning_rate": e["learning_rate"], "schedule": e["schedule"]}
                                      for t, e in entries.items()})
    s = single[o]
    paired = report.paired_rows(s, {"tuned": tuned})[0]
    trained = sum(1 for score in s.scores if not score.setting["shipped"])
    c = choices[o]
    rows.append([o, f"{c.schedule} {c.learning_rate:.3g}", f"{trained} ({s.wall_time:.0f} s)",
                 interval(s.aggregates["iqm"]), interval(tuned.aggregates["iqm"]),
                 interval(s.aggregates[LOSS_GAIN_IQM]), interval(tuned.aggregates[LOSS_GAIN_IQM]),
                 *paired[1:5], paired[5]])
    print(f"{o}: done", flush=True)
  comparison = markdown(headers, rows)
  print(comparison)
  command = "python experiments/self_tuning_baselines.py " + " ".join(sys.argv[1:] if argv is None else argv)
  text = (f"# Dev-suite baselines at their best single rate\n\n`{command.strip()}` ({wall:.0f} s of wall time, "
          f"{time.strftime('%Y-%m-%d', time.gmtime())}); tasks: {', '.join(f'`{t}`' for t in tasks)}.\n\n"
          "The single setting is chosen over all 17 dev tasks (geometric-mean regret of the selection scores; "
          "`metafam.benchmark.self_tuning`):\n\n" + table + "\n\nScored on the tasks above (speedups over tuned Adam; "
          "'tuned' is the shipped per-task tuning, 'single' the baseline at its single setting; the paired columns "
          "compare single with tuned, seed by seed):\n\n" + comparison + "\n")
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(text)
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
