"""Any `Optimizer` (for instance a learned optimizer with fixed ``theta``) as an optax transformation.

    tx = optimizer_as_optax(lopt.opt_fn(theta))      # or lopt.as_optax(theta), or as_optax(lopt, theta)
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)   # extra keyword args: loss=, model_state=, key=
    params = optax.apply_updates(params, updates)

The optax state (`OptaxAdapterState`) holds the `Optimizer` state. ``update`` first puts the ``params`` it is given
into that state (so the optimizer always sees the real current params, also inside `optax.chain`), runs
``Optimizer.update`` and returns ``new_params - params`` as the updates. With ``params=None`` the params stored in
the state are used.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import optax

from metafam.optimizers.base import Optimizer


@functools.partial(jax.tree_util.register_dataclass, data_fields=["inner"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class OptaxAdapterState:
  """The optax state of `optimizer_as_optax`.

  Attributes:
    inner: the wrapped `Optimizer`'s state (it carries a copy of the params).
  """
  inner: Any


def _with_params(inner: Any, params: Any) -> Any:
  if dataclasses.is_dataclass(inner) and any(f.name == "params" for f in dataclasses.fields(inner)):
    return dataclasses.replace(inner, params=params)
  raise TypeError(f"optimizer_as_optax needs optimizer states that are dataclasses with a `params` field, got "
                  f"{type(inner).__name__}; call update with params=None to use the params stored in the state.")


def optimizer_as_optax(opt: Optimizer, set_params: Optional[Callable[[Any, Any], Any]] = None
                       ) -> optax.GradientTransformationExtraArgs:
  """``opt`` as an `optax.GradientTransformationExtraArgs` whose updates are ``new_params - params``.

  ``set_params(state, params)`` puts the params given to ``update`` into ``opt``'s state (default: replace the
  ``params`` field of a dataclass state; wrappers whose states nest the params pass their own).

  Extra keyword arguments ``loss``, ``model_state`` and ``key`` are forwarded to ``opt.update``; others are ignored
  (as optax does for transformations that do not use them).
  """
  if not isinstance(opt, Optimizer):
    raise TypeError(f"optimizer_as_optax needs a metafam Optimizer, got {type(opt).__name__}.")

  def init_fn(params):
    return OptaxAdapterState(inner=opt.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    inner = state.inner if params is None else (set_params or _with_params)(state.inner, params)
    old = opt.get_params(inner)
    inner = opt.update(inner, updates, loss=extra_args.get("loss"), model_state=extra_args.get("model_state"),
                       key=extra_args.get("key"))
    new = opt.get_params(inner)
    return jax.tree.map(lambda n, o: (n - o).astype(o.dtype), new, old), OptaxAdapterState(inner=inner)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def as_optax(lopt: Any, theta: Any) -> optax.GradientTransformationExtraArgs:
  """The learned optimizer ``lopt`` with fixed meta-parameters ``theta`` as an optax transformation."""
  return optimizer_as_optax(lopt.opt_fn(theta))
