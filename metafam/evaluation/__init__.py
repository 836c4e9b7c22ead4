"""Evaluation: training with periodic evaluation on the four splits, and ensemble pytree helpers."""

from metafam.evaluation.ensemble import (ensemble_apply, ensemble_init, ensemble_size, tree_stack, tree_take,
                                         tree_unstack)
from metafam.evaluation.evaluate import (EvalResult, Runner, RunKeys, as_optimizer, derive_keys, eval_points,
                                         train_and_evaluate, train_and_evaluate_vectorized)

__all__ = ["ensemble_apply", "ensemble_init", "ensemble_size", "tree_stack", "tree_take", "tree_unstack",
           "EvalResult", "Runner", "RunKeys", "as_optimizer", "derive_keys", "eval_points", "train_and_evaluate",
           "train_and_evaluate_vectorized"]
