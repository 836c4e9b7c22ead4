"""`learned_optimization.learned_optimizers.adafac_nominal`: ``MLPNomLOpt``, metafam's learned optimizer that
corrects a nominal Adam step with a per-parameter MLP (`metafam.optimizers.mlp_nom_lopt`).

The reference's common MLP arguments map onto metafam's (``hidden_size`` / ``hidden_layers`` -> ``hidden_sizes``,
``initial_momentum_decays`` -> ``decays``, ``exp_mult``, ``step_mult``); metafam's own arguments (``initial_lr``,
``beta1``, ``beta2``, ``epsilon``, ...) pass through as keywords. The reference's other options are not mirrored.
"""

from __future__ import annotations

from typing import Any, Sequence

from metafam.compat.learned_optimization.learned_optimizers.base import LOOptFn
from metafam.optimizers import mlp_nom_lopt as _nom

__all__ = ["MLPNomLOpt"]


class MLPNomLOpt(LOOptFn, _nom.MLPNomLOpt):

  def __init__(self, exp_mult: float = 0.001, step_mult: float = 0.001, hidden_size: int = 32,
               hidden_layers: int = 2, initial_momentum_decays: Sequence[float] = (0.9, 0.99, 0.999),
               **metafam_kwargs: Any):
    super().__init__(hidden_sizes=(hidden_size,) * hidden_layers, decays=tuple(initial_momentum_decays),
                     step_mult=step_mult, exp_mult=exp_mult, **metafam_kwargs)
