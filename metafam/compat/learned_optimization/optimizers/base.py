"""`learned_optimization.optimizers.base`: the `Optimizer` interface over metafam's optimizers.

States carry the params, as in metafam (`metafam.optimizers.base.OptimizerState`: ``params``, ``state``,
``iteration``, ``opt_state``). `Optimizer` is metafam's base class plus the reference's ``get_params_state`` and
``set_params`` and its keyword conventions: ``init(params, state=None, num_steps=None, key=None)`` (``model_state=``
is accepted too) and ``update(opt_state, grad, loss=None, model_state=None, key=None, **kwargs)``, whose extra keyword
arguments (``is_valid``, ...) are accepted and ignored. `as_lo_optimizer` gives any metafam `Optimizer` this face.

The hand-designed optimizers (`SGD`, `Adam`, ...) live in `optax_opts`; the names the reference once exported from
here resolve to them.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

# ModelState, OptState, Params: the reference's type aliases, re-exported from here as it exports them.
from metafam.compat.learned_optimization.optimizers._interface import ModelState, Optimizer, OptState, Params
from metafam.optimizers import base as _base
from metafam.optimizers.base import OptimizerState

Gradient = Any

__all__ = ["Optimizer", "OptimizerState", "StatelessState",
           "GradientClipOptimizer", "GraftedOptimizer", "GraftedOptimizerState",
           "as_lo_optimizer", "StateView"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StatelessState:
  """The reference's state for optimizers that keep nothing but the params and the model state."""
  params: Any
  state: Any


class StateView:
  """How an optimizer's metafam state is shown in the reference's state class (``lo_type``): ``to_lo(state,
  previous, num_steps)`` builds the reference's state from metafam's (``previous``: the reference state it was
  updated from, or None after ``init``, which passes its ``num_steps``) and ``from_lo(lo_state)`` gives metafam's back. Both only rename fields and move axes."""

  def __init__(self, lo_type: type, to_lo: Callable[[Any, Any, Any], Any], from_lo: Callable[[Any], Any]):
    self.lo_type, self.to_lo, self.from_lo = lo_type, to_lo, from_lo


class _LOFace(Optimizer):
  """A metafam `Optimizer` seen through the reference's interface (every call forwarded). With a `StateView` its
  states are the reference's state class: ``init`` returns one, ``update`` takes one (or metafam's state, which it
  then returns unchanged in kind) and the update itself is metafam's."""

  def __init__(self, opt: _base.Optimizer, view: Optional[StateView] = None):
    self.opt, self.view = opt, view

  @property
  def name(self) -> str:
    return self.opt.name

  def init(self, params, state=None, num_steps=None, key=None, **kwargs):
    state = kwargs.pop("model_state", state)
    out = self.opt.init(params, model_state=state, num_steps=num_steps, key=key)
    return out if self.view is None else self.view.to_lo(out, None, num_steps)

  def update(self, opt_state, grad, loss=None, model_state=None, key=None, **kwargs):
    lo = self.view is not None and isinstance(opt_state, self.view.lo_type)
    out = self.opt.update(self.view.from_lo(opt_state) if lo else opt_state, grad, loss=loss,
                          model_state=model_state, key=key)
    return self.view.to_lo(out, opt_state, None) if lo else out

  def get_params(self, state):
    return state.params if self.view is not None else self.opt.get_params(state)

  def get_state(self, state):
    return state.state if self.view is not None else self.opt.get_state(state)


def as_lo_optimizer(opt: _base.Optimizer, view: Optional[StateView] = None) -> Optimizer:
  """``opt`` with the reference's interface: itself if it already has it (and no ``view`` is asked for), else a
  forwarding wrapper, whose states are ``view``'s reference state class when a `StateView` is given."""
  if isinstance(opt, Optimizer) and view is None:
    return opt
  if not isinstance(opt, _base.Optimizer):
    raise TypeError(f"as_lo_optimizer needs a metafam Optimizer, got {type(opt).__name__}.")
  return _LOFace(opt, view)


def _check_optimizer(opt: Any, what: str) -> Optimizer:
  if not isinstance(opt, _base.Optimizer):
    raise ValueError(f"{what} must be an Optimizer instance (maybe the class was passed instead of an instance?); "
                     f"got {opt!r}.")
  return as_lo_optimizer(opt)


class WrappedOptimizer(Optimizer):
  """Base of the optimizers that change what reaches ``self.opt`` (gradients, loss, step count) but keep its state:
  the state accessors are ``self.opt``'s. Subclasses set ``self.opt`` and define ``name``, ``init`` and ``update``."""

  def get_params(self, state):
    return self.opt.get_params(state)

  def get_state(self, state):
    return self.opt.get_state(state)

  def set_params(self, state, params):
    return self.opt.set_params(state, params)


class GradientClipOptimizer(WrappedOptimizer):
  """Clips every gradient entry to ``[-grad_clip, grad_clip]`` before handing it to ``opt``."""

  def __init__(self, opt: Optimizer, grad_clip: float = 3.0):
    self.opt = _check_optimizer(opt, "opt")
    self.grad_clip = grad_clip

  @property
  def name(self) -> str:
    return f"GradientClip{self.grad_clip}_{self.opt.name}"

  def init(self, *args, **kwargs):
    return self.opt.init(*args, **kwargs)

  def update(self, opt_state, grad, *args, **kwargs):
    grad = jax.tree.map(lambda g: jnp.clip(g, -self.grad_clip, self.grad_clip), grad)
    return self.opt.update(opt_state, grad, *args, **kwargs)



@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GraftedOptimizerState:
  """State of `GraftedOptimizer`: the shared params / model state / iteration and both inner optimizers' states."""
  iteration: jax.Array
  params: Any
  state: Any
  mag_opt_state: Any
  dir_opt_state: Any


class GraftedOptimizer(Optimizer):
  """Learning-rate grafting: per tensor, the step of ``direction_opt`` rescaled to the norm of ``magnitude_opt``'s.

  Both inner optimizers see the same params and gradients; after each update both are given the grafted params.
  """

  def __init__(self, magnitude_opt: Optimizer, direction_opt: Optimizer):
    self.magnitude_opt = _check_optimizer(magnitude_opt, "magnitude_opt")
    self.direction_opt = _check_optimizer(direction_opt, "direction_opt")

  @property
  def name(self) -> str:
    return f"Grafted_{self.magnitude_opt.name}_{self.direction_opt.name}"

  def init(self, params, state=None, num_steps=None, key=None, **kwargs):
    state = kwargs.pop("model_state", state)
    k_mag, k_dir = (None, None) if key is None else jax.random.split(key)
    return GraftedOptimizerState(
        iteration=jnp.asarray(0, jnp.int32), params=params, state=state,
        mag_opt_state=self.magnitude_opt.init(params, state, num_steps=num_steps, key=k_mag),
        dir_opt_state=self.direction_opt.init(params, state, num_steps=num_steps, key=k_dir))

  def update(self, opt_state, grad, loss=None, model_state=None, key=None, **kwargs):
    k_mag, k_dir = (None, None) if key is None else jax.random.split(key)
    base = opt_state.params
    mag = self.magnitude_opt.update(opt_state.mag_opt_state, grad, loss=loss, model_state=model_state, key=k_mag)
    direction = self.direction_opt.update(opt_state.dir_opt_state, grad, loss=loss, model_state=model_state,
                                          key=k_dir)

    def graft(p, m, d):
      mag_step, dir_step = (m - p).astype(jnp.float32), (d - p).astype(jnp.float32)
      dir_norm = jnp.linalg.norm(dir_step)
      scale = jnp.where(dir_norm > 0, jnp.linalg.norm(mag_step) / jnp.where(dir_norm > 0, dir_norm, 1.0), 0.0)
      return (p + scale * dir_step).astype(p.dtype)

    params = jax.tree.map(graft, base, self.magnitude_opt.get_params(mag), self.direction_opt.get_params(direction))
    return GraftedOptimizerState(
        iteration=opt_state.iteration + 1, params=params,
        state=opt_state.state if model_state is None else model_state,
        mag_opt_state=self.magnitude_opt.set_params(mag, params),
        dir_opt_state=self.direction_opt.set_params(direction, params))


def _moved(name: str):
  def make(*args, **kwargs):
    import metafam.compat.learned_optimization.optimizers.optax_opts as optax_opts
    warnings.warn(f"optimizers.base.{name} has moved to optimizers.optax_opts.{name}.", DeprecationWarning,
                  stacklevel=2)
    return getattr(optax_opts, name)(*args, **kwargs)
  make.__name__ = make.__qualname__ = name
  make.__doc__ = f"Deprecated: builds optimizers.optax_opts.{name} (the reference's early location of it)."
  return make


# The reference's early releases defined these in this module; it keeps deprecated constructors under the names.
SGD, SGDM, RMSProp, Adam = (_moved(n) for n in ("SGD", "SGDM", "RMSProp", "Adam"))


def __getattr__(name: str) -> Any:
  if name in ("OptaxOptimizer", "PiecewiseLinearAdam"):
    import metafam.compat.learned_optimization.optimizers.optax_opts as optax_opts
    return getattr(optax_opts, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
