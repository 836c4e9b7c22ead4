"""The one learned-optimizer contract: a learned optimizer says how to step one tensor; both faces come from here.

A learned optimizer (`metafam.optimizers.learned.LearnedOptimizer`) implements

  * ``init_accumulators(p) -> acc``: the zero accumulators of one tensor (any pytree: momenta, second moments...);
  * ``leaf_step(theta, count[, horizon]) -> f``, where ``f(p, g, acc) -> (step, new acc)`` is the update of one tensor
    at update ``count`` (int32, 0-based; ``horizon``: the run's length, for an optimizer with a learned schedule
    (``uses_horizon``) only). ``step`` is in the compute dtype and is subtracted: ``new p = p - step``.

and, when its per-tensor LSTM or global features need all tensors at once (`NNAdam`, `RNNMLPLOpt`, `HyperV2`), the
optional per-step hook

  * ``init_extras(theta, params, num_steps) -> dict``: its global state (an LSTM's state, a loss buffer...);
  * ``prepare_step(theta, count, params, grads, accumulators, extras, loss) -> (f, new extras)``: ``params``,
    ``grads`` and ``accumulators`` are lists (one entry per tensor, in ``jax.tree.leaves`` order) and ``f(i, p, g,
    acc) -> (step, new acc)`` steps tensor ``i``. The default wraps ``leaf_step``.

From these, `learned_optax` is the optax transformation (`LearnedOptState`: an int32 count, the accumulators and
the extras; no params) and `ThetaOptimizer` the params-carrying `Optimizer` (``lopt.opt_fn(theta)``), derived from
the same update (`step`): its `OptimizerState` holds ``iteration = count`` and ``opt_state`` the accumulators' tree,
or ``{"accumulators": tree, **extras}`` for an optimizer with extras (``has_extras``, a schedule or ``lr_spread``). The optax updates are ``(-step)`` cast to the params'
dtypes; ``opt_fn``'s new params are ``(p - step)`` computed in the compute dtype and then cast (for float32 params
the two agree bit for bit).

With ``lr_spread`` s > 1 (meta-training only: see `MuonResidualLOpt`), ``init`` draws one step multiplier ``exp(u)``,
u uniform in ``[-log s, log s]``, from its ``key`` and keeps ``"log_lr_scale"`` in the extras; every step of that
trajectory is multiplied by it. An optimizer with a learned schedule keeps ``"horizon": f32[]`` there.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam._checks import check_number
from metafam.optimizers.base import Optimizer, OptimizerState, check_grad_matches

LeafFn = Callable[[int, jax.Array, jax.Array, Any], Tuple[jax.Array, Any]]


class LearnedOptState(NamedTuple):
  """The optax state of a learned optimizer: the update count (int32), every tensor's accumulators (a tree shaped
  like the params, each leaf's accumulators a subtree) and the optimizer's global ``extras`` (a dict)."""
  count: jax.Array
  accumulators: Any
  extras: Dict[str, Any]


def uses_horizon(lopt: Any) -> bool:
  """Whether ``lopt``'s step depends on the run's length (a learned schedule over the fraction of training done):
  its ``leaf_step`` then takes ``horizon=``, the total number of updates, which ``init`` must be given."""
  return bool(getattr(lopt, "uses_horizon", False))


def horizon_of(lopt: Any, num_steps: Any) -> jax.Array:
  """``num_steps`` as the float32 horizon a scheduled ``lopt`` reads, or a ValueError naming the argument."""
  if num_steps is None:
    raise ValueError(f"{lopt.name} has a learned schedule over the fraction of training done: pass num_steps= (the "
                     "run's total number of updates) to init, or to as_optax.")
  if isinstance(num_steps, (int, float, np.integer, np.floating)):
    check_number("num_steps", num_steps, low=1, integer=True)
  return jnp.asarray(num_steps, jnp.float32)


def horizon_arg(lopt: Any, extras: Dict[str, Any]) -> dict:
  """The keyword arguments that pass the horizon in ``extras`` to ``lopt.leaf_step`` (none without a schedule)."""
  return {"horizon": extras["horizon"]} if uses_horizon(lopt) else {}


def init(lopt: Any, theta: Any, params: Any, num_steps: Any = None, key: Optional[jax.Array] = None,
         lr_spread: float = 1.0) -> LearnedOptState:
  """The state before the first update."""
  extras = dict(lopt.init_extras(theta, params, num_steps))
  if uses_horizon(lopt):
    extras["horizon"] = horizon_of(lopt, num_steps)
  if lr_spread != 1.0:
    if key is None:
      raise ValueError(f"{lopt.name}.opt_fn(theta) with lr_spread={lr_spread:g} draws its step multiplier from "
                       "init's key: pass key=.")
    half = float(np.log(lr_spread))
    extras["log_lr_scale"] = jax.random.uniform(key, (), jnp.float32, -half, half)
  return LearnedOptState(count=jnp.zeros((), jnp.int32), accumulators=jax.tree.map(lopt.init_accumulators, params),
                         extras=extras)


def step(lopt: Any, theta: Any, state: LearnedOptState, grads: Any, params: Any,
         loss: Any = None) -> Tuple[List[jax.Array], Any, LearnedOptState]:
  """One update: ``(steps, treedef, new state)``, ``steps`` the list of every tensor's step (compute dtype)."""
  check_grad_matches(params, grads)
  p_leaves, treedef = jax.tree.flatten(params)
  g_leaves, a_leaves = treedef.flatten_up_to(grads), treedef.flatten_up_to(state.accumulators)
  extras = state.extras
  if p_leaves:
    leaf, extras = lopt.prepare_step(theta, state.count, p_leaves, g_leaves, a_leaves, extras, loss)
    outs = [leaf(i, p, g, a) for i, (p, g, a) in enumerate(zip(p_leaves, g_leaves, a_leaves))]
  else:
    outs = []
  steps = [o[0] for o in outs]
  if "log_lr_scale" in extras:
    scale = jnp.exp(extras["log_lr_scale"])
    steps = [s * scale.astype(s.dtype) for s in steps]
  new = LearnedOptState(count=optax.safe_increment(state.count),
                        accumulators=treedef.unflatten([o[1] for o in outs]), extras=extras)
  return steps, treedef, new


def learned_optax(lopt: Any, theta: Any, num_steps: Any = None) -> optax.GradientTransformationExtraArgs:
  """``lopt`` with fixed ``theta`` as an optax transformation whose updates are ``-step`` in the params' dtypes.

  ``update(grads, state, params, loss=None)`` needs ``params``; other extra arguments are ignored. ``num_steps``:
  the run's total number of updates, required by an optimizer with a learned schedule (`uses_horizon`) and read by
  those whose features do (`HyperV2`)."""
  if uses_horizon(lopt):
    horizon_of(lopt, num_steps)  # fail at construction, not at init

  def init_fn(params):
    return init(lopt, theta, params, num_steps)

  def update_fn(updates, state, params=None, **extra_args):
    if params is None:
      raise ValueError(f"{lopt.name}'s optax update needs the current params: call tx.update(grads, state, params).")
    steps, treedef, new = step(lopt, theta, state, updates, params, extra_args.get("loss"))
    p_leaves = treedef.flatten_up_to(params)
    return treedef.unflatten([(-s).astype(p.dtype) for s, p in zip(steps, p_leaves)]), new

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _pack(state: LearnedOptState, packed: bool) -> Any:
  return {"accumulators": state.accumulators, **state.extras} if packed else state.accumulators


def _unpack(iteration: jax.Array, opt_state: Any, packed: bool) -> LearnedOptState:
  if not packed:
    return LearnedOptState(count=iteration, accumulators=opt_state, extras={})
  extras = {k: v for k, v in opt_state.items() if k != "accumulators"}
  return LearnedOptState(count=iteration, accumulators=opt_state["accumulators"], extras=extras)


class ThetaOptimizer(Optimizer):
  """``lopt.opt_fn(theta)``: the params-carrying face of `learned_optax` (`OptimizerState`; see the module)."""

  def __init__(self, lopt: Any, theta: Any, lr_spread: float = 1.0):
    self.lopt, self.theta = lopt, theta
    self.lr_spread = float(check_number("lr_spread", lr_spread, low=1.0))

  @property
  def name(self) -> str:
    return f"{self.lopt.name}.opt_fn(theta)"

  @property
  def packed(self) -> bool:
    """Whether ``opt_state`` is ``{"accumulators": tree, **extras}`` (else the accumulators' tree)."""
    return bool(getattr(self.lopt, "has_extras", False)) or uses_horizon(self.lopt) or self.lr_spread != 1.0

  def init(self, params, model_state=None, num_steps=None, key=None) -> OptimizerState:
    state = init(self.lopt, self.theta, params, num_steps, key, self.lr_spread)
    return OptimizerState(params=params, state=model_state, iteration=state.count,
                          opt_state=_pack(state, self.packed))

  def update(self, opt_state, grad, loss=None, model_state=None, key=None) -> OptimizerState:
    state = _unpack(opt_state.iteration, opt_state.opt_state, self.packed)
    steps, treedef, new = step(self.lopt, self.theta, state, grad, opt_state.params, loss)
    p_leaves = treedef.flatten_up_to(opt_state.params)
    params = treedef.unflatten([(p.astype(s.dtype) - s).astype(p.dtype) for s, p in zip(steps, p_leaves)])
    return OptimizerState(params=params, state=opt_state.state if model_state is None else model_state,
                          iteration=new.count, opt_state=_pack(new, self.packed))
