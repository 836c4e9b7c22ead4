"""`learned_optimization.tasks.base`: `Task`, `TaskFamily` and `single_task_to_family` over metafam's classes.

`Task` is metafam's task (``init``/``init_with_state`` and the four loss variants with the same argument order,
derived from whichever one a subclass writes). `TaskFamily` is metafam's family plus the reference library's
``eval_task_fn`` hook, so a family written for the reference library trains in `metafam.inner.TruncatedStep`.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from metafam.taskfamilies import base as _families
from metafam.tasks.base import Task

Params = Any
ModelState = Any
PRNGKey = jax.Array
TaskCfg = Any

__all__ = ["Task", "TaskFamily", "single_task_to_family", "Params", "ModelState", "PRNGKey", "TaskCfg"]


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
