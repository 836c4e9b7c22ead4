"""The reference's `Optimizer` interface (`base.Optimizer`), in a module of its own so that both `base` and
`optax_opts` build on it without importing each other at import time (`base` resolves the names it once exported,
`SGD`, `Adam`, ..., from `optax_opts`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

from metafam.optimizers import base as _base

Params = Any
ModelState = Any
OptState = Any


def _replace_params(state: Any, params: Any) -> Any:
  if hasattr(state, "_replace"):
    return state._replace(params=params)
  if dataclasses.is_dataclass(state) and any(f.name == "params" for f in dataclasses.fields(state)):
    return dataclasses.replace(state, params=params)
  raise TypeError(f"set_params needs a state with a `params` field (a dataclass or namedtuple), got "
                  f"{type(state).__name__}; override set_params for this optimizer.")


class Optimizer(_base.Optimizer):
  """metafam's `Optimizer` with the reference's ``get_params_state`` and ``set_params``.

  Subclasses implement ``init`` and ``update`` (pure functions of their arguments).
  """

  def get_params_state(self, state: OptState) -> Tuple[Params, ModelState]:
    return self.get_params(state), self.get_state(state)

  def set_params(self, state: OptState, params: Params) -> OptState:
    return _replace_params(state, params)
