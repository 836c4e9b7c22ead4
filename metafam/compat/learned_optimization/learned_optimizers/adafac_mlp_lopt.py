"""`learned_optimization.learned_optimizers.adafac_mlp_lopt`: metafam's `AdafacMLPLOpt` under the reference's name.

metafam's version learns one set of decays shared by the momenta and the (factored) second moments, so
``initial_adafactor_decays`` must equal ``initial_momentum_decays``; the weight-layout options
(``concat_weights``, ``make_separate_weights``, ``split_weights``) and ``initial_rms_decays`` are supported at the
reference's defaults only (other values raise NotImplementedError), except ``concat_weights=False,
split_weights=True``: the reference applies the first layer to each feature group separately, the same numbers
with the same theta as the concatenated layout metafam uses, so it is accepted.
"""

from __future__ import annotations

from typing import Sequence

from metafam.compat.learned_optimization.learned_optimizers._features import (  # noqa: F401  LO names
    PRNGKey, decay_to_param, param_to_decay, second_moment_normalizer, tanh_embedding)
from metafam.compat.learned_optimization.learned_optimizers.base import LOOptFn, reject_unsupported
from metafam.optimizers import adafac_mlp_lopt as _adafac

__all__ = ["AdafacMLPLOpt"]


class AdafacMLPLOpt(LOOptFn, _adafac.AdafacMLPLOpt):

  def __init__(self, exp_mult: float = 0.001, step_mult: float = 0.001, hidden_size: int = 4,
               hidden_layers: int = 2, initial_momentum_decays: Sequence[float] = (0.9, 0.99, 0.999),
               initial_rms_decays: Sequence[float] = (0.999,),
               initial_adafactor_decays: Sequence[float] = (0.9, 0.99, 0.999), concat_weights: bool = True,
               make_separate_weights: bool = False, split_weights: bool = False):
    reject_unsupported("AdafacMLPLOpt",
                       initial_adafactor_decays=(tuple(initial_adafactor_decays), tuple(initial_momentum_decays)),
                       initial_rms_decays=(tuple(initial_rms_decays), (0.999,)),
                       make_separate_weights=(make_separate_weights, False),
                       concat_weights_split_weights=((bool(concat_weights), bool(split_weights)),
                                                     (True, False) if concat_weights else (False, True)))
    super().__init__(hidden_sizes=(hidden_size,) * hidden_layers, decays=tuple(initial_momentum_decays),
                     step_mult=step_mult, exp_mult=exp_mult)
