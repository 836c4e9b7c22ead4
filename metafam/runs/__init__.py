"""Meta-training runs: a `Recipe` (a whole run as data, `recipes`; ``metafam meta-train``'s flags as one,
`recipe_flags`) meta-trained into a run directory by a `MetaTrainingRun` (`run`): the loop (`train`, on any
`metafam.outer_trainers.MetaTrainer`), the directory's files and refusal rule (`run_dir`), the checkpoint format
(`checkpoint`; how it stores each leaf: `checkpoint_leaves`), the meta-validation curve (`MetaValidation`), stopping
on signals (`preemption`) and the report of non-finite values (`nonfinite_log`)."""

from metafam.runs.checkpoint import CheckpointError
from metafam.runs.loop import RunDivergedError, train
from metafam.runs.preemption import Preempted, StopRequests
from metafam.runs.recipes import RECIPES, Recipe, list_recipes, load_recipe
from metafam.runs.run import MetaTrainingRun, RunResult
from metafam.runs.run_dir import WriteFailedError, read_metrics
from metafam.runs.validation import MetaValidation

__all__ = ["CheckpointError", "train", "Preempted", "StopRequests", "RECIPES", "Recipe", "list_recipes",
           "load_recipe", "MetaTrainingRun", "RunDivergedError", "RunResult", "WriteFailedError", "read_metrics",
           "MetaValidation"]
