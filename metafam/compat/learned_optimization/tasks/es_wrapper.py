"""`learned_optimization.tasks.es_wrapper`: tasks whose gradients are antithetic evolution-strategies estimates.

The estimator is metafam's `metafam.tasks.augmentations.antithetic_es_value_and_grad` (``e ~ std * N(0, I)``,
gradient ``e (f(x + e) - f(x - e)) / (2 std^2)`` averaged over pairs) and `ESTask` is metafam's
`metafam.tasks.augmentations.ESGradients`; the reference's function signatures (a wrapped ``loss_fn`` called with
``es_key=``) are thin adapters over it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax

from metafam.compat.learned_optimization.outer_trainers import common
from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.parametric import cfgobject
from metafam.tasks.augmentations import ESGradients, antithetic_es_value_and_grad as _es

ArrayTree = Any
PRNGKey = jax.Array
LossFN = Callable
ValueGradFN = Callable

__all__ = ["ArrayTree", "PRNGKey", "LossFN", "ValueGradFN", "antithetic_es_value_and_grad",
           "multi_antithetic_es_value_and_grad", "ESTask", "ESTaskFamily"]


def _wrap(loss_fn: LossFN, has_aux: bool, std: float, n_pairs: int, vec_aux: bool = False) -> ValueGradFN:
  @functools.wraps(loss_fn)
  def fn(theta, *args, es_key=None, **kwargs):
    if es_key is None:
      raise ValueError("call the ES value-and-grad function with es_key=<a PRNGKey>.")
    out = _es(lambda t: loss_fn(t, *args, **kwargs), theta, es_key, std, n_pairs, has_aux=has_aux)
    if not has_aux:
      return out
    (value, aux), grad = out  # aux: [n_pairs, 2, ...]; the reference keeps the first pair (its plus side)
    return (value, jax.tree.map(lambda a: a[0] if vec_aux else a[0, 0], aux)), grad
  return fn


def antithetic_es_value_and_grad(loss_fn: LossFN, has_aux: bool = False, std: float = 0.01, vec_aux: bool = False,
                                 vmap: bool = True) -> ValueGradFN:
  """``loss_fn`` -> ``fn(theta, *args, es_key=key, **kwargs) -> (value, grad)`` (``((value, aux), grad)`` with
  ``has_aux``) from one antithetic pair; ``vec_aux`` stacks the aux of both evaluations. ``vmap`` is accepted
  (the pair always runs under `jax.vmap`)."""
  del vmap
  return _wrap(loss_fn, has_aux, std, 1, vec_aux)


def multi_antithetic_es_value_and_grad(loss_fn: LossFN, has_aux: bool = False, std: float = 0.01,
                                       n_pairs: int = 2) -> ValueGradFN:
  """As `antithetic_es_value_and_grad`, averaged over ``n_pairs`` antithetic pairs."""
  return _wrap(loss_fn, has_aux, std, n_pairs)


def _sample_perturbations(variables: Any, key: PRNGKey, std: float) -> Any:
  """Gaussian noise of standard deviation ``std`` shaped like ``variables`` (`outer_trainers.common`'s draw)."""
  return common.sample_perturbations(variables, key, std)


def _vector_sample_perturbations(theta: Any, key: PRNGKey, std: float, num_samples: int):
  """``num_samples`` antithetic pairs: ``(eps, theta + eps, theta - eps)``, each with a leading sample axis."""
  return common.vector_sample_perturbations(theta, key, std, num_samples)


class ESTask(ESGradients):
  """``task`` whose params gradient is an ES estimate with ``n_pairs`` pairs of standard deviation ``std``
  (metafam's `ESGradients`; the name stays the inner task's, as in the reference)."""

  def __init__(self, task: base.Task, std: float = 0.01, n_pairs: int = 8):
    super().__init__(task, std, n_pairs)
    self.name = task.name


class ESTaskFamily(base.TaskFamily):
  """Samples ``task_family`` and wraps each task in `ESTask`; configs are ``CFGNamed("ESTaskFamily",
  {"inner_cfg": cfg})``."""

  def __init__(self, task_family: base.TaskFamily, std: float, n_pairs: int):
    super().__init__()
    self.task_family, self._std, self._n_pairs = task_family, std, n_pairs
    self.datasets = task_family.datasets
    self.name = f"ES_{task_family.name}"

  def sample(self, key: PRNGKey) -> cfgobject.CFGNamed:
    return cfgobject.CFGNamed("ESTaskFamily", {"inner_cfg": self.task_family.sample(key)})

  def task_fn(self, cfg: cfgobject.CFGNamed) -> base.Task:
    return ESTask(self.task_family.task_fn(cfg.values["inner_cfg"]), std=self._std, n_pairs=self._n_pairs)
