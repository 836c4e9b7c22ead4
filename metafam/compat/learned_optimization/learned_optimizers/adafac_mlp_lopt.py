"""`learned_optimization.learned_optimizers.adafac_mlp_lopt`: metafam's `AdafacMLPLOpt` under the reference's name.

metafam's version learns one set of decays shared by the momenta and the (factored) second moments, so
``initial_adafactor_decays`` must equal ``initial_momentum_decays``; the weight-layout options
(``concat_weights``, ``make_separate_weights``, ``split_weights``) and ``initial_rms_decays`` are supported at the
reference's defaults only (other values raise NotImplementedError), except ``concat_weights=False,
split_weights=True``: the reference applies the first layer to each feature group separately, the same numbers
with the same theta as the concatenated layout metafam uses, so it is accepted.

States are the reference's `AdafacMLPLOptState`, a renaming of metafam's (the update is metafam's): ``mom_rolling``
is a `common.MomAccumulator` (one momentum per decay on every leaf's last axis, ``t`` the per-decay update counts),
``fac_rolling_features`` a `common.FactoredAccum` with metafam's factors, the decay axis last (``v_row`` averages
over the last axis and ``v_col`` over the second to last of a tensor of rank >= 2, ``v_diag`` the others' second
moments; unused slots are empty float32 arrays), ``num_steps`` the ``num_steps`` given to ``init`` (0 if None).
metafam's optimizer keeps no separate second-moment accumulator, so ``rms_rolling.rms`` holds empty arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.learned_optimizers._features import (  # noqa: F401  LO names
    PRNGKey, decay_to_param, param_to_decay, second_moment_normalizer, tanh_embedding)
from metafam.compat.learned_optimization.learned_optimizers import common
from metafam.compat.learned_optimization.learned_optimizers.base import LOOptFn, reject_unsupported
from metafam.compat.learned_optimization.learned_optimizers.mlp_lopt import decay_first, decay_last, per_decay_count
from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.optimizers import adafac_mlp_lopt as _adafac
from metafam.optimizers.base import OptimizerState

__all__ = ["AdafacMLPLOpt", "AdafacMLPLOptState"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AdafacMLPLOptState:
  """The reference's state of `AdafacMLPLOpt`'s optimizers (see the module docstring)."""
  params: Any
  state: Any
  mom_rolling: common.MomAccumulator
  rms_rolling: common.RMSAccumulator
  fac_rolling_features: common.FactoredAccum
  num_steps: jax.Array
  iteration: jax.Array

  def replace(self, **changes: Any) -> "AdafacMLPLOptState":
    return dataclasses.replace(self, **changes)


def _empty() -> jax.Array:
  return jnp.zeros((0,), jnp.float32)


def _to_lo(state: OptimizerState, previous: Any, num_steps: Any) -> AdafacMLPLOptState:
  treedef = jax.tree.structure(state.params)
  accs = treedef.flatten_up_to(state.opt_state)
  field = lambda key: treedef.unflatten([decay_last(a[key]) if key in a else _empty() for a in accs])
  k = accs[0]["momenta"].shape[0] if accs else 0
  count = per_decay_count(state.iteration, k)
  if previous is not None:
    num_steps = previous.num_steps
  num_steps = jnp.asarray(0 if num_steps is None else num_steps, jnp.int32)
  return AdafacMLPLOptState(
      params=state.params, state=state.state, iteration=state.iteration, num_steps=num_steps,
      mom_rolling=common.MomAccumulator(m=field("momenta"), t=count),
      rms_rolling=common.RMSAccumulator(rms=treedef.unflatten([_empty() for _ in accs]), t=count[:1]),
      fac_rolling_features=common.FactoredAccum(v_col=field("col"), v_row=field("row"), v_diag=field("v")))


def _from_lo(state: AdafacMLPLOptState) -> OptimizerState:
  treedef = jax.tree.structure(state.params)
  fac = state.fac_rolling_features
  columns = [treedef.flatten_up_to(t) for t in (state.mom_rolling.m, fac.v_row, fac.v_col, fac.v_diag)]
  accs = []
  for p, m, row, col, v in zip(treedef.flatten_up_to(state.params), *columns):
    acc = {"momenta": decay_first(m)}
    acc.update({"row": decay_first(row), "col": decay_first(col)} if jnp.ndim(p) >= 2 else {"v": decay_first(v)})
    accs.append(acc)
  return OptimizerState(params=state.params, state=state.state, iteration=state.iteration,
                        opt_state=treedef.unflatten(accs))


_VIEW = opt_base.StateView(AdafacMLPLOptState, _to_lo, _from_lo)


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

  def opt_fn(self, theta: Any, is_training: bool = False) -> opt_base.Optimizer:
    """metafam's optimizer for ``theta`` whose states are `AdafacMLPLOptState`."""
    return opt_base.as_lo_optimizer(_adafac.AdafacMLPLOpt.opt_fn(self, theta, is_training=is_training), _VIEW)
