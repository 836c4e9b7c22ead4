"""Benchmarking optimizers on task suites against learning-rate-tuned baselines.

* `suites`: named suites of registered tasks (``tiny``, ``small``, ``full``, ``heldout`` (dev) and ``test``).
* `sweep`: `train_lanes`, the vmapped (setting x seed) lanes every tuning sweep trains, and the selection rule.
* `runner`: optimizers by name or checkpoint (`optimizer_by_name`, `learned_optimizer`, `load_theta`).
* normalized losses, speedup over tuned Adam, median / IQM with bootstrap confidence intervals: they live in
  `metafam.evaluation.metrics`, the lower layer, and the most used are exported here.
* `report`: the reports of a suite evaluation: aligned terminal tables, CSV, the JSON record and the figures.
* `baselines`: the tuning procedure of every tuned baseline (rate grid x schedules x seeds per task, Adam's
  reference run); `baseline_files`: what each suite's shipped baselines are made of (`SuiteSpec`), their shards, the
  shipped files of ``heldout`` and ``test``, and `custom_data` for any tasks.
* `scoring`: `score`, the one scoring path: a candidate and the shipped baselines of ``heldout`` or ``test`` in one
  pool under either ruleset (external: tuned per task; self-tuning: one setting per suite), as a `SuiteReport`
  whose headline is the profile score (AlgoPerf's B over time ratios to the pool's fastest).
* `candidates`: what a suite scores (a factory of a float learning rate, a `schedule_factory`, a registered name, a
  named transformation, a learned optimizer), resolved and checked before any training.
* `heldout`: `evaluate_suite` (one candidate's runs on ``heldout`` or ``test``, scored by the one engine,
  `metafam.evaluation.scores`), cached runs, tables and report files.
* `self_tuning`: the self-tuning score (each baseline at one setting for a whole suite: its curves and scores);
  `single_rate`: that setting, the lowest geometric-mean regret over the development suite's sweeps.
* `paired`: paired comparisons of two optimizers on the same (task, seed) runs: `probability_of_improvement` and
  the paired bootstrap `difference` of an aggregate (IQM by default).
* `planted` (``from metafam.benchmark import planted``): planted problems whose meta-training answer is known (a
  matrix quadratic family, the rate sweep that finds the best step gain, the drift test for a meta-parameter with
  no effect); tests/benchmark/test_planted.py and docs/guide/planted.md.
"""

from metafam.evaluation.metrics import (Aggregate, RunCurves, Speedup, aggregate, iqm, median, running_min,
                                        speedup_over_baseline)
from metafam.evaluation.scores import SuiteEvaluation, TaskScore, score_task
from metafam.benchmark.heldout import baseline_evaluations, evaluate_suite, load_cached_evaluation, load_normalizers
from metafam.benchmark.report import format_suite, write_suite_report
from metafam.benchmark.candidates import resolve as resolve_candidate, schedule_factory
from metafam.benchmark.paired import difference, probability_of_improvement
from metafam.benchmark.scoring import RULESETS, SuiteReport, score
from metafam.benchmark.report import format_table
from metafam.benchmark.runner import learned_optimizer, load_theta
from metafam.benchmark.suites import SUITES, get_suite, list_suites, resolve_tasks
from metafam.benchmark.sweep import train_lanes
from metafam.evaluation.tuning import default_learning_rates, select_best

__all__ = ["Aggregate", "RunCurves", "Speedup", "aggregate", "iqm", "median", "running_min", "speedup_over_baseline",
           "format_table", "learned_optimizer", "load_theta", "SUITES", "get_suite", "list_suites",
           "resolve_tasks", "default_learning_rates", "select_best", "train_lanes", "SuiteEvaluation", "TaskScore",
           "baseline_evaluations", "evaluate_suite",
           "format_suite", "load_cached_evaluation", "load_normalizers", "score_task", "write_suite_report",
           "difference", "probability_of_improvement", "RULESETS", "SuiteReport", "score", "resolve_candidate",
           "schedule_factory"]
