"""Benchmarking optimizers on task suites against learning-rate-tuned baselines.

* `suites`: named suites of registered tasks (``tiny``, ``small``, ``full``, ``heldout`` (dev) and ``test``).
* `sweep`: vmapped learning-rate sweeps of optax optimizers and the selection rule.
* `runner`: `run_benchmark`, which tunes the baselines and runs any optimizers (vmapped over seeds).
* `metrics`: normalized losses, speedup over tuned Adam, median / IQM with bootstrap confidence intervals (they
  live in `metafam.evaluation.metrics`, the lower layer, and are re-exported here).
* `report`: aligned terminal tables, CSV / JSON files and (with matplotlib) PNG figures.
* `baselines`: the tuned baselines of the ``heldout`` and ``test`` suites (procedure, shards, the shipped files).
* `heldout`: `evaluate_suite`, which scores one optimizer on ``heldout`` or ``test`` against the shipped baselines.
* `paired`: paired comparisons of two optimizers on the same (task, seed) runs: `probability_of_improvement` and
  the paired bootstrap `difference` of an aggregate (IQM by default).
* `planted` (``from metafam.benchmark import planted``): planted problems whose meta-training answer is known (a
  matrix quadratic family, the rate sweep that finds the best step gain, the drift test for a meta-parameter with
  no effect); tests/test_planted.py and docs/guide/planted.md.
"""

from metafam.evaluation.metrics import (Aggregate, RunCurves, Speedup, aggregate, iqm, median, running_min,
                                        speedup_over_baseline)
from metafam.benchmark.heldout import (SuiteEvaluation, TaskScore, baseline_evaluations, evaluate_suite,
                                       format_suite, load_cached_evaluation, load_normalizers, score_task,
                                       write_suite_report)
from metafam.benchmark.paired import difference, probability_of_improvement
from metafam.benchmark.report import format_table, print_report, write_report
from metafam.benchmark.runner import (BenchmarkResult, RunMetrics, learned_optimizer, load_theta,
                                      resolve_optimizers, run_benchmark)
from metafam.benchmark.suites import SUITES, get_suite, list_suites, resolve_tasks
from metafam.benchmark.sweep import (TUNABLE, SweepResult, default_learning_rates, select_best, sgdm,
                                     tune_learning_rate)

__all__ = ["Aggregate", "RunCurves", "Speedup", "aggregate", "iqm", "median", "running_min", "speedup_over_baseline",
           "format_table", "print_report", "write_report", "BenchmarkResult", "RunMetrics", "learned_optimizer",
           "load_theta", "resolve_optimizers", "run_benchmark", "SUITES", "get_suite", "list_suites",
           "resolve_tasks", "TUNABLE", "SweepResult", "default_learning_rates", "select_best", "sgdm",
           "tune_learning_rate", "SuiteEvaluation", "TaskScore", "baseline_evaluations", "evaluate_suite",
           "format_suite", "load_cached_evaluation", "load_normalizers", "score_task", "write_suite_report",
           "difference", "probability_of_improvement"]
