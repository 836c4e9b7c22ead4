"""Outer trainers: meta-gradient estimators on an injected `TruncatedStep`, their registry, and the meta-step
(`MetaTrainer`: estimates -> averaged meta-gradient -> optax meta-optimizer, a pure program). A run of them, its
loop and its files are `metafam.runs`."""

from metafam.outer_trainers.base import GradientEstimate, GradientEstimator
from metafam.outer_trainers.estimators import FullES, TruncatedBPTT, TruncatedES
from metafam.outer_trainers.pes import PES, NoiseReuseES, PESWorkerState
from metafam.outer_trainers.meta_trainer import MetaTrainer, MetaTrainState, meta_optimizer
from metafam.outer_trainers.registry import ESTIMATORS, get_estimator, list_estimators, make_estimator

__all__ = ["GradientEstimate", "GradientEstimator", "PES", "FullES", "NoiseReuseES", "PESWorkerState",
           "TruncatedBPTT", "TruncatedES", "MetaTrainer", "MetaTrainState", "meta_optimizer", "ESTIMATORS",
           "get_estimator", "list_estimators", "make_estimator"]
