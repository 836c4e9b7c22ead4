"""Optimizers by name or checkpoint, for the benchmark and the command line.

* `load_theta` / `learned_optimizer` / `learned_optimizer_from_checkpoint`: a learned optimizer's meta-parameters read
  from a checkpoint (nothing in it is executed) and checked against the optimizer's structure.
* `optimizer_by_name`: the command line's ``--optimizer`` / ``--checkpoint``.
* `resolve_optimizer`: a metafam `Optimizer`, an optax transformation or a ``(learned optimizer, theta)`` pair as
  a named `Optimizer`.

Scoring lives in `metafam.benchmark.scoring` (`score`, the one path) and `metafam.benchmark.heldout`.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam._registry import lookup
from metafam.compat import flax_msgpack
from metafam.inner.runner import as_optimizer
from metafam.optimizers.base import Optimizer
from metafam.optimizers.learned import LearnedOptimizer
from metafam.runs import checkpoint


# -- optimizers ---------------------------------------------------------------------------------------------------
def load_theta(path: Union[str, os.PathLike]) -> Any:
  """Meta-parameters from a `metafam.runs.checkpoint` file holding a MetaTrainState (its ``theta``) or a
  bare theta pytree; leaves come back as numpy arrays in plain containers (see `checkpoint.load`). A
  learned_optimization (flax-msgpack) parameter file is read too (`flax_msgpack.plain_theta`: its ``params``).

  Nothing in the file is executed: pickles are refused, and so are meta-parameters with a NaN or an infinity
  (`checkpoint.CheckpointError` naming the leaf).
  """
  path = os.fspath(path)
  if flax_msgpack.looks_like_msgpack(path):
    theta = flax_msgpack.plain_theta(flax_msgpack.load(path))
  else:
    header, tree = checkpoint.read(path)
    theta = tree["theta"] if header.root_class == "MetaTrainState" else tree
  checkpoint.check_finite(theta, path, "meta-parameter theta")
  return theta


def learned_optimizer(lopt: LearnedOptimizer, theta_or_path: Any) -> Optimizer:
  """``lopt.opt_fn(theta)`` with ``theta`` given or loaded from a checkpoint path (see `load_theta`).

  Raises ValueError if ``theta``'s structure or leaf shapes differ from ``lopt.init``'s (a checkpoint of another
  learned optimizer or configuration).
  """
  if isinstance(theta_or_path, (str, os.PathLike)):
    theta = load_theta(theta_or_path)
  else:
    theta = theta_or_path
  return lopt.opt_fn(fit_theta(lopt, theta))


def fit_theta(lopt: LearnedOptimizer, theta: Any) -> Any:
  """``theta`` as ``lopt``'s meta-parameters: the structure and leaf shapes of ``lopt.init``'s, leaves cast to its
  dtypes. Raises ValueError if they differ (a theta of another learned optimizer or configuration)."""
  expected = jax.eval_shape(lopt.init, jax.random.key(0))
  got_leaves, got_def = jax.tree.flatten(theta)
  want_leaves, want_def = jax.tree.flatten(expected)
  if got_def != want_def or any(np.shape(g) != w.shape for g, w in zip(got_leaves, want_leaves)):
    raise ValueError(f"theta does not fit {lopt.name}: got structure {got_def} with shapes "
                     f"{[np.shape(g) for g in got_leaves]}, expected {want_def} with {[w.shape for w in want_leaves]}.")
  return jax.tree.map(lambda x, w: jnp.asarray(x, w.dtype), theta, expected)


def learned_optimizer_from_checkpoint(name: str, path: Union[str, os.PathLike]) -> Optimizer:
  """The registered learned optimizer ``name`` with the meta-parameters in ``path`` (`learned_optimizer`), built as it
  was meta-trained: a meta-training checkpoint records the run's recipe, whose ``step_mult`` is passed back (a wrong
  scale would silently change every update); otherwise the library default."""
  from metafam.optimizers.registry import get_learned_optimizer, takes_step_mult
  try:
    config = checkpoint.read_metadata(os.fspath(path)).get("config")
  except checkpoint.CheckpointError:
    config = None  # not a meta-training checkpoint: `learned_optimizer` says what it is
  recipe = config.get("recipe") if isinstance(config, dict) else None  # `Recipe.identity`'s part
  step_mult = recipe.get("step_mult") if isinstance(recipe, dict) else None
  kwargs = {"step_mult": step_mult} if step_mult is not None and takes_step_mult(name) else {}
  return learned_optimizer(get_learned_optimizer(name, **kwargs), path)



def optimizer_by_name(name: str, *, learning_rate: float, checkpoint: Optional[str] = None,
                      names: Tuple[str, str] = ("optimizer", "checkpoint")) -> Dict[str, Optimizer]:
  """``{label: optimizer}``: the registered hand-designed ``name`` at ``learning_rate``, or the registered learned
  ``name`` with the meta-parameters in the file ``checkpoint`` (`learned_optimizer_from_checkpoint`), labelled
  ``name@<the checkpoint's directory>``.

  Raises ValueError (`UnknownNameError` listing both registries for an unknown name) for a checkpoint given with a
  hand-designed optimizer, missing for a learned one, no file (checked first) or not of ``name``; the messages call the two
  arguments ``names`` (the command line passes its flags).
  """
  from metafam.optimizers.registry import HAND_DESIGNED, LEARNED_OPTIMIZERS
  opt_arg, ckpt_arg = names
  make = lookup({**LEARNED_OPTIMIZERS, **HAND_DESIGNED}, name, "optimizer")
  if checkpoint is not None and not os.path.isfile(checkpoint):  # first: a wrong path is the likelier mistake
    raise ValueError(f"{ckpt_arg} {checkpoint!r}: no such file" + (" (it is a directory)." if os.path.isdir(checkpoint)
                                                                 else "."))
  if name in HAND_DESIGNED:
    if checkpoint is not None:
      raise ValueError(f"{ckpt_arg} holds a learned optimizer; use {opt_arg} with one of "
                       f"{', '.join(sorted(LEARNED_OPTIMIZERS))}.")
    opt = make(learning_rate)
    return {opt.name: opt}
  if checkpoint is None:
    raise ValueError(f"{opt_arg}={name} is a learned optimizer: give its meta-parameters with {ckpt_arg}=PATH "
                     "(a checkpoint written by `metafam meta-train`).")
  try:
    opt = learned_optimizer_from_checkpoint(name, checkpoint)
  except ValueError as e:
    raise ValueError(f"{ckpt_arg} does not hold {name} meta-parameters: {e}") from None
  return {f"{name}@{os.path.basename(os.path.dirname(os.path.abspath(checkpoint))) or 'checkpoint'}": opt}

OptimizerSpec = Union[Optimizer, optax.GradientTransformation, Tuple[LearnedOptimizer, Any]]


def _is_learned_pair(obj: Any) -> bool:
  return (isinstance(obj, tuple) and not isinstance(obj, optax.GradientTransformation) and len(obj) == 2
          and isinstance(obj[0], LearnedOptimizer))


def resolve_optimizer(spec: OptimizerSpec) -> Tuple[str, Optimizer]:
  """``(default name, Optimizer)`` for a metafam `Optimizer`, an optax transformation (`as_optimizer` wraps both,
  as every engine does) or ``(lopt, theta|path)``."""
  if isinstance(spec, (Optimizer, optax.GradientTransformation)):
    return (spec.name if isinstance(spec, Optimizer) else "optax"), as_optimizer(spec)
  if _is_learned_pair(spec):
    return spec[0].name, learned_optimizer(*spec)
  raise TypeError(f"an optimizer must be a metafam Optimizer, an optax.GradientTransformation or a "
                  f"(LearnedOptimizer, theta or checkpoint path) pair, got {type(spec).__name__}.")
