"""`learned_optimization.learned_optimizers.mlp_lopt`: metafam's per-parameter MLP learned optimizer, `MLPLOpt`.

The reference's ``hidden_size`` / ``hidden_layers`` give metafam's ``hidden_sizes``; ``exp_mult`` and ``step_mult``
keep their meaning (step = direction * exp(magnitude * exp_mult) * step_mult). ``compute_summary`` (logging only) is
accepted and ignored. The features are metafam's (see `metafam.optimizers.mlp_lopt`).
"""

from __future__ import annotations

import jax

from metafam.compat.learned_optimization.learned_optimizers.base import LOOptFn
from metafam.optimizers import mlp_lopt as _mlp

PRNGKey = jax.Array

__all__ = ["MLPLOpt"]


class MLPLOpt(LOOptFn, _mlp.MLPLOpt):

  def __init__(self, exp_mult: float = 0.001, step_mult: float = 0.001, hidden_size: int = 32,
               hidden_layers: int = 2, compute_summary: bool = True):
    super().__init__(hidden_sizes=(hidden_size,) * hidden_layers, step_mult=step_mult, exp_mult=exp_mult)
