"""Optimizers whose states carry the params, and learned optimizers that define them."""

from metafam.optimizers.base import SGD, SGDM, Adam, OptaxOptimizer, Optimizer, OptimizerState
from metafam.optimizers.learned import HandDesigned, LearnableAdam, LearnableSGD, LearnedOptimizer, num_meta_params
from metafam.optimizers.mlp_lopt import MLPLOpt, MLPLOptState
from metafam.optimizers.optax_adapter import OptaxAdapterState, as_optax, optimizer_as_optax

__all__ = ["SGD", "SGDM", "Adam", "OptaxOptimizer", "Optimizer", "OptimizerState", "HandDesigned", "LearnableAdam",
           "LearnableSGD", "LearnedOptimizer", "num_meta_params", "MLPLOpt", "MLPLOptState", "OptaxAdapterState",
           "as_optax", "optimizer_as_optax"]
