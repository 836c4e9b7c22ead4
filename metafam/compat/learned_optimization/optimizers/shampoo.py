"""`learned_optimization.optimizers.shampoo`: not implemented.

The reference wraps ``optax_shampoo.distributed_shampoo`` (blocked Kronecker-factored preconditioners with inverse
p-th roots, grafting, a fake ``pmap`` axis): a second-order optimizer of a few thousand lines that neither optax nor
metafam provides, and that is not re-implemented here without tests against it. `Shampoo(...)` raises
NotImplementedError saying so; `GraftingType` lists the reference's grafting names so that configurations parse.
"""

from __future__ import annotations

import enum

__all__ = ["Shampoo", "GraftingType"]


class GraftingType(enum.IntEnum):
  SGD = 1
  ADAGRAD = 2
  RMSPROP = 3
  RMSPROP_NORMALIZED = 4
  SQRT_N = 5
  ADAGRAD_NORMALIZED = 6


class Shampoo:
  """Raises NotImplementedError (see the module docstring)."""

  def __init__(self, learning_rate, block_size, beta1=0.9, beta2=0.999, diagonal_epsilon=1e-10, matrix_epsilon=1e-6,
               weight_decay=0.0, start_preconditioning_step=5, preconditioning_compute_steps=1,
               statistics_compute_steps=1, best_effort_shape_interpretation=True, graft_type=GraftingType.SGD,
               nesterov=True, exponent_override=0, best_effort_memory_usage_reduction=False,
               inverse_failure_threshold=0.1, moving_average_for_momentum=False,
               skip_preconditioning_dim_size_gt=4096, clip_by_scaled_gradient_norm=None, precision=None):
    raise NotImplementedError("learned_optimization's Shampoo (optax_shampoo.distributed_shampoo) is not available "
                              "in metafam: no implementation of it is included. Use optax_opts.Adafactor or "
                              "optax_opts.SM3 for a memory-efficient adaptive optimizer, or wrap an external Shampoo "
                              "optax transformation with optax_opts.OptaxOptimizer(tx).")
