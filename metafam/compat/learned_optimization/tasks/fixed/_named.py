"""The reference's module-level task constructors, made from a module's ``TASKS`` table and its ``build``."""

from __future__ import annotations

from typing import Callable, Dict, Mapping


def named_task_functions(tasks: Mapping[str, object], build: Callable[[str], object]) -> Dict[str, Callable]:
  """``{name: f}`` for every name of ``tasks``, where ``f()`` returns ``build(name)`` and is named ``name`` (the
  reference defines one such zero-argument function per fixed task)."""
  def task_fn(name: str) -> Callable:
    def task():
      return build(name)
    task.__name__ = task.__qualname__ = name
    task.__doc__ = f"The reference's ``{name}`` (configuration ``TASKS[{name!r}]``)."
    return task
  return {name: task_fn(name) for name in tasks}
