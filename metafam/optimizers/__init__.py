"""Optimizers whose states carry the params, and learned optimizers that define them."""

from metafam.optimizers.base import SGD, SGDM, Adam, OptaxOptimizer, Optimizer, OptimizerState
from metafam.optimizers.learned import (HandDesigned, LearnableAdam, LearnableSGD, LearnedOptimizer, as_optax,
                                       num_meta_params)
from metafam.optimizers.mlp_lopt import MLPLOpt
from metafam.optimizers import contract  # noqa: F401  (the learned-optimizer contract: ThetaOptimizer, learned_optax)
from metafam.optimizers.muon_lopt import MuonResidualLOpt
from metafam.optimizers.learnable_sgdm import LearnableSGDM
from metafam.optimizers.adafac_mlp_lopt import AdafacMLPLOpt
from metafam.optimizers.nn_adam import NNAdam
from metafam.optimizers.rnn_mlp_lopt import RNNMLPLOpt
from metafam.optimizers.mlp_nom_lopt import MLPNomLOpt
from metafam.optimizers.hyper_v2 import HyperV2
from metafam.optimizers.nadamw import NAdamW
from metafam.optimizers.registry import (HAND_DESIGNED, LEARNED_OPTIMIZERS, get_hand_optimizer, get_learned_optimizer,
                                        list_hand_optimizers, list_learned_optimizers)

__all__ = ["SGD", "SGDM", "Adam", "OptaxOptimizer", "Optimizer", "OptimizerState", "HandDesigned", "LearnableAdam",
           "LearnableSGD", "LearnedOptimizer", "num_meta_params", "MLPLOpt", "as_optax"]
__all__ += ["LearnableSGDM", "AdafacMLPLOpt", "NNAdam", "RNNMLPLOpt", "MLPNomLOpt", "LEARNED_OPTIMIZERS",
            "get_learned_optimizer", "list_learned_optimizers", "HAND_DESIGNED", "get_hand_optimizer",
            "list_hand_optimizers"]
__all__ += ["HyperV2", "NAdamW", "MuonResidualLOpt"]
