"""The `Task`: one pure optimization problem.

A task bundles an initializer, a loss and (optionally) the datasets its batches come from. Every method is a pure
function of its arguments, so tasks can be jitted, vmapped and differentiated freely.

Argument order follows google/learned_optimization: ``(params, [state,] key, batch)``.

Defaults are symmetric: a subclass overrides *any one* loss variant (``loss``, ``loss_with_state``, ``loss_and_aux``
or ``loss_with_state_and_aux``) and *either* ``init`` or ``init_with_state``; every other variant is derived from it.
Stateless variants pass ``state=None`` to stateful implementations, and a stateless implementation returns the state
it was given unchanged. Variants without aux return an empty dict as aux.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

import jax
import numpy as np

from metafam._registry import Named

Params = Any
ModelState = Any
Batch = Any
Aux = Mapping[str, jax.Array]

_LOSS_VARIANTS = ("loss_with_state_and_aux", "loss_with_state", "loss_and_aux", "loss")


class Task(Named):
  """A pure problem: ``init(key) -> params`` and ``loss(params, key, batch) -> scalar``.

  Attributes:
    datasets: a `metafam.datasets.base.Datasets` whose batches feed `loss`, or None for data-free tasks (then
      `loss` is called with ``batch=None``).
    name: a short identifier used in logs and benchmark tables (defaults to the class name).
  """

  datasets = None

  # -- which methods did the subclass write? -------------------------------------------------------------------
  def _overrides(self, method: str) -> bool:
    return getattr(type(self), method) is not getattr(Task, method)

  # -- initialization -----------------------------------------------------------------------------------------
  def init(self, key: jax.Array) -> Params:
    """Returns freshly initialized parameters (any pytree)."""
    if self._overrides("init_with_state"):
      return self.init_with_state(key)[0]
    raise NotImplementedError(f"Task {self.name!r} must implement `init(key)` or `init_with_state(key)`.")

  def init_with_state(self, key: jax.Array) -> Tuple[Params, ModelState]:
    """Returns ``(params, model_state)``; model_state is None for stateless tasks."""
    if self._overrides("init"):
      return self.init(key), None
    raise NotImplementedError(f"Task {self.name!r} must implement `init(key)` or `init_with_state(key)`.")

  # -- losses -------------------------------------------------------------------------------------------------
  def loss_with_state_and_aux(self, params: Params, state: ModelState, key: jax.Array,
                              batch: Batch) -> Tuple[jax.Array, ModelState, Aux]:
    """The most general loss: returns ``(scalar loss, new model_state, aux dict)``."""
    if self._overrides("loss_with_state"):
      loss, state = self.loss_with_state(params, state, key, batch)
      return loss, state, {}
    if self._overrides("loss_and_aux"):
      loss, aux = self.loss_and_aux(params, key, batch)
      return loss, state, aux
    if self._overrides("loss"):
      return self.loss(params, key, batch), state, {}
    raise NotImplementedError(
        f"Task {self.name!r} must implement one of: {', '.join(_LOSS_VARIANTS)}.")

  def loss_with_state(self, params: Params, state: ModelState, key: jax.Array,
                      batch: Batch) -> Tuple[jax.Array, ModelState]:
    loss, state, _ = self.loss_with_state_and_aux(params, state, key, batch)
    return loss, state

  def loss_and_aux(self, params: Params, key: jax.Array, batch: Batch) -> Tuple[jax.Array, Aux]:
    loss, _, aux = self.loss_with_state_and_aux(params, None, key, batch)
    return loss, aux

  def loss(self, params: Params, key: jax.Array, batch: Batch) -> jax.Array:
    return self.loss_with_state_and_aux(params, None, key, batch)[0]

  # -- misc ---------------------------------------------------------------------------------------------------
  def normalizer(self, loss: jax.Array) -> jax.Array:
    """Maps a loss into a range comparable across tasks (identity by default)."""
    return loss

  def __repr__(self) -> str:
    return f"<Task {self.name}>"


def non_array_leaf(tree: Any) -> Optional[Tuple[str, Any]]:
  """``(path, leaf)`` of the first leaf of ``tree`` that is neither an array nor a number, or None.

  Params, model states and family configs must be arrays only; a model object handed over whole (an Equinox
  module with its activation functions, say) has other leaves, which this finds.
  """
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, complex)):
      return jax.tree_util.keystr(path), leaf
  return None


def check_array_leaves(owner: str, what: str, tree: Any) -> None:
  """Raises ValueError (one line) naming the first leaf of ``tree`` that is not an array (`non_array_leaf`) and how
  to split a model's arrays from the rest; ``owner`` and ``what`` name where it was found (``"task 'x'"``,
  ``"params"``). Works on traced values, so an engine calls it where it first initializes a task."""
  found = non_array_leaf(tree)
  if found is not None:
    path, leaf = found
    text = getattr(leaf, "__name__", None) or repr(leaf)
    text = text if len(text) <= 60 else text[:57] + "..."
    raise ValueError(
        f"{owner}: {what} leaf {path or '<root>'} is a {type(leaf).__name__} ({text}), not an array; params, "
        "model state and configs must hold arrays only. Split a model's arrays from the rest and rebuild it in the "
        "loss (Equinox: params, static = eqx.partition(model, eqx.is_inexact_array), then eqx.combine(params, "
        "static); Flax NNX: nnx.split / nnx.merge), or build the task with metafam.tasks.equinox_task, nnx_task or "
        "linen_task, which do that.")
