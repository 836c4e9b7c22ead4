"""`TaskFamily`: a distribution over tasks with static shapes, so many instances train in one vmapped program.

``sample(key)`` returns a config pytree of arrays whose shapes and dtypes never depend on the key; ``task_fn(cfg)``
builds a `Task` from a (possibly traced) config. Choices that change shapes (architecture, dataset, batch size) are
fixed per family object; one compile per family. Discrete choices inside the graph (e.g. the activation) are int32
config leaves dispatched with `jax.lax.switch`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metafam._registry import Named
from metafam.datasets.base import dtype_of
from metafam.tasks.base import Task, check_array_leaves


class TaskFamily(Named):
  """Base class: subclasses implement `sample` and `task_fn` and may set ``self.datasets`` in ``__init__``."""

  datasets = None

  def __init__(self):
    pass

  def sample(self, key: jax.Array) -> Any:
    """A config pytree of arrays with key-independent shapes and dtypes."""
    raise NotImplementedError(f"TaskFamily {self.name!r} must implement sample(key).")

  def task_fn(self, cfg: Any) -> Task:
    """The task for config ``cfg`` (may be traced: build no Python control flow on its values)."""
    raise NotImplementedError(f"TaskFamily {self.name!r} must implement task_fn(cfg).")

  def sample_task(self, key: jax.Array) -> Task:
    return self.task_fn(self.sample(key))

  def __repr__(self) -> str:
    return f"<TaskFamily {self.name}>"


class _SingleTaskFamily(TaskFamily):

  def __init__(self, task: Task):
    super().__init__()
    self.task = task
    self.datasets = task.datasets
    self.name = f"{task.name}_family"

  def sample(self, key):
    return jnp.zeros((), jnp.int32)

  def task_fn(self, cfg):
    return self.task


class FunctionFamily(TaskFamily):
  """A `TaskFamily` from two plain functions: ``sample(key) -> cfg`` and ``task_fn(cfg) -> Task``.

  Host-side choices that change shapes (a width, a depth) are fixed per family object, e.g. by a function that
  takes the width and returns a `FunctionFamily`; sampled values (an init scale) go in the config.

  Args:
    sample: a config pytree of arrays whose shapes and dtypes never depend on the key.
    task_fn: the `Task` of a (possibly traced) config.
    datasets: the family's `metafam.datasets.Datasets` (shared by its tasks), or None.
    name: the family's name (default "FunctionFamily").
  """

  def __init__(self, sample: Callable[[jax.Array], Any], task_fn: Callable[[Any], Task], datasets: Any = None,
               name: Optional[str] = None):
    super().__init__()
    for arg, fn in (("sample", sample), ("task_fn", task_fn)):
      if not callable(fn):
        raise TypeError(f"FunctionFamily: {arg} must be callable, got {type(fn).__name__}.")
    self._sample_fn, self._task_fn, self.datasets = sample, task_fn, datasets
    if name is not None:
      self.name = name

  def sample(self, key):
    return self._sample_fn(key)

  def task_fn(self, cfg):
    return self._task_fn(cfg)


def single_task_to_family(task: Task) -> TaskFamily:
  """A family whose config is a dummy int32 scalar and whose `task_fn` always returns ``task`` itself."""
  if not isinstance(task, Task):
    raise TypeError(f"single_task_to_family needs a Task, got {type(task).__name__}.")
  return _SingleTaskFamily(task)


def _describe(tree: Any) -> dict:
  return {jax.tree_util.keystr(path): (tuple(np.shape(x)), dtype_of(x).name)
          for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _check_arrays(what: str, family: TaskFamily, tree: Any) -> None:
  """Raises ValueError (one line) naming the first leaf of ``tree`` that is not an array, and the fix."""
  check_array_leaves(family.name, what, tree)


def _compare(what: str, family: TaskFamily, trees: list) -> None:
  for tree in trees:
    _check_arrays(what, family, tree)
  first = _describe(trees[0])
  for i, tree in enumerate(trees[1:], start=1):
    other = _describe(tree)
    if set(other) != set(first):
      missing, extra = sorted(set(first) - set(other)), sorted(set(other) - set(first))
      raise ValueError(f"{family.name}: the {what} tree changes across samples (sample {i} lacks {missing}, "
                       f"adds {extra}); it must have a static structure.")
    for leaf, spec in first.items():
      if other[leaf] != spec:
        raise ValueError(f"{family.name}: {what} leaf {leaf or '<root>'} is {spec[1]}{list(spec[0])} in sample 0 "
                         f"but {other[leaf][1]}{list(other[leaf][0])} in sample {i}; shapes and dtypes must not "
                         "depend on the key.")


def example_batch(datasets: Any) -> Any:
  """A real train batch if the family has datasets, else None."""
  return None if datasets is None else next(datasets.train)


def check_family(family: TaskFamily, key: Optional[jax.Array] = None, num_samples: int = 4) -> None:
  """Checks that ``family`` can be vmapped; raises ValueError naming the offending leaf.

  Samples ``num_samples`` configs one key at a time and compares their leaves' shapes and dtypes, does the same for
  the initial params/state (a leaf that is not an array, such as a module's activation function, is named with how to
  split a model's arrays from the rest), then runs a jitted, vmapped ``sample``, ``init`` and ``value_and_grad`` of the loss and
  checks that the losses are finite scalars.
  """
  if num_samples < 2:
    raise ValueError(f"num_samples must be >= 2 to compare samples, got {num_samples}.")
  key = jax.random.key(0) if key is None else key
  keys = jax.random.split(key, num_samples)
  cfgs = [family.sample(k) for k in keys]
  _compare("config", family, cfgs)
  inits = [family.task_fn(c).init_with_state(k) for c, k in zip(cfgs, keys)]
  _check_arrays("params", family, inits[0][0])
  _check_arrays("model state", family, inits[0][1])
  _compare("init (params, state)", family, inits)

  batch = example_batch(family.datasets)

  @jax.jit
  def run(keys):
    cfgs = jax.vmap(family.sample)(keys)

    def one(cfg, k):
      task = family.task_fn(cfg)
      params, state = task.init_with_state(k)
      loss_fn = lambda p: task.loss_with_state(p, state, k, batch)[0]
      return jax.value_and_grad(loss_fn)(params)

    return jax.vmap(one)(cfgs, keys)

  losses, grads = run(keys)
  if losses.shape != (num_samples,):
    raise ValueError(f"{family.name}: the loss must be a scalar per task; got shape {losses.shape[1:]}.")
  bad = [jax.tree_util.keystr(p) for p, g in jax.tree_util.tree_flatten_with_path(grads)[0]
         if not bool(jnp.all(jnp.isfinite(g)))]
  if not bool(jnp.all(jnp.isfinite(losses))) or bad:
    raise ValueError(f"{family.name}: non-finite values in vmapped losses {np.asarray(losses)} or grads {bad}.")
