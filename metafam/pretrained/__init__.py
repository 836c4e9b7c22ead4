"""Pretrained learned optimizers that ship inside the package: one line of optax for any JAX model.

    import metafam.pretrained
    tx = metafam.pretrained.optax_transform("generalist_v1", learning_rate=1e-2)   # or an optax schedule
    tx = metafam.pretrained.optax_transform("generalist_v2", 1e-2, num_steps=1000)  # it reads the run's length
    state = tx.init(params)                          # any pytree of float arrays: Flax, Equinox, Haiku, dicts
    updates, state = tx.update(grads, state, params)  # params are required
    params = optax.apply_updates(params, updates)

* `list()`: the shipped names; `info(name)`: what `load` reads (optimizer, recipe, licence, model card path).
* `load(name) -> (learned_optimizer, theta)`: the `metafam.optimizers.learned.LearnedOptimizer` as meta-trained and
  its meta-parameters, for `opt_fn`, further meta-training or inspection.
* `optax_transform(name, learning_rate, num_steps=None)`: the optimizer with fixed theta as an
  `optax.GradientTransformationExtraArgs`; ``num_steps``, the run's total number of updates, is required by an
  optimizer with a learned schedule (``info(name).uses_horizon``: generalist_v2) and unused by the others.
  ``optax.inject_hyperparams(optax_transform, static_args=("name", "num_steps"))`` makes the rate a hyperparameter
  of the state.

The weights are `metafam.runs.checkpoint` files (``.npz`` with a JSON header; nothing in them is executed)
in ``metafam/pretrained/data/``, each with a model card (``<name>.md``: architecture, recipe, data, compute, held-out
results, failure cases, licence). They are released under the Apache License 2.0, like the code.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import jax.numpy as jnp
import numpy as np
import optax

from metafam._checks import check_number
from metafam._registry import lookup

__all__ = ["PRETRAINED", "Pretrained", "info", "list", "load", "optax_transform"]

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")

LearningRate = Union[float, Callable[[Any], Any]]


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """A shipped learned optimizer: its weights file and model card (in ``metafam/pretrained/data``), the registered
  learned optimizer it instantiates, the shipped recipe that trained it (`metafam.runs.load_recipe`; the
  optimizer is built with the recipe's ``optimizer_kwargs``) and its default learning rate."""
  weights: str
  model_card: str
  optimizer: str
  recipe: str
  default_learning_rate: float
  summary: str

  @property
  def weights_path(self) -> str:
    return os.path.join(_DATA, self.weights)

  @property
  def model_card_path(self) -> str:
    return os.path.join(_DATA, self.model_card)

  @property
  def optimizer_kwargs(self) -> Dict[str, Any]:
    """The registered optimizer's arguments besides ``step_mult``: the recipe's ``optimizer_kwargs``."""
    from metafam.runs.recipes import load_recipe
    return dict(load_recipe(self.recipe).optimizer_kwargs)

  @property
  def uses_horizon(self) -> bool:
    """Whether its step depends on the run's length: `optax_transform` then needs ``num_steps``."""
    from metafam.optimizers.contract import uses_horizon
    from metafam.optimizers.registry import get_learned_optimizer
    return uses_horizon(get_learned_optimizer(self.optimizer, **self.optimizer_kwargs))


PRETRAINED: Dict[str, Pretrained] = {
    "generalist_v1": Pretrained(
        weights="generalist_v1.npz", model_card="generalist_v1.md", optimizer="adafac_muon_rms_lopt",
        recipe="generalist", default_learning_rate=1e-2,
        summary="adafac_muon_rms_lopt meta-trained by the generalist recipe (5 Fashion-MNIST families, NRES); the "
                "step's direction is learned, its size is the learning rate (unit RMS per tensor)."),
    "generalist_v2": Pretrained(
        weights="generalist_v2.npz", model_card="generalist_v2.md", optimizer="muon_residual_lopt",
        recipe="generalist_v2", default_learning_rate=0.0316,
        summary="Muon with 7 meta-trained numbers (recipe generalist_v2: 3 Fashion-MNIST families at 8x8, NRES with "
                "32 pairs): a gain for matrices, one for other tensors, and a step schedule over the fraction of "
                "training done, which needs the run's length (num_steps)."),
}


def list() -> List[str]:  # noqa: A001 -- the public name the issue and users ask for: metafam.pretrained.list()
  """The names of the shipped pretrained optimizers, sorted."""
  return sorted(PRETRAINED)


def info(name: str) -> Pretrained:
  """The `Pretrained` entry ``name`` (`UnknownNameError` listing the shipped names otherwise)."""
  return lookup(PRETRAINED, name, "pretrained optimizer")


def _check_learning_rate(learning_rate: Any) -> LearningRate:
  import jax
  if callable(learning_rate):
    return learning_rate
  if isinstance(learning_rate, jax.Array) and jnp.ndim(learning_rate) == 0 and jnp.issubdtype(
      learning_rate.dtype, jnp.floating):
    try:
      _check_learning_rate(float(learning_rate))
    except jax.errors.ConcretizationTypeError:
      pass  # traced, e.g. by optax.inject_hyperparams under jit: checked only where concrete
    return lambda count: learning_rate
  ok = (isinstance(learning_rate, (int, float, np.integer, np.floating)) and not isinstance(learning_rate, bool)
        and bool(np.isfinite(learning_rate)) and learning_rate > 0)
  if not ok:
    raise ValueError(f"learning_rate must be a finite number > 0 or an optax schedule (a callable of the step "
                     f"count), got {learning_rate!r}.")
  return float(learning_rate)


def _check_num_steps(num_steps: Any) -> int:
  import jax
  if isinstance(num_steps, jax.Array) and jnp.ndim(num_steps) == 0 and jnp.issubdtype(num_steps.dtype, jnp.integer):
    try:
      num_steps = int(num_steps)
    except jax.errors.ConcretizationTypeError:
      raise ValueError("num_steps must be a concrete integer, not a traced array: with optax.inject_hyperparams, "
                       "pass static_args=(\"name\", \"num_steps\").") from None
  return int(check_number("num_steps", num_steps, low=1, integer=True))


def load(name: str, learning_rate: LearningRate = None) -> Tuple[Any, Any]:
  """``(learned_optimizer, theta)`` of the shipped optimizer ``name``.

  ``learning_rate`` (a number or an optax schedule; default the entry's ``default_learning_rate``) becomes the
  learned optimizer's ``step_mult`` (generalist_v1: the RMS of each tensor's step; generalist_v2: Muon's learning
  rate before the learned gains and schedule). The optimizer is built with the recipe's ``optimizer_kwargs``.
  ``theta`` is a dict of numpy float32 arrays read without executing anything; the file is checked to match the
  optimizer's meta-parameter structure. For an optimizer with a learned schedule, pass the run's length to
  ``lopt.as_optax(theta, num_steps=T)`` or ``lopt.init(..., num_steps=T)``.
  """
  import jax
  from metafam.optimizers.registry import get_learned_optimizer
  from metafam.runs import checkpoint
  entry = info(name)
  rate = entry.default_learning_rate if learning_rate is None else _check_learning_rate(learning_rate)
  lopt = get_learned_optimizer(entry.optimizer, **entry.optimizer_kwargs, step_mult=rate)
  like = jax.eval_shape(lopt.init, jax.random.key(0))
  theta, _ = checkpoint.load(entry.weights_path, like=like)
  checkpoint.check_finite(theta, entry.weights_path, "pretrained meta-parameters")
  return lopt, theta


def optax_transform(name: str, learning_rate: LearningRate,
                    num_steps: Optional[int] = None) -> optax.GradientTransformationExtraArgs:
  """The shipped learned optimizer ``name`` as an optax transformation, at ``learning_rate`` (a number or an optax
  schedule of the update count).

  ``num_steps``: the run's total number of updates, a positive integer. An optimizer with a learned schedule over the
  fraction of training done (``info(name).uses_horizon``: generalist_v2) needs it and raises a ValueError naming it
  without; it is checked and unused for the others, so one call serves every name. Past ``num_steps`` updates the
  schedule stays at its last value.

  Works on any pytree of floating-point arrays of any shapes (scalars, vectors, matrices, conv kernels; float32,
  bfloat16, float16 or float64 leaves) under `jax.jit`, `jax.vmap` and sharded params (every operation is per
  tensor). The updates have the params' dtypes; the optimizer computes in float32 (float64 for float64 params).
  ``update(grads, state, params)`` needs ``params``; the state holds no copy of them.

  State: an int32 count plus per-tensor accumulators, float32.
  * generalist_v1 (`metafam.optimizers.adafac_mlp_lopt.AdafacOptaxState`; a tensor of rank >= 2 is the matrix
    ``[prod(shape[:-1]), shape[-1]]``): 3 momenta of the tensor's size and, for rank >= 2, 3 row and 3 column
    factors (3 x (rows + columns) numbers), for a vector or scalar 3 second moments: about three numbers per
    parameter for matrix-dominated models (Adam: two).
  * generalist_v2 (`metafam.optimizers.contract.LearnedOptState`): Muon's momentum for a 2-D tensor or a
    4-D conv kernel (the matrix ``[kh * kw * c_in, c_out]``), Adam's two moments for every other tensor: about one
    number per parameter for matrix-dominated models.
  """
  from metafam.optimizers.contract import uses_horizon
  rate = _check_learning_rate(learning_rate)
  num_steps = None if num_steps is None else _check_num_steps(num_steps)
  lopt, theta = load(name, rate)
  if not uses_horizon(lopt):
    return lopt.as_optax(theta)
  if num_steps is None:
    raise ValueError(f"{name} has a learned schedule over the fraction of training done: pass num_steps= (the run's "
                     f"total number of updates), e.g. optax_transform({name!r}, learning_rate, num_steps=1000).")
  return lopt.as_optax(theta, num_steps)
