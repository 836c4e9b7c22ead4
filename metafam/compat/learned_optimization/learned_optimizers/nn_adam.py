"""`learned_optimization.learned_optimizers.nn_adam`: metafam's `NNAdam` (Adam whose per-tensor hyper-parameters
come from an LSTM) under the reference's name and initial hyper-parameter arguments.

``lstm_hidden_size`` sets metafam's ``lstm_hidden``; ``output_scale`` and ``decay_strength`` are supported at the
reference's defaults only (other values raise NotImplementedError).
"""

from __future__ import annotations

import jax

from metafam.compat.learned_optimization.learned_optimizers.base import LOOptFn, reject_unsupported
from metafam.optimizers import nn_adam as _nn_adam

PRNGKey = jax.Array

__all__ = ["NNAdam"]


class NNAdam(LOOptFn, _nn_adam.NNAdam):

  def __init__(self, output_scale: float = 0.01, initial_learning_rate: float = 1e-4, initial_beta1: float = 0.9,
               initial_beta2: float = 0.999, initial_epsilon: float = 1e-8, decay_strength: float = 0.0,
               lstm_hidden_size: int = 32):
    reject_unsupported("NNAdam", output_scale=(output_scale, 0.01), decay_strength=(decay_strength, 0.0))
    super().__init__(initial_lr=initial_learning_rate, beta1=initial_beta1, beta2=initial_beta2,
                     epsilon=initial_epsilon, lstm_hidden=lstm_hidden_size)
