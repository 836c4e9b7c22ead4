"""`learned_optimization.learned_optimizers.mlp_lopt`: metafam's per-parameter MLP learned optimizer, `MLPLOpt`.

The reference's ``hidden_size`` / ``hidden_layers`` give metafam's ``hidden_sizes``; ``exp_mult`` and ``step_mult``
keep their meaning (step = direction * exp(magnitude * exp_mult) * step_mult). ``compute_summary`` (logging only) is
accepted and ignored. The features are metafam's (see `metafam.optimizers.mlp_lopt`).

States are the reference's `MLPLOptState` (``params``, ``rolling_features`` -- a `common.MomAccumulator` whose
``m`` holds one momentum per decay on the last axis of every leaf and whose ``t`` counts updates per decay --
``iteration`` and ``state``), so forks that build or take apart this state work; the update is metafam's, on its
own state (momenta on the first axis), and `MLPLOptState` is only its renaming. ``_tanh_embedding`` and
``_second_moment_normalizer`` are the reference's feature helpers (`_features`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.learned_optimizers import common
from metafam.compat.learned_optimization.learned_optimizers._features import (
    second_moment_normalizer as _second_moment_normalizer, tanh_embedding)
from metafam.compat.learned_optimization.learned_optimizers.base import LOOptFn
from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.optimizers import mlp_lopt as _mlp
from metafam.optimizers.base import OptimizerState

PRNGKey = jax.Array

__all__ = ["MLPLOpt", "MLPLOptState"]
_ = _second_moment_normalizer  # the reference's private helper, importable from here


def _tanh_embedding(iterations):
  """``f32[11, *shape]``: ``tanh(iterations / s - 1)`` for the timescales ``s`` = 1, 3, 10, ..., 100000."""
  return tanh_embedding(iterations)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MLPLOptState:
  """The reference's state of `MLPLOpt`'s optimizers (see the module docstring)."""
  params: Any
  rolling_features: common.MomAccumulator
  iteration: jax.Array
  state: Any

  def replace(self, **changes: Any) -> "MLPLOptState":
    return dataclasses.replace(self, **changes)


def decay_last(tree: Any) -> Any:
  """Every leaf's first (decay) axis moved last: metafam's accumulator layout -> the reference's."""
  return jax.tree.map(lambda x: jnp.moveaxis(x, 0, -1), tree)


def decay_first(tree: Any) -> Any:
  """Every leaf's last (decay) axis moved first: the reference's accumulator layout -> metafam's."""
  return jax.tree.map(lambda x: jnp.moveaxis(x, -1, 0), tree)


def per_decay_count(iteration: jax.Array, num_decays: int) -> jax.Array:
  """The reference's per-decay update counters ``t`` (``int32[num_decays]``, each the iteration)."""
  return jnp.full((num_decays,), iteration, jnp.int32)


def _to_lo(state: OptimizerState, previous: Any, num_steps: Any) -> MLPLOptState:
  del previous, num_steps
  momenta = state.opt_state  # metafam's accumulators: each tensor's momenta, [num_decays, *shape]
  num_decays = jax.tree.leaves(momenta)[0].shape[0] if jax.tree.leaves(momenta) else 0
  return MLPLOptState(params=state.params, iteration=state.iteration, state=state.state,
                      rolling_features=common.MomAccumulator(m=decay_last(momenta),
                                                             t=per_decay_count(state.iteration, num_decays)))


def _from_lo(state: MLPLOptState) -> OptimizerState:
  return OptimizerState(params=state.params, state=state.state, iteration=state.iteration,
                        opt_state=decay_first(state.rolling_features.m))


_VIEW = opt_base.StateView(MLPLOptState, _to_lo, _from_lo)


class MLPLOpt(LOOptFn, _mlp.MLPLOpt):

  def __init__(self, exp_mult: float = 0.001, step_mult: float = 0.001, hidden_size: int = 32,
               hidden_layers: int = 2, compute_summary: bool = True):
    super().__init__(hidden_sizes=(hidden_size,) * hidden_layers, step_mult=step_mult, exp_mult=exp_mult)

  def opt_fn(self, theta: Any, is_training: bool = False) -> opt_base.Optimizer:
    """metafam's optimizer for ``theta`` whose states are `MLPLOptState`."""
    return opt_base.as_lo_optimizer(_mlp.MLPLOpt.opt_fn(self, theta, is_training=is_training), _VIEW)
