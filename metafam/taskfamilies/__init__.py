"""Task families: distributions over static-shape tasks."""

from metafam.taskfamilies.base import TaskFamily, check_family, single_task_to_family
from metafam.taskfamilies.registry import get_family, list_families

__all__ = ["TaskFamily", "check_family", "single_task_to_family", "get_family", "list_families"]
