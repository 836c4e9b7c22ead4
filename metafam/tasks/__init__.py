"""Tasks: `Task` and the registry of named tasks."""

from metafam.tasks.base import Task
from metafam.tasks.registry import get_task, list_tasks

__all__ = ["Task", "get_task", "list_tasks"]
