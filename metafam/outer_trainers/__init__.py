"""Outer trainers: meta-gradient estimators and the meta-training loop."""

from metafam.outer_trainers.base import GradientEstimate, GradientEstimator
from metafam.outer_trainers.estimators import PES, FullES, NoiseReuseES, PESWorkerState, TruncatedBPTT, TruncatedES

__all__ = ["GradientEstimate", "GradientEstimator", "PES", "FullES", "NoiseReuseES", "PESWorkerState",
           "TruncatedBPTT", "TruncatedES"]
from metafam.outer_trainers.checkpoint import CheckpointError
from metafam.outer_trainers.meta_trainer import MetaTrainer, MetaTrainState

__all__ += ["CheckpointError", "MetaTrainer", "MetaTrainState"]
