"""metafam: meta-learning over task families in modern JAX.

The data flow, one subpackage each: a `TaskFamily` (`taskfamilies`, built from `tasks` and `datasets`) -> the
single-lane inner step and `TruncatedStep`, its vectorized truncated unroll (`inner`) -> meta-gradient estimators on
an injected step, and `MetaTrainer` (`outer_trainers`) -> a meta-training run of a recipe into a run directory
(`runs`) -> evaluation against tuned baselines (`evaluation`, `benchmark`). The most used names are re-exported
here.
"""

from metafam._registry import UnknownNameError
from metafam.datasets.base import Datasets, dataset_lru_cache
from metafam.inner import ConstantSchedule, LogUniformSchedule, NeverEndingSchedule, TruncatedStep
from metafam.optimizers import (AdafacMLPLOpt, HyperV2, LearnableAdam, LearnableSGD, LearnableSGDM, LearnedOptimizer,
                                MLPLOpt, MLPNomLOpt, MuonResidualLOpt, NNAdam, RNNMLPLOpt)
from metafam.optimizers.base import SGD, Adam, OptaxOptimizer, Optimizer
from metafam.outer_trainers import (PES, FullES, GradientEstimate, GradientEstimator, MetaTrainer, NoiseReuseES,
                                    TruncatedBPTT, TruncatedES, make_estimator)
from metafam.runs import MetaTrainingRun, Recipe, load_recipe, train
from metafam.taskfamilies.base import TaskFamily, check_family, single_task_to_family
from metafam.taskfamilies.registry import get_family
from metafam.tasks.base import Task
from metafam.tasks.registry import get_task

__version__ = "0.1.0"

__all__ = ["Datasets", "dataset_lru_cache", "ConstantSchedule", "LogUniformSchedule", "NeverEndingSchedule",
           "TruncatedStep", "SGD", "Adam", "OptaxOptimizer", "Optimizer", "PES", "FullES", "GradientEstimate",
           "GradientEstimator", "MetaTrainer", "NoiseReuseES", "TruncatedBPTT", "TruncatedES", "make_estimator",
           "TaskFamily", "check_family", "single_task_to_family", "get_family", "Task", "get_task",
           "LearnedOptimizer", "LearnableSGD", "LearnableAdam", "LearnableSGDM", "MLPLOpt", "MLPNomLOpt", "AdafacMLPLOpt",
           "MuonResidualLOpt", "NNAdam", "RNNMLPLOpt", "HyperV2", "MetaTrainingRun", "Recipe", "load_recipe", "train",
           "UnknownNameError"]
