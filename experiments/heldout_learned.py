"""A learned optimizer on the heldout suite, with its step scale fixed or tuned per task like a learning rate.

    python experiments/heldout_learned.py [--checkpoint runs/meta_train/checkpoint.npz] [--tune_step]
    python experiments/heldout_learned.py --pretrained generalist_v1 --schedules constant warmup_cosine --out DIR
    python experiments/heldout_learned.py --pretrained generalist_v1 --suite test --confirm_test --out DIR

Without ``--checkpoint`` the optimizer's initial theta is scored. With ``--tune_step`` its updates are scaled by
``rate / --step_mult`` and the rate is tuned per task by the baselines' own procedure (same 7-point grid half a
decade apart, centred on ``--step_mult``; same seeds; selection on ``inner_valid``; constant schedule), which is the
same as tuning the optimizer's ``step_mult`` (its step is linear in it). Prints the suite's aggregates, how many
tasks end below tuned Adam's final loss and above 1.5x of it, and the divergences.

``--pretrained NAME`` scores a shipped optimizer of `metafam.pretrained` through its optax face,
``optax_transform(NAME, rate)``, with the rate tuned per task on the grid around ``--step_mult`` (``--tune_step`` is
implied; the optimizer's step is the rate). ``--out DIR`` writes the suite report (`write_suite_report`: per-task
scores, per-seed speedups, the paired comparisons with every shipped baseline). ``--suite test`` scores on the test
suite, which needs ``--confirm_test`` (it is run once per shipped optimizer). ``--cache_dir DIR`` keeps each finished
task's curves there, so that running the same command again resumes an interrupted evaluation (at about 10 minutes
per task on 2 cores for a tuned candidate, a whole suite takes hours); the files record the command's settings and
a directory of another setting is refused.

``--versus DIR ...`` reads the evaluations earlier runs of this script left in those ``--cache_dir`` directories
(`load_cached_evaluation`; nothing is retrained) and adds the paired comparison with each to the report, e.g. a new
candidate against ``generalist_v1`` on the test suite with ``--versus experiments/results/test_generalist_v1_tasks``.

``--single_rate_baselines adam muon`` (self-tuning score only, i.e. without ``--tune_step``) also runs those
baselines at their single best setting over the dev suite (AlgoPerf's self-tuning rule,
`metafam.benchmark.self_tuning`) on the scored tasks and prints the paired comparison with each.

``--vs_init`` (with ``--checkpoint``) also scores the optimizer at its initial theta, with the same settings (its
tasks cached under ``CACHE_DIR/initial_theta``), and prints the paired comparison of the trained theta with it:
P(trained > initial) and the IQM differences of the per-seed speedups and loss gains, i.e. whether meta-training
paid on this suite.
"""
import argparse
import functools
import hashlib
import json
import os
import sys
import time

import jax
import numpy as np
import optax

from metafam.benchmark import (baseline_evaluations, evaluate_suite, format_suite, load_cached_evaluation,
                               load_normalizers, write_suite_report)
from metafam.benchmark.heldout import check_suite_choice
from metafam.benchmark.report import PAIRED_HEADERS, paired_rows
from metafam.benchmark.report import format_table
from metafam.benchmark.runner import load_theta
from metafam.optimizers.registry import get_learned_optimizer


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--optimizer", default="adafac_muon_mlp_lopt", help="a registered learned optimizer")
  p.add_argument("--kwargs", default="{}", help="JSON object of constructor arguments for an ablation, e.g. "
                 "'{\"orthogonal_momentum\": false}'; a --checkpoint's recipe gives those not named here")
  p.add_argument("--checkpoint", default=None, help="a meta-train checkpoint (default: the initial theta)")
  p.add_argument("--step_mult", type=float, default=None,
                 help="the step scale it was meta-trained with (default: the --checkpoint's recipe's, else 0.01)")
  p.add_argument("--tune_step", action="store_true", help="tune the step scale per task like a learning rate")
  p.add_argument("--grid_halfwidth", type=int, default=3,
                 help="with --tune_step: the grid reaches this many half-decades either side of --step_mult")
  p.add_argument("--schedules", nargs="+", default=["constant"], choices=["constant", "warmup_cosine"],
                 help="with --tune_step: the schedules tried per task, as for the baselines")
  p.add_argument("--pretrained", default=None, help="a shipped optimizer of metafam.pretrained (e.g. generalist_v1)")
  p.add_argument("--suite", default="heldout", choices=["heldout", "test"], help="the suite scored on")
  p.add_argument("--confirm_test", action="store_true", help="needed with --suite test (run once per optimizer)")
  p.add_argument("--out", default=None, help="write the suite report (JSON, CSV, plots) to this directory")
  p.add_argument("--tasks", nargs="+", default=None, help="a subset of the suite's tasks (default: all)")
  p.add_argument("--cache_dir", default=None, help="keep each finished task here; the same command again resumes")
  p.add_argument("--vs_init", action="store_true",
                 help="with --checkpoint: also score the initial theta and compare the two, paired")
  p.add_argument("--versus", nargs="+", default=[], metavar="CACHE_DIR",
                 help="also compare, paired, with the evaluations an earlier run left in these --cache_dir "
                      "directories on the same suite (e.g. experiments/results/test_generalist_v1_tasks); nothing in "
                      "them is retrained")
  p.add_argument("--single_rate_baselines", nargs="+", default=[], metavar="BASELINE",
                 help="without --tune_step (the self-tuning score): also run these baselines of the suite at their "
                      "single best setting over the dev suite on the same tasks (cached under "
                      "CACHE_DIR/single_rate_baselines) and compare the candidate with each, paired")
  p.add_argument("--lane_chunk", type=int, default=None,
                 help="update the rate x seed lanes in blocks of this many (1: faster on a CPU for Newton-Schulz "
                      "optimizers; only float rounding differs; default: the optimizer's own choice)")
  args = p.parse_args()
  try:
    check_suite_choice(args.suite, args.confirm_test, flags=True)
  except ValueError as e:
    p.error(str(e))
  if args.vs_init and (args.checkpoint is None or args.pretrained is not None):
    p.error("--vs_init compares a --checkpoint's theta with the optimizer's initial theta: give --checkpoint "
            "(and no --pretrained)")
  if args.pretrained is not None:
    from metafam import pretrained  # pylint: disable=import-outside-toplevel
    if args.pretrained not in pretrained.list():
      p.error(f"--pretrained: {args.pretrained!r} is not a shipped optimizer; choose from "
              f"{', '.join(pretrained.list())}")
  try:
    kwargs_ok = isinstance(json.loads(args.kwargs), dict)
  except json.JSONDecodeError:
    kwargs_ok = False
  if not kwargs_ok:
    p.error(f"--kwargs must be a JSON object of constructor arguments, e.g. '{{\"lr_spread\": 3.0}}'; got "
            f"{args.kwargs!r}")
  if args.single_rate_baselines:
    from metafam.benchmark import baseline_files  # pylint: disable=import-outside-toplevel
    valid = list(baseline_files.suite_spec(args.suite).optimizers)
    bad = [b for b in args.single_rate_baselines if b not in valid]
    if bad:
      p.error(f"--single_rate_baselines: {bad} are not baselines of the {args.suite} suite; valid: {valid}")
    if args.tune_step or args.pretrained:
      p.error("--single_rate_baselines belongs to the self-tuning score: a fixed step scale, without --tune_step or "
              "--pretrained")
  versus = {}
  for path in args.versus:  # read before any training: a wrong directory fails in seconds, not after the suite
    try:
      earlier = load_cached_evaluation(path, suite=args.suite, tasks=args.tasks)
    except ValueError as e:
      p.error(f"--versus: {e}")
    versus[earlier.name] = earlier
  if args.checkpoint:
    recipe_defaults(p, args)
  elif args.step_mult is None:
    args.step_mult = 1e-2
  # What a cached task must have been computed with, beyond what evaluate_suite sees (the factories' construction).
  setting = {k: getattr(args, k) for k in ("optimizer", "kwargs", "step_mult", "tune_step", "pretrained")}
  if args.checkpoint:
    with open(args.checkpoint, "rb") as f:  # its contents: a resumed meta-training run rewrites the same path
      setting["checkpoint_sha256"] = hashlib.sha256(f.read()).hexdigest()
  suite = dict(suite=args.suite, confirm_test=args.confirm_test, cache_dir=args.cache_dir, cache_identity=setting,
               lane_chunk="auto" if args.lane_chunk is None else args.lane_chunk)
  grid = args.step_mult * 10 ** (0.5 * np.arange(-args.grid_halfwidth, args.grid_halfwidth + 1))
  start = time.perf_counter()
  if args.pretrained:
    factory = functools.partial(pretrained.optax_transform, args.pretrained)
    factory.__name__ = args.pretrained
    evaluation = evaluate_suite(factory, learning_rates=grid, schedules=args.schedules, tasks=args.tasks, **suite)
    return report(evaluation, time.perf_counter() - start, args, versus)
  lopt = get_learned_optimizer(args.optimizer, **{"step_mult": args.step_mult, **json.loads(args.kwargs)})

  def score(theta, **changes):
    if not args.tune_step:
      return evaluate_suite((lopt, theta), tasks=args.tasks, **{**suite, **changes})
    def scaled(learning_rate, num_steps=None):  # the learned update times rate / step_mult (a schedule or a number)
      rate = learning_rate if callable(learning_rate) else (lambda count: learning_rate)
      base = lopt.as_optax(theta, num_steps) if getattr(lopt, "uses_horizon", False) else lopt.as_optax(theta)
      return optax.chain(base, optax.scale_by_schedule(lambda count: rate(count) / args.step_mult))

    scaled.__name__ = f"{args.optimizer}_tuned_step"
    if args.lane_chunk is None:  # a factory has no lane_chunk of its own: the learned optimizer's
      changes = {"lane_chunk": getattr(lopt, "lane_chunk", None), **changes}
    return evaluate_suite(scaled, learning_rates=grid, schedules=args.schedules, tasks=args.tasks,
                          **{**suite, **changes})

  initial = lopt.init(jax.random.key(0))
  evaluation = score(initial if args.checkpoint is None else load_theta(args.checkpoint))
  report(evaluation, time.perf_counter() - start, args, versus)
  if args.single_rate_baselines:
    single_rate(evaluation, args)
  if args.vs_init:
    untrained = {k: v for k, v in setting.items() if k != "checkpoint_sha256"}
    init_evaluation = score(initial, name=f"{evaluation.name} (initial theta)", cache_identity=untrained,
                            cache_dir=args.cache_dir and os.path.join(args.cache_dir, "initial_theta"))
    print(format_table(PAIRED_HEADERS, paired_rows(evaluation, {"initial theta": init_evaluation})))


def single_rate(evaluation, args):
  """The self-tuning score's comparison: each of ``--single_rate_baselines`` at its best single dev-suite setting
  (`metafam.benchmark.self_tuning`), trained on the candidate's tasks where that setting is not a task's tuned one."""
  from metafam.benchmark import self_tuning  # pylint: disable=import-outside-toplevel
  cache = args.cache_dir and os.path.join(args.cache_dir, "single_rate_baselines")
  _, single = self_tuning.self_tuning_baselines(suite=args.suite, optimizers=args.single_rate_baselines,
                                                tasks=[s.task for s in evaluation.scores], cache_dir=cache,
                                                progress=True)
  print(format_table(self_tuning.SELF_TUNING_HEADERS, self_tuning.self_tuning_rows(evaluation, single)))
  for name, b in single.items():
    print(f"{name} at its single setting: IQM speedup {b.aggregates['iqm'].value:.2f} "
          f"[{b.aggregates['iqm'].low:.2f}, {b.aggregates['iqm'].high:.2f}], {b.wall_time:.0f} s of training")


def recipe_defaults(parser, args):
  """Complete ``args`` from the recipe a --checkpoint records (a run's checkpoint, or a theta file written by
  `export_pretrained.py --candidate`): the optimizer must be the recipe's, and the recipe's ``optimizer_kwargs`` and
  ``step_mult`` apply where ``--kwargs`` and ``--step_mult`` do not name them. A theta is only meaningful with the
  settings it was trained under (e.g. candidate c's ``conv_kernels``), and nothing in its shapes tells them apart."""
  from metafam.runs import checkpoint  # pylint: disable=import-outside-toplevel
  from metafam.compat import flax_msgpack  # pylint: disable=import-outside-toplevel
  if not os.path.isfile(args.checkpoint):
    parser.error(f"--checkpoint: no file {args.checkpoint!r}")
  metadata = {} if flax_msgpack.looks_like_msgpack(args.checkpoint) else checkpoint.read_metadata(args.checkpoint)
  recipe = metadata.get("recipe") or (metadata.get("config") or {}).get("recipe") or {}
  if recipe.get("optimizer") not in (None, args.optimizer):
    parser.error(f"--optimizer {args.optimizer!r}: {args.checkpoint} was meta-trained with {recipe['optimizer']!r}")
  given = json.loads(args.kwargs)
  taken = {k: v for k, v in (recipe.get("optimizer_kwargs") or {}).items() if k not in given}
  if taken:
    args.kwargs = json.dumps({**given, **taken}, sort_keys=True)
  if args.step_mult is None:
    args.step_mult = float(recipe.get("step_mult", 1e-2))
  if taken or recipe:
    print(f"{args.checkpoint}: recipe {recipe.get('name')!r}; optimizer kwargs {args.kwargs}, step_mult "
          f"{args.step_mult:g}", file=sys.stderr)


def report(evaluation, wall, args, versus):
  if args.out:
    baselines = {**baseline_evaluations(load_normalizers(suite=args.suite)), **versus}
    print(format_suite(evaluation, baselines))
    print("wrote", ", ".join(write_suite_report(evaluation, args.out, baselines)))
  elif versus:
    print(format_table(PAIRED_HEADERS, paired_rows(evaluation, versus)))
  for key, a in evaluation.aggregates.items():
    print(f"{key}: {a.value:.2f} [{a.low:.2f}, {a.high:.2f}]")
  ratios = [s.loss_ratio for s in evaluation.scores]
  print(f"final loss below tuned Adam's on {sum(r < 1 for r in ratios)} / {len(ratios)} tasks, above 1.5x on "
        f"{sum(r > 1.5 for r in ratios)}; diverged on {sum(bool(s.diverged) for s in evaluation.scores)}; "
        f"{wall:.0f} s in this run, {evaluation.wall_time:.0f} s of training in all (a cached task counts the time it "
        "took)")


if __name__ == "__main__":
  main()
