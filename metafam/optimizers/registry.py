"""The registries of optimizers: learned ones (names -> constructors of their default configurations) and the
hand-designed ones built by name from a learning rate (`HAND_DESIGNED`, what the command line offers).

    lopt = get_learned_optimizer("adafac_mlp_lopt")             # or with keyword arguments for the constructor
    theta = lopt.init(jax.random.key(0))

Every entry is a zero-argument callable returning a fresh `LearnedOptimizer`; the test suite runs the contract
(tests/test_conformance.py) and the zoo's checks (tests/optimizers/test_lopt_zoo.py) over every entry, so a new
entry is covered by adding it here. Importing this module builds nothing.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Dict, List

from metafam._registry import lookup
from metafam.optimizers.base import SGD, SGDM, Adam, OptaxOptimizer, Optimizer
from metafam.optimizers.adafac_mlp_lopt import AdafacMLPLOpt
from metafam.optimizers.hyper_v2 import HyperV2
from metafam.optimizers.learnable_sgdm import LearnableSGDM
from metafam.optimizers.learned import LearnableAdam, LearnableSGD, LearnedOptimizer
from metafam.optimizers.mlp_lopt import MLPLOpt
from metafam.optimizers.mlp_nom_lopt import MLPNomLOpt
from metafam.optimizers.muon_lopt import MuonResidualLOpt
from metafam.optimizers.nn_adam import NNAdam
from metafam.optimizers.optax_zoo import OPTAX_FACTORIES
from metafam.optimizers.rnn_mlp_lopt import RNNMLPLOpt

LEARNED_OPTIMIZERS: Dict[str, Callable[..., LearnedOptimizer]] = {
    "mlp_lopt": MLPLOpt,                # per-parameter MLP on momenta + step features (1,762 meta-params)
    "learnable_adam": LearnableAdam,    # Adam, learned lr / betas / eps (4)
    "learnable_sgd": LearnableSGD,      # SGD, learned lr (1)
    "learnable_sgdm": LearnableSGDM,    # heavy-ball SGD, learned lr / momentum (2)
    "adafac_mlp_lopt": AdafacMLPLOpt,   # tiny MLP on momenta + factored second moments (149)
    # ... plus Muon's orthogonalized momentum as a feature and its initial direction (153)
    "adafac_muon_mlp_lopt": functools.partial(AdafacMLPLOpt, orthogonal_momentum=True),
    # ... with its step normalized to unit RMS per tensor and no step features: the direction is learned, the step's
    # size is the learning rate ``step_mult`` (a number or an optax schedule); the generalist recipe's optimizer (109)
    "adafac_muon_rms_lopt": functools.partial(AdafacMLPLOpt, orthogonal_momentum=True, unit_rms_step=True,
                                              time_scales=(), step_mult=1e-2),
    # optax.contrib.muon exactly at init, plus a learned residual added to its direction (61) ...
    "muon_residual_lopt": MuonResidualLOpt,
    # ... or added to the momentum before a matrix's orthogonalization (Celo2's placement) (53)
    "muon_celo_lopt": functools.partial(MuonResidualLOpt, residual="before"),
    "nn_adam": NNAdam,                  # Adam with per-tensor hyper-parameters from an LSTM (2,504)
    "rnn_mlp_lopt": RNNMLPLOpt,         # per-tensor LSTM context + per-parameter MLP (5,802)
    "mlp_nom_lopt": MLPNomLOpt,         # Adam + learned per-parameter correction (1,764)
    # VeLO's architecture (per-tensor LSTM hypernetwork over a bank of per-parameter MLPs), laptop-sized (1,985)
    "hyper_v2": functools.partial(HyperV2, lstm_hidden_size=8, param_inits=4, descent_init=True),
}


def list_learned_optimizers() -> List[str]:
  """The registered names, sorted."""
  return sorted(LEARNED_OPTIMIZERS)


def get_learned_optimizer(name: str, **kwargs) -> LearnedOptimizer:
  """A new ``LEARNED_OPTIMIZERS[name](**kwargs)``; `UnknownNameError` listing the valid names for an unknown one."""
  return lookup(LEARNED_OPTIMIZERS, name, "learned optimizer")(**kwargs)


def takes_step_mult(name: str) -> bool:
  """Whether the registered learned optimizer ``name`` has a ``step_mult`` argument (False for unknown names)."""
  make = LEARNED_OPTIMIZERS.get(name)
  if make is None:
    return False
  return "step_mult" in inspect.signature(make).parameters


def _optax(name: str) -> Callable[[float], Optimizer]:
  """``lr -> OptaxOptimizer(OPTAX_FACTORIES[name](lr))`` named like ``"lion(lr=0.001)"``."""
  def build(learning_rate: float) -> Optimizer:
    return OptaxOptimizer(OPTAX_FACTORIES[name](learning_rate), name=f"{name}(lr={learning_rate:g})")
  return build


_NATIVE = {"adam": Adam, "sgd": SGD, "sgdm": SGDM}  # metafam's own classes for these entries (the same updates)

# `OPTAX_FACTORIES` as metafam `Optimizer` objects: ``lr -> Optimizer``.
HAND_DESIGNED: Dict[str, Callable[[float], Optimizer]] = {name: _NATIVE.get(name) or _optax(name)
                                                          for name in OPTAX_FACTORIES}


def list_hand_optimizers() -> List[str]:
  """The registered hand-designed names, sorted."""
  return sorted(HAND_DESIGNED)


def get_hand_optimizer(name: str, learning_rate: float) -> Optimizer:
  """A new hand-designed optimizer ``name`` at ``learning_rate``; `UnknownNameError` for an unknown ``name``."""
  return lookup(HAND_DESIGNED, name, "hand-designed optimizer")(learning_rate)
