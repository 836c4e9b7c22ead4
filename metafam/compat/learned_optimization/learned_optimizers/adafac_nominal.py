"""`learned_optimization.learned_optimizers.adafac_nominal`: ``MLPNomLOpt``, metafam's learned optimizer that
corrects a nominal Adam step with a per-parameter MLP (`metafam.optimizers.mlp_nom_lopt`).

The reference's common MLP arguments map onto metafam's (``hidden_size`` / ``hidden_layers`` -> ``hidden_sizes``,
``initial_momentum_decays`` -> ``decays``, ``exp_mult``, ``step_mult``); metafam's own arguments (``initial_lr``,
``beta1``, ``beta2``, ``epsilon``, ...) pass through as keywords. The reference's other options are accepted at
their defaults only (other values raise NotImplementedError).
"""

from __future__ import annotations

from typing import Any, Sequence

from metafam.compat.learned_optimization.learned_optimizers._features import (  # noqa: F401  LO names
    PRNGKey, decay_to_param, param_to_decay, second_moment_normalizer, tanh_embedding)
from metafam.compat.learned_optimization.learned_optimizers.adafac_mlp_lopt import AdafacMLPLOptState  # noqa: F401
from metafam.compat.learned_optimization.learned_optimizers.base import LOOptFn, reject_unsupported
from metafam.optimizers import mlp_nom_lopt as _nom

__all__ = ["MLPNomLOpt"]

# The reference's options that metafam's MLPNomLOpt does not model: accepted at these values only.
_LO_DEFAULTS = {"initial_rms_decays": (0.999,), "initial_adafactor_decays": (0.9, 0.99, 0.999),
                "nominal_stepsize": 0.0, "weight_decay": 0.0, "concat_weights": True, "make_separate_weights": False,
                "split_weights": False, "nominal_controller": False, "regularization_controller": False,
                "nominal_grad_estimator": "AdamAggMo", "aggregate_magnitude": False,
                "aggregate_nom_magnitude": False, "aggregate_reg_magnitude": False, "normalize_blackbox": False,
                "selfnormalize_blackbox": False}


class MLPNomLOpt(LOOptFn, _nom.MLPNomLOpt):

  def __init__(self, exp_mult: float = 0.001, step_mult: float = 0.001, hidden_size: int = 32,
               hidden_layers: int = 2, initial_momentum_decays: Sequence[float] = (0.9, 0.99, 0.999),
               initial_rms_decays: Sequence[float] = (0.999,),
               initial_adafactor_decays: Sequence[float] = (0.9, 0.99, 0.999), nominal_stepsize: float = 0.0,
               weight_decay: float = 0.0, concat_weights: bool = True, make_separate_weights: bool = False,
               split_weights: bool = False, nominal_controller: bool = False,
               regularization_controller: bool = False, nominal_grad_estimator: str = "AdamAggMo",
               aggregate_magnitude: bool = False, aggregate_nom_magnitude: bool = False,
               aggregate_reg_magnitude: bool = False, normalize_blackbox: bool = False,
               selfnormalize_blackbox: bool = False, **metafam_kwargs: Any):
    given = dict(locals())
    reject_unsupported("MLPNomLOpt", **{name: (given[name], default) for name, default in _LO_DEFAULTS.items()})
    super().__init__(hidden_sizes=(hidden_size,) * hidden_layers, decays=tuple(initial_momentum_decays),
                     step_mult=step_mult, exp_mult=exp_mult, **metafam_kwargs)
