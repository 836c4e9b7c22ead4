"""`learned_optimization.research.general_lopt.hyper_v2`: metafam's `HyperV2` (`metafam.optimizers.hyper_v2`,
VeLO's architecture) under the reference's names.

`HyperV2` takes the reference's arguments; theta has the reference's layout, so weights saved by the reference load
unchanged (`checkpoints.load_state`). The ablation switches ``with_*``, ``adafactor_accumulator`` and the summary
switches are supported at their defaults only (others raise NotImplementedError); ``reparam_decay`` is accepted and,
as in the reference, unused. `State` is the optimizer's state, `BufferLossAccumulators` the loss features (with the
reference's ``init(num_steps)``, ``update(state, loss)`` and ``features(state)``), `factored_dims` the choice of
factored axes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.learned_optimizers._features import (  # noqa: F401  LO's private names
    clip_log_abs as _clip_log_abs, second_moment_normalizer as _second_moment_normalizer, sorted_values)
from metafam.compat.learned_optimization.learned_optimizers.base import LOOptFn, reject_unsupported
from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.optimizers import hyper_v2 as _hv2
from metafam.optimizers.base import OptimizerState
from metafam.optimizers.hyper_v2 import factored_dims
from metafam.optimizers.hyper_v2 import safe_rsqrt as _safe_rsqrt  # noqa: F401  LO's private name

__all__ = ["HyperV2", "State", "BufferLossAccumulators", "factored_dims"]

_ABLATIONS = ("with_g", "with_m", "with_m_feat", "with_rms", "with_rms_feat", "with_rms_norm_g", "with_rsqrt_rms",
              "with_p", "with_fac_norm_g", "with_fac_rms", "with_fac_rsqrt", "with_grad_clip_feat",
              "with_fac_mom_mult", "with_rms_only_norm_g", "adafactor_accumulator")


def _sorted_values(dd):
  """The mapping's values in the order of its sorted keys."""
  return sorted_values(dd)


def _fractional_tanh_embed(x):
  """``f32[9, *shape]``: ``tanh(10 (x - s))`` for the fractions ``s`` = 0.03, 0.1, 0.2, 0.4, ..., 1.0, 1.1 of
  training done."""
  marks = jnp.asarray([0.03, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1], jnp.float32).reshape((-1,) + (1,) * jnp.ndim(x))
  return jnp.tanh((jnp.asarray(x, jnp.float32) - marks) * 10)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
  """The reference's state of `HyperV2`'s optimizer (its field names and order): params; per leaf the second
  moments ``rms_rolling [*shape, R]`` and momenta ``mom_rolling [*shape, M]``; ``fac_rolling = {"v_row", "v_col",
  "v_diag"}``; int32 ``iteration``; the model ``state``; int32 ``num_steps``; ``lstm_hidden_state = {"hidden",
  "cell"}``; the loss buffer. A renaming of metafam's `OptimizerState` (`metafam.optimizers.hyper_v2`)."""
  params: Any
  rms_rolling: Any
  mom_rolling: Any
  fac_rolling: Dict[str, Any]
  iteration: jax.Array
  state: Any
  num_steps: jax.Array
  lstm_hidden_state: Dict[str, jax.Array]
  loss_buffer: Dict[str, jax.Array]

  def replace(self, **changes: Any) -> "State":
    return dataclasses.replace(self, **changes)


_FAC = ("v_row", "v_col", "v_diag")


def _to_lo(state: OptimizerState, previous: Any, num_steps: Any) -> State:
  del previous, num_steps
  treedef = jax.tree.structure(state.params)
  accs = treedef.flatten_up_to(state.opt_state["accumulators"])
  field = lambda key: treedef.unflatten([a[key] for a in accs])  # noqa: E731
  extras = state.opt_state
  return State(params=state.params, rms_rolling=field("rms"), mom_rolling=field("mom"),
               fac_rolling={k: field(k) for k in _FAC}, iteration=state.iteration, state=state.state,
               num_steps=extras["num_steps"], lstm_hidden_state=extras["lstm_hidden_state"],
               loss_buffer=extras["loss_buffer"])


def _from_lo(state: State) -> OptimizerState:
  treedef = jax.tree.structure(state.params)
  columns = [treedef.flatten_up_to(t) for t in (state.mom_rolling, state.rms_rolling)]
  columns += [treedef.flatten_up_to(state.fac_rolling[k]) for k in _FAC]
  accs = [dict(zip(("mom", "rms") + _FAC, a)) for a in zip(*columns)]
  return OptimizerState(params=state.params, state=state.state, iteration=state.iteration,
                        opt_state={"accumulators": treedef.unflatten(accs), "num_steps": state.num_steps,
                                   "lstm_hidden_state": state.lstm_hidden_state, "loss_buffer": state.loss_buffer})


_VIEW = opt_base.StateView(State, _to_lo, _from_lo)


class BufferLossAccumulators:
  """The loss features' running means (`metafam.optimizers.hyper_v2.loss_buffer_init` and friends)."""

  def init(self, num_steps: Any) -> dict:
    return _hv2.loss_buffer_init(num_steps)

  def update(self, state: dict, loss: Any) -> dict:
    return _hv2.loss_buffer_update(state, loss)

  def features(self, state: dict) -> Any:
    return _hv2.loss_buffer_features(state)


class HyperV2(LOOptFn, _hv2.HyperV2):

  def __init__(self, lstm_hidden_size: int = 128, ff_hidden_size: int = 4, ff_hidden_layers: int = 2,
               initial_momentum_decays: Sequence[float] = (0.9, 0.99, 0.999),
               initial_rms_decays: Sequence[float] = (0.999,),
               initial_adafactor_decays: Sequence[float] = (0.9, 0.99, 0.999), param_inits: int = 64,
               mix_layers: bool = True, exp_mult: float = 0.001, step_mult: float = 0.001,
               validation_mode: bool = False, with_validation_feature_dim: bool = False,
               with_g: bool = True, with_m: bool = True, with_m_feat: bool = True, with_rms: bool = True,
               with_rms_feat: bool = True, with_rms_norm_g: bool = True, with_rsqrt_rms: bool = True,
               with_p: bool = True, with_fac_norm_g: bool = True, with_fac_rms: bool = True,
               with_fac_rsqrt: bool = True, with_grad_clip_feat: bool = True, with_fac_mom_mult: bool = True,
               with_rms_only_norm_g: bool = True, adafactor_accumulator: bool = True, param_scale_mult: bool = True,
               use_bugged_next_lstm_state: bool = False, use_bugged_loss_features: bool = True,
               precondition_output: bool = False, reparam_decay: float = 10.0, rnn_state_decay: float = 0.0,
               summarize_each_layer: bool = False, summarize_all_control: bool = False,
               constant_loss: bool = False, clip_param_scale_amount: Optional[float] = None):
    given = locals()
    reject_unsupported("HyperV2", **{name: (given[name], True) for name in _ABLATIONS},
                       summarize_each_layer=(summarize_each_layer, False),
                       summarize_all_control=(summarize_all_control, False))
    del reparam_decay  # unused by the reference too
    super().__init__(lstm_hidden_size=lstm_hidden_size, ff_hidden_size=ff_hidden_size,
                     ff_hidden_layers=ff_hidden_layers, initial_momentum_decays=initial_momentum_decays,
                     initial_rms_decays=initial_rms_decays, initial_adafactor_decays=initial_adafactor_decays,
                     param_inits=param_inits, mix_layers=mix_layers, exp_mult=exp_mult, step_mult=step_mult,
                     use_bugged_next_lstm_state=use_bugged_next_lstm_state,
                     use_bugged_loss_features=use_bugged_loss_features, param_scale_mult=param_scale_mult,
                     precondition_output=precondition_output, rnn_state_decay=rnn_state_decay,
                     constant_loss=constant_loss, clip_param_scale_amount=clip_param_scale_amount,
                     with_validation_feature_dim=with_validation_feature_dim, validation_mode=validation_mode)

  def opt_fn(self, theta: Any, is_training: bool = False) -> opt_base.Optimizer:
    """metafam's optimizer for ``theta`` whose states are the reference's `State`."""
    return opt_base.as_lo_optimizer(_hv2.HyperV2.opt_fn(self, theta, is_training=is_training), _VIEW)
