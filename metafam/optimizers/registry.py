"""The registry of learned optimizers: names -> constructors of their default configurations.

    lopt = get_learned_optimizer("adafac_mlp_lopt")             # or with keyword arguments for the constructor
    theta = lopt.init(jax.random.key(0))

Every entry is a zero-argument callable returning a fresh `LearnedOptimizer`; tests/test_lopt_zoo.py runs one
conformance test over every entry, so a new entry is covered by adding it here. Importing this module builds
nothing.
"""

from __future__ import annotations

from typing import Callable, Dict, List

from metafam.optimizers.adafac_mlp_lopt import AdafacMLPLOpt
from metafam.optimizers.learnable_sgdm import LearnableSGDM
from metafam.optimizers.learned import LearnableAdam, LearnableSGD, LearnedOptimizer
from metafam.optimizers.mlp_lopt import MLPLOpt
from metafam.optimizers.mlp_nom_lopt import MLPNomLOpt
from metafam.optimizers.nn_adam import NNAdam
from metafam.optimizers.rnn_mlp_lopt import RNNMLPLOpt

LEARNED_OPTIMIZERS: Dict[str, Callable[..., LearnedOptimizer]] = {
    "mlp_lopt": MLPLOpt,                # per-parameter MLP on momenta + step features (1,762 meta-params)
    "learnable_adam": LearnableAdam,    # Adam, learned lr / betas / eps (4)
    "learnable_sgd": LearnableSGD,      # SGD, learned lr (1)
    "learnable_sgdm": LearnableSGDM,    # heavy-ball SGD, learned lr / momentum (2)
    "adafac_mlp_lopt": AdafacMLPLOpt,   # tiny MLP on momenta + factored second moments (149)
    "nn_adam": NNAdam,                  # Adam with per-tensor hyper-parameters from an LSTM (2,504)
    "rnn_mlp_lopt": RNNMLPLOpt,         # per-tensor LSTM context + per-parameter MLP (5,802)
    "mlp_nom_lopt": MLPNomLOpt,         # Adam + learned per-parameter correction (1,764)
}


def list_learned_optimizers() -> List[str]:
  """The registered names, sorted."""
  return sorted(LEARNED_OPTIMIZERS)


def get_learned_optimizer(name: str, **kwargs) -> LearnedOptimizer:
  """A new ``LEARNED_OPTIMIZERS[name](**kwargs)``; ValueError listing the valid names for an unknown ``name``."""
  if name not in LEARNED_OPTIMIZERS:
    raise ValueError(f"Unknown learned optimizer {name!r}; registered: {', '.join(list_learned_optimizers())}.")
  return LEARNED_OPTIMIZERS[name](**kwargs)
