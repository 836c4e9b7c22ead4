"""Optimizers whose states carry the params."""

from metafam.optimizers.base import SGD, SGDM, Adam, OptaxOptimizer, Optimizer, OptimizerState

__all__ = ["SGD", "SGDM", "Adam", "OptaxOptimizer", "Optimizer", "OptimizerState"]
