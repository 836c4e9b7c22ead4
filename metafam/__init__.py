"""metafam: meta-learning over task families in modern JAX."""

from metafam.datasets.base import Datasets, dataset_lru_cache
from metafam.optimizers.base import SGD, Adam, OptaxOptimizer, Optimizer
from metafam.taskfamilies.base import TaskFamily, check_family, single_task_to_family
from metafam.tasks.base import Task

__version__ = "0.1.0"

__all__ = ["Datasets", "dataset_lru_cache", "SGD", "Adam", "OptaxOptimizer", "Optimizer", "TaskFamily",
           "check_family", "single_task_to_family", "Task"]
