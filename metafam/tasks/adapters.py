"""Tasks from plain functions and from Equinox, Flax NNX and Flax linen models.

A model object mixes arrays to train with things that are not arrays (activation functions, layer sizes, a graph
definition). Optimizers, `jax.vmap` and the estimators need params that are arrays only, so each adapter splits the
model: its floating-point arrays are the task's params, its other arrays (integer buffers, NNX batch statistics and
RNG counters, linen collections other than ``"params"``) are the task's model state, and the rest is kept static,
outside every traced value. The loss rebuilds the model and calls the user's ``loss(model, key, batch) -> scalar``
with it, so that function is written against the library's own objects::

  task = equinox_task(lambda key: eqx.nn.MLP(4, 1, 32, 2, key=key), mse, datasets=data)
  params = task.init(key)            # the MLP's weights and biases, a pytree of arrays only

The model argument is either a model (every `init` returns its arrays) or a function ``key -> model`` (each key
builds a fresh one; a family's sampled floats, such as an init scale, enter here). The static part is found by
tracing that function abstractly (`jax.eval_shape`, nothing is computed) and is the same for every key.

Equinox and Flax are imported inside these functions only (`pip install "metafam[equinox]"` or
``"metafam[flax]"``), so the package never needs them.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional, Sequence, Tuple

import jax

from metafam.tasks.base import Task

UserLoss = Callable[[Any, jax.Array, Any], jax.Array]


def _require(module: str, extra: str, caller: str) -> Any:
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(f"{caller} needs {module.split('.')[0]} (pip install \"metafam[{extra}]\"): {e}") from None


def _default_name(prefix: str, loss: Any, fallback: str) -> str:
  """``prefix`` + the loss function's name, or ``fallback`` for a lambda."""
  name = getattr(loss, "__name__", "")
  return prefix + name if name.isidentifier() else fallback


def _check_callable(caller: str, name: str, fn: Any) -> None:
  if not callable(fn):
    raise TypeError(f"{caller}: {name} must be callable, got {type(fn).__name__}.")


class FunctionTask(Task):
  """A `Task` from two plain functions: ``init(key) -> params`` and ``loss(params, key, batch) -> scalar``.

  Args:
    init: builds the params (a pytree of arrays) from a key.
    loss: the scalar loss of ``params`` on ``batch`` (``batch`` is None when ``datasets`` is None).
    datasets: the `metafam.datasets.Datasets` the batches come from, or None.
    name: the task's name (default: the loss function's name, "FunctionTask" for a lambda).
  """

  def __init__(self, init: Callable[[jax.Array], Any], loss: Callable[[Any, jax.Array, Any], jax.Array],
               datasets: Any = None, name: Optional[str] = None):
    _check_callable("FunctionTask", "init", init)
    _check_callable("FunctionTask", "loss", loss)
    self._init_fn, self._loss_fn, self.datasets = init, loss, datasets
    self.name = name or _default_name("", loss, "FunctionTask")

  def init(self, key):
    return self._init_fn(key)

  def loss(self, params, key, batch):
    return self._loss_fn(params, key, batch)


class ModelTask(Task):
  """A `Task` whose params are the floating-point arrays of a model; built by `equinox_task`, `nnx_task` and
  `linen_task`, which supply the library's three operations.

  Args:
    make: ``key -> model``.
    loss: ``loss(model, key, batch) -> scalar``, called with the rebuilt model.
    split: ``model -> (params, state, static)``: arrays to train, other arrays, and the rest (no arrays).
    merge: ``(params, state, static) -> model``.
    after: ``(model, state) -> state``: the model state once the loss has run (e.g. NNX's updated statistics).
    datasets, name: as for every `Task`.
  """

  def __init__(self, make: Callable[[jax.Array], Any], loss: UserLoss, split: Callable, merge: Callable,
               after: Callable, datasets: Any = None, name: str = "ModelTask"):
    self._make, self._user_loss, self._split, self._merge, self._after = make, loss, split, merge, after
    self.datasets, self.name = datasets, name
    self._abstract: Optional[Tuple[Any, Any]] = None

  def _static_and_state(self) -> Tuple[Any, Any]:
    """The static part and the abstract model state, from one abstract trace of ``make`` (cached)."""
    if self._abstract is None:
      box = []

      def arrays(key):
        params, state, static = self._split(self._make(key))
        box.append(static)  # holds no tracer: every array went to params or state
        return state

      abstract_state = jax.eval_shape(arrays, jax.random.key(0))
      self._abstract = (box[0], abstract_state)
    return self._abstract

  def init_with_state(self, key):
    params, state, _ = self._split(self._make(key))
    return params, (state if jax.tree.leaves(state) else None)

  def model(self, params: Any, state: Any = None) -> Any:
    """The model with ``params`` (and model ``state``) put back: what the user's loss is called with."""
    static, abstract_state = self._static_and_state()
    if state is None:
      if jax.tree.leaves(abstract_state):
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(abstract_state)[0]]
        raise ValueError(f"{self.name}: the model has arrays that are not trained params ({', '.join(paths[:4])}"
                         f"{', ...' if len(paths) > 4 else ''}); they are model state: get them from "
                         "init_with_state and pass them to loss_with_state.")
      state = abstract_state
    return self._merge(params, state, static)

  def loss_with_state_and_aux(self, params, state, key, batch):
    model = self.model(params, state)
    loss = self._user_loss(model, key, batch)
    if state is not None:
      state = self._after(model, state)
    return loss, state, {}


def _keep_state(model: Any, state: Any) -> Any:
  return state


def _model_maker(caller: str, model: Any, module_type: type, loss: UserLoss) -> Callable[[jax.Array], Any]:
  """``key -> model`` from a model of ``module_type`` or such a function, once ``loss`` is known to be callable."""
  _check_callable(caller, "loss", loss)
  if isinstance(model, module_type):
    return lambda key: model
  if callable(model):
    return model
  raise TypeError(f"{caller}: model must be a {module_type.__module__}.{module_type.__qualname__} or a function "
                  f"key -> model, got {type(model).__name__}.")


def equinox_task(model: Any, loss: UserLoss, datasets: Any = None, name: Optional[str] = None) -> ModelTask:
  """A `Task` for an Equinox model: params are its floating-point arrays (``eqx.is_inexact_array``).

  Other arrays are the model state (returned unchanged); non-array leaves (activations, sizes) are static.

  Args:
    model: an ``eqx.Module``, or a function ``key -> eqx.Module``.
    loss: ``loss(model, key, batch) -> scalar`` (e.g. ``jnp.mean((jax.vmap(model)(batch["x"]) - batch["y"])**2)``).
    datasets: the task's `metafam.datasets.Datasets`, or None.
    name: the task's name (default "equinox_" and the loss function's name; "equinox_task" for a lambda).
  """
  eqx = _require("equinox", "equinox", "equinox_task")
  make = _model_maker("equinox_task", model, eqx.Module, loss)

  def split(m):
    params, rest = eqx.partition(m, eqx.is_inexact_array)
    state, static = eqx.partition(rest, eqx.is_array)
    return params, state, static

  return ModelTask(make, loss, split, lambda p, s, static: eqx.combine(p, s, static), _keep_state, datasets,
                   name or _default_name("equinox_", loss, "equinox_task"))


def nnx_task(model: Any, loss: UserLoss, datasets: Any = None, name: Optional[str] = None) -> ModelTask:
  """A `Task` for a Flax NNX model: params are its ``nnx.Param`` variables as a plain nested dict.

  ``nnx.split(model, nnx.Param, ...)`` separates the graph definition (static), the params and every other variable
  (batch statistics, RNG state: the model state, as a plain dict too); the loss rebuilds the model with
  ``nnx.merge`` and returns the other variables as they are after the call (so ``nnx.BatchNorm``'s running
  averages update through `loss_with_state`).

  Args:
    model: an ``nnx.Module``, or a function ``key -> nnx.Module`` (e.g. ``lambda key: MLP(rngs=nnx.Rngs(key))``).
    loss: ``loss(model, key, batch) -> scalar``.
    datasets: the task's `metafam.datasets.Datasets`, or None.
    name: the task's name (default "nnx_" and the loss function's name; "nnx_task" for a lambda).
  """
  nnx = _require("flax.nnx", "flax", "nnx_task")
  make = _model_maker("nnx_task", model, nnx.Module, loss)

  def split(m):
    graphdef, params, rest = nnx.split(m, nnx.Param, ...)
    return nnx.to_pure_dict(params), nnx.to_pure_dict(rest), graphdef

  def after(m, state):
    return nnx.to_pure_dict(nnx.split(m, nnx.Param, ...)[2])

  return ModelTask(make, loss, split, lambda p, s, graphdef: nnx.merge(graphdef, p, s), after, datasets,
                   name or _default_name("nnx_", loss, "nnx_task"))


def linen_task(module: Any, loss: UserLoss, example_args: Sequence[Any], datasets: Any = None,
               name: Optional[str] = None) -> ModelTask:
  """A `Task` for a Flax linen module: params are ``module.init(key, *example_args)["params"]``.

  The loss gets the module bound to its variables (``module.bind(variables)``), callable like the module's
  ``apply``. Collections other than ``"params"`` are the model state, read-only (e.g. BatchNorm with
  ``use_running_average=True``).

  Args:
    module: a ``flax.linen.Module`` (its definition: linen modules hold no arrays).
    loss: ``loss(model, key, batch) -> scalar``, with ``model`` the bound module.
    example_args: the positional arguments `init` traces the module with, e.g. ``(x[:1],)``.
    datasets: the task's `metafam.datasets.Datasets`, or None.
    name: the task's name (default "linen_" and the loss function's name; "linen_task" for a lambda).
  """
  nn = _require("flax.linen", "flax", "linen_task")
  if not isinstance(module, nn.Module):
    raise TypeError(f"linen_task: module must be a flax.linen.Module, got {type(module).__name__}.")
  _check_callable("linen_task", "loss", loss)
  if not isinstance(example_args, (tuple, list)):
    raise TypeError(f"linen_task: example_args must be a tuple of the module's positional inputs, e.g. (x[:1],); "
                    f"got {type(example_args).__name__}.")
  example_args = tuple(example_args)

  def make(key):
    return dict(module.init(key, *example_args))

  def split(variables):
    rest = {k: v for k, v in variables.items() if k != "params"}
    return variables.get("params", {}), rest, None

  def merge(params, state, static):
    return module.bind({"params": params, **state})

  return ModelTask(make, loss, split, merge, _keep_state, datasets,
                   name or _default_name("linen_", loss, "linen_task"))

