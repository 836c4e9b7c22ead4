"""`learned_optimization.learned_optimizers.base`: `LearnedOptimizer` and the learnable hand-designed optimizers.

A learned optimizer has ``init(key) -> theta`` and ``opt_fn(theta, is_training=False) -> Optimizer``. The classes
here are metafam's learned optimizers under the reference's names and constructor arguments; their ``opt_fn``
returns metafam's optimizer with the reference's interface (`optimizers.base.as_lo_optimizer`: ``get_params_state``,
``set_params``, extra ``update`` keywords such as ``is_valid`` accepted).
"""

from __future__ import annotations

from typing import Any

import jax

from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.optimizers import learnable_sgdm as _sgdm
from metafam.optimizers import learned as _learned

MetaParams = Any
PRNGKey = jax.Array

__all__ = ["LearnedOptimizer", "LearnableSGD", "LearnableSGDM", "LearnableAdam", "learned_optimizer_from_opt",
           "MetaParams"]


class LearnedOptimizer(_learned.LearnedOptimizer):
  """Base class: subclasses implement ``init(key) -> theta`` and ``opt_fn(theta, is_training=False)``."""


class LOOptFn:
  """Mixin for a metafam learned optimizer: its ``opt_fn`` returns the optimizer with the reference's interface."""

  def opt_fn(self, theta: MetaParams, is_training: bool = False) -> opt_base.Optimizer:
    return opt_base.as_lo_optimizer(super().opt_fn(theta, is_training=is_training))


def reject_unsupported(owner: str, **given_and_default: tuple) -> None:
  """Raises NotImplementedError for a reference argument set to a value metafam's version does not model.

  ``given_and_default``: ``name=(value given, the only supported value)``.
  """
  for name, (given, supported) in given_and_default.items():
    if given != supported:
      raise NotImplementedError(f"{owner}: {name}={given!r} has no counterpart in metafam's implementation (only "
                                f"{name}={supported!r} is supported).")


class LearnableSGD(LOOptFn, _learned.LearnableSGD):
  """SGD with a learned learning rate (``theta = {"log_lr"}``)."""

  def __init__(self, initial_lr: float = 0.01):
    super().__init__(initial_lr=initial_lr)


class LearnableSGDM(LOOptFn, _sgdm.LearnableSGDM):
  """Heavy-ball SGD with learned learning rate and momentum."""

  def __init__(self, initial_lr: float = 0.01, initial_momentum: float = 0.9):
    super().__init__(initial_lr=initial_lr, momentum=initial_momentum)


class LearnableAdam(LOOptFn, _learned.LearnableAdam):
  """Adam with learned learning rate, betas and epsilon. ``use_summary`` (logging only) is accepted and ignored."""

  def __init__(self, initial_lr: float = 0.001, initial_beta1: float = 0.9, initial_beta2: float = 0.999,
               initial_epsilon: float = 1e-8, use_summary: bool = True):
    super().__init__(initial_lr=initial_lr, beta1=initial_beta1, beta2=initial_beta2, epsilon=initial_epsilon)


class _FromOpt(LOOptFn, _learned.HandDesigned):
  """A fixed optimizer as a learned optimizer without meta-parameters (``theta == {}``)."""


def learned_optimizer_from_opt(opt: opt_base.Optimizer) -> LearnedOptimizer:
  """``opt`` as a learned optimizer whose ``opt_fn`` ignores theta (metafam's `HandDesigned`; theta is ``{}``,
  where the reference uses None)."""
  return _FromOpt(opt)
