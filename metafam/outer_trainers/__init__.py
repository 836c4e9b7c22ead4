"""Outer trainers: meta-gradient estimators on an injected `TruncatedStep`, the meta-step (`MetaTrainer`), the loop
(`train`), the meta-validation curve (`MetaValidation`), recipes (`Recipe`) and runs (`MetaTrainingRun`: a recipe
trained into a run directory)."""

from metafam.outer_trainers.base import GradientEstimate, GradientEstimator
from metafam.outer_trainers.checkpoint import CheckpointError
from metafam.outer_trainers.estimators import PES, FullES, NoiseReuseES, PESWorkerState, TruncatedBPTT, TruncatedES
from metafam.outer_trainers.loop import train
from metafam.outer_trainers.meta_trainer import MetaTrainer, MetaTrainState, meta_optimizer
from metafam.outer_trainers.preemption import Preempted, StopRequests
from metafam.outer_trainers.recipes import RECIPES, Recipe, list_recipes, load_recipe
from metafam.outer_trainers.registry import ESTIMATORS, get_estimator, list_estimators, make_estimator
from metafam.outer_trainers.run import MetaTrainingRun, RunDivergedError, RunResult, WriteFailedError, read_metrics
from metafam.outer_trainers.validation import MetaValidation

__all__ = ["GradientEstimate", "GradientEstimator", "CheckpointError", "PES", "FullES", "NoiseReuseES",
           "PESWorkerState", "TruncatedBPTT", "TruncatedES", "MetaTrainer", "MetaTrainState", "meta_optimizer",
           "read_metrics", "RunDivergedError", "WriteFailedError", "Preempted", "StopRequests", "ESTIMATORS",
           "get_estimator", "list_estimators", "make_estimator", "RECIPES", "Recipe", "list_recipes", "load_recipe",
           "MetaTrainingRun", "RunResult", "train", "MetaValidation"]
