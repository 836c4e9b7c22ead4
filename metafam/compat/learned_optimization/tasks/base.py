"""`learned_optimization.tasks.base`: `Task`, `TaskFamily` and `single_task_to_family` over metafam's classes.

`Task` is metafam's task (``init``/``init_with_state`` and the four loss variants with the same argument order,
derived from whichever one a subclass writes). `TaskFamily` is metafam's family plus the reference library's
``eval_task_fn`` hook, so a family written for the reference library trains in `metafam.inner.TruncatedStep`.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Sequence, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from metafam._registry import UnknownNameError, unknown_name_message
from metafam.taskfamilies import base as _families
from metafam.tasks.base import Task

Params = Any
ModelState = Any
PRNGKey = jax.Array
TaskCfg = Any
Batch = Any
StaticCfg = Any
SampledCfg = Any
T = TypeVar("T")

__all__ = ["Task", "TaskFamily", "SampledTaskFamily", "single_task_to_family", "sample_single_task_family",
           "get_task_from_name", "sample_task_family_from_task_fns", "softmax_cross_entropy", "get_task", "Params",
           "ModelState", "PRNGKey", "TaskCfg", "Batch", "StaticCfg", "SampledCfg", "T"]


class TaskFamily(_families.TaskFamily):
  """metafam's `TaskFamily` (``sample(key)``, ``task_fn(cfg)``, ``sample_task(key)``, ``datasets``, ``name``) with
  ``eval_task_fn`` (the task used for evaluation; ``task_fn`` unless overridden) and ``eval_datasets``."""

  def eval_task_fn(self, cfg: TaskCfg) -> Task:
    return self.task_fn(cfg)

  @property
  def eval_datasets(self) -> Any:
    return self.datasets


class _SingleTaskFamily(TaskFamily):

  def __init__(self, task: Task, name: str, eval_task: Optional[Task]):
    super().__init__()
    self.task, self.eval_task = task, eval_task
    self.datasets = task.datasets
    self.name = name

  def sample(self, key):
    return jnp.zeros((), jnp.int32)  # a dummy config, as metafam's single-task family

  def task_fn(self, cfg):
    return self.task

  def eval_task_fn(self, cfg):
    return self.task if self.eval_task is None else self.eval_task


def single_task_to_family(task: Task, name: Optional[str] = None, eval_task: Optional[Task] = None) -> TaskFamily:
  """A family whose every sample is ``task`` (named ``name``, default the task's name); ``eval_task`` is what
  ``eval_task_fn`` returns (default ``task``)."""
  if not isinstance(task, Task):
    raise TypeError(f"single_task_to_family needs a Task, got {type(task).__name__}.")
  return _SingleTaskFamily(task, name if name else task.name, eval_task)


class SampledTaskFamily(TaskFamily):
  """A `TaskFamily` described by a fixed ``static_cfg`` and a ``sampled_cfg`` of random choices (annotations
  only, as in the reference)."""
  static_cfg: StaticCfg
  sampled_cfg: SampledCfg


def sample_single_task_family(key: PRNGKey, task_family: TaskFamily) -> TaskFamily:
  """Returns ``task_family`` (the key is unused); raises ValueError if it is not a `TaskFamily`."""
  del key
  if not isinstance(task_family, _families.TaskFamily):
    raise ValueError(f"task_family must be a TaskFamily, got {type(task_family).__name__}.")
  return task_family


_FIXED_PACKAGE = "metafam.compat.learned_optimization.tasks.fixed."


def _registered_tasks() -> dict:
  """``{name: constructor}`` of the fixed tasks of every `tasks.fixed` module imported so far: the reference's
  tasks register with gin when their module is imported, and this module imports none of them (no import circle)."""
  table = {}
  for name, module in list(sys.modules.items()):
    if name.startswith(_FIXED_PACKAGE) and module is not None:
      table.update({n: getattr(module, n) for n in getattr(module, "TASKS", {}) if hasattr(module, n)})
  return table


def get_task_from_name(task_name: str) -> Task:
  """A new instance of the fixed task ``task_name``, looked up, as the reference's gin lookup, among the tasks of
  the `tasks.fixed` modules imported so far (``tasks.fixed.all`` imports them all). Unknown names raise metafam's
  UnknownNameError listing the registered ones and this import requirement."""
  table = _registered_tasks()
  if task_name not in table:
    raise UnknownNameError(unknown_name_message(table, task_name, "learned_optimization fixed task") +
                           " (a task is registered when its module is imported, as with the reference's gin: "
                           "import learned_optimization.tasks.fixed.all, or the task's own module, first)")
  return table[task_name]()


def sample_task_family_from_task_fns(key: PRNGKey, task_names: Sequence[str]) -> TaskFamily:
  """A single-task family of one of ``task_names``, drawn uniformly with ``key``."""
  if isinstance(task_names, str) or not len(task_names):
    raise ValueError(f"task_names must be a non-empty sequence of task names, got {task_names!r}.")
  index = int(jax.random.randint(key, (), 0, len(task_names)))
  return single_task_to_family(get_task_from_name(task_names[index]))


def softmax_cross_entropy(*, logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example ``-sum(labels * log_softmax(logits), axis=-1)`` for (soft) label distributions ``labels``."""
  return -jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1)


def get_task(task_family: Optional[TaskFamily] = None, task_family_seed: Optional[int] = None,
             sample_task_family_fn: Optional[Callable[[PRNGKey], TaskFamily]] = None,
             sample_task_family_fn_seed: Optional[int] = None) -> Task:
  """A task from exactly one of ``task_family`` or ``sample_task_family_fn`` (which draws a family from
  ``PRNGKey(sample_task_family_fn_seed)``), sampled from the family with ``PRNGKey(task_family_seed)``. A seed left
  None is drawn at random, as in the reference."""
  if (task_family is None) == (sample_task_family_fn is None):
    raise ValueError("get_task needs exactly one of task_family and sample_task_family_fn; got "
                     f"task_family={task_family!r}, sample_task_family_fn={sample_task_family_fn!r}.")
  seed = lambda s: int(np.random.default_rng().integers(0, 100000)) if s is None else int(s)
  if sample_task_family_fn is not None:
    task_family = sample_task_family_fn(jax.random.PRNGKey(seed(sample_task_family_fn_seed)))
  return task_family.task_fn(task_family.sample(jax.random.PRNGKey(seed(task_family_seed))))
