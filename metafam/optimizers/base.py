"""The `Optimizer` interface: states that carry the parameters.

An optimizer state holds the params, the model state, an int32 iteration counter and the optimizer's own statistics.
``init(params, model_state=None, num_steps=None) -> state``, ``update(state, grad, loss=None, model_state=None)
-> state``, ``get_params(state)`` and ``get_state(state)`` are pure functions, so they work under `jit` and `vmap`.
``update`` keeps the state's structure and every leaf's dtype (bf16 params keep bf16 statistics, the iteration stays
int32), so a state can be a `lax.scan` carry.
`OptaxOptimizer` turns any `optax.GradientTransformation` into an `Optimizer`; `SGD` and `Adam` are such wrappers.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

from metafam._checks import check_number


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["params", "state", "iteration", "opt_state"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class OptimizerState:
  """Generic optimizer state.

  Attributes:
    params: the parameters being optimized (any pytree).
    state: the model state (e.g. batch-norm statistics), or None.
    iteration: int32 scalar, the number of updates applied so far.
    opt_state: the optimizer's own statistics (e.g. an optax state).
  """
  params: Any
  state: Any
  iteration: jax.Array
  opt_state: Any

  def replace(self, **changes: Any) -> "OptimizerState":
    """A copy with ``changes`` applied (``dataclasses.replace``; the ``.replace`` of learned_optimization's states)."""
    return dataclasses.replace(self, **changes)


class Optimizer:
  """Base class. Subclasses implement `init` and `update`; both must be pure."""

  def init(self, params: Any, model_state: Any = None, num_steps: Optional[int] = None,
           key: Optional[jax.Array] = None) -> Any:
    raise NotImplementedError

  def update(self, opt_state: Any, grad: Any, loss: Optional[jax.Array] = None, model_state: Any = None,
             key: Optional[jax.Array] = None) -> Any:
    raise NotImplementedError

  def get_params(self, opt_state: Any) -> Any:
    return opt_state.params

  def get_state(self, opt_state: Any) -> Any:
    return opt_state.state

  def eval_params(self, opt_state: Any) -> Any:
    """The parameters to evaluate (losses on validation and test splits): `get_params`, unless the rule evaluates
    another point than the one it trains at (schedule-free methods: `OptaxOptimizer`)."""
    return self.get_params(opt_state)

  @property
  def name(self) -> str:
    return type(self).__name__

  def __repr__(self) -> str:
    return f"<Optimizer {self.name}>"


def _is_schedule_free(node: Any) -> bool:
  return isinstance(node, optax.contrib.ScheduleFreeState)


def schedule_free_eval_params(opt_state: Any, params: Any) -> Any:
  """``optax.contrib.schedule_free_eval_params`` at the one schedule-free state inside an optax state (also nested in
  `optax.inject_hyperparams` or a chain), or ``params`` when there is none. Raises ValueError for several."""
  found = [n for n in jax.tree.leaves(opt_state, is_leaf=_is_schedule_free) if _is_schedule_free(n)]
  if not found:
    return params
  if len(found) > 1:
    raise ValueError(f"the optax state holds {len(found)} schedule-free states; which one gives the evaluation "
                     "point is ambiguous.")
  return optax.contrib.schedule_free_eval_params(found[0], params)


def check_grad_matches(params: Any, grad: Any) -> None:
  """Raises ValueError naming the first gradient leaf whose structure or shape differs from the params."""
  p_leaves, p_def = jax.tree_util.tree_flatten_with_path(params)
  g_leaves, g_def = jax.tree_util.tree_flatten(grad)
  if p_def != g_def:
    raise ValueError(f"grad structure {g_def} does not match params structure {p_def}.")
  for (path, p), g in zip(p_leaves, g_leaves):
    if jnp.shape(p) != jnp.shape(g):
      raise ValueError(f"grad leaf {jax.tree_util.keystr(path)} has shape {jnp.shape(g)}, "
                       f"but the parameter has shape {jnp.shape(p)}.")


class OptaxOptimizer(Optimizer):
  """Any `optax.GradientTransformation` as an `Optimizer` (its state lives in ``OptimizerState.opt_state``)."""

  def __init__(self, tx: optax.GradientTransformation, name: Optional[str] = None):
    if not isinstance(tx, optax.GradientTransformation):
      raise TypeError(f"OptaxOptimizer needs an optax.GradientTransformation, got {type(tx).__name__}.")
    self.tx = tx
    self._name = name

  @property
  def name(self) -> str:
    return self._name or type(self).__name__

  def init(self, params, model_state=None, num_steps=None, key=None) -> OptimizerState:
    return OptimizerState(params=params, state=model_state, iteration=jnp.asarray(0, jnp.int32),
                          opt_state=self.tx.init(params))

  def update(self, opt_state: OptimizerState, grad, loss=None, model_state=None, key=None) -> OptimizerState:
    check_grad_matches(opt_state.params, grad)
    updates, new_inner = self.tx.update(grad, opt_state.opt_state, opt_state.params)
    # Keep the state's dtypes (a transformation mixing f32 constants into bf16 statistics would promote them, and a
    # state whose type changes cannot be a scan carry); a no-op wherever they already match.
    new_inner = optax.tree.cast_like(new_inner, opt_state.opt_state)
    params = optax.apply_updates(opt_state.params, updates)
    return OptimizerState(params=params, state=opt_state.state if model_state is None else model_state,
                          iteration=opt_state.iteration + 1, opt_state=new_inner)

  def eval_params(self, opt_state: OptimizerState) -> Any:
    """The training params, or for a schedule-free transformation (``optax.contrib.schedule_free*``) the averaged
    point its authors evaluate (`schedule_free_eval_params`)."""
    return schedule_free_eval_params(opt_state.opt_state, opt_state.params)


class SGD(OptaxOptimizer):
  """Plain gradient descent: ``p <- p - learning_rate * g``."""

  def __init__(self, learning_rate: float = 0.01):
    self.learning_rate = check_number("learning_rate", learning_rate, low=0.0, low_open=True)
    super().__init__(optax.sgd(learning_rate), name=f"SGD(lr={learning_rate:g})")


class SGDM(OptaxOptimizer):
  """SGD with (heavy-ball) momentum: ``m <- momentum * m + g; p <- p - learning_rate * m``."""

  def __init__(self, learning_rate: float = 0.01, momentum: float = 0.9):
    self.learning_rate = check_number("learning_rate", learning_rate, low=0.0, low_open=True)
    self.momentum = check_number("momentum", momentum, low=0.0, high=1.0, high_open=True)
    super().__init__(optax.sgd(learning_rate, momentum=momentum),
                     name=f"SGDM(lr={learning_rate:g}, momentum={momentum:g})")


class Adam(OptaxOptimizer):
  """Adam (Kingma & Ba) with bias correction; ``epsilon`` is added outside the square root."""

  def __init__(self, learning_rate: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
               epsilon: float = 1e-8):
    self.learning_rate = check_number("learning_rate", learning_rate, low=0.0, low_open=True)
    self.beta1 = check_number("beta1", beta1, low=0.0, high=1.0, high_open=True)
    self.beta2 = check_number("beta2", beta2, low=0.0, high=1.0, high_open=True)
    self.epsilon = check_number("epsilon", epsilon, low=0.0)
    super().__init__(optax.adam(learning_rate, b1=beta1, b2=beta2, eps=epsilon), name=f"Adam(lr={learning_rate:g})")
