"""Evaluation: fixed-length training with evaluation points (on `metafam.inner.runner.Runner`, re-exported here),
held-out family evaluation, the one learning-rate tuning rule, the held-out comparison with tuned Adam, the
meta-train report, ensemble helpers."""

from metafam.evaluation.comparison import HeldOutComparison, compare_with_tuned_adam
from metafam.evaluation.ensemble import (ensemble_apply, ensemble_init, ensemble_size, tree_stack, tree_take,
                                         tree_unstack)
from metafam.evaluation.evaluate import EvalResult, train_and_evaluate, train_and_evaluate_vectorized
from metafam.evaluation.family_eval import FamilyEvaluator
from metafam.evaluation.report import write_meta_train_report
from metafam.evaluation.scores import SuiteEvaluation, TaskScore, aggregate_scores, score_task
from metafam.evaluation.tuning import check_learning_rates, default_learning_rates, select_best
from metafam.inner.runner import Runner, RunKeys, as_optimizer, derive_keys, eval_points

__all__ = ["ensemble_apply", "ensemble_init", "ensemble_size", "tree_stack", "tree_take", "tree_unstack",
           "EvalResult", "Runner", "RunKeys", "as_optimizer", "derive_keys", "eval_points", "train_and_evaluate",
           "train_and_evaluate_vectorized", "HeldOutComparison", "compare_with_tuned_adam",
           "FamilyEvaluator", "write_meta_train_report", "check_learning_rates", "default_learning_rates",
           "select_best", "SuiteEvaluation", "TaskScore", "aggregate_scores", "score_task"]
