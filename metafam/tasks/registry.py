"""Named tasks and task families: a plain dict from name to a zero-argument constructor.

Constructors import their modules lazily, so listing names costs nothing and the core never imports haiku.
"""

from __future__ import annotations

from typing import Callable, Dict, List


def _image_mlp(hidden_sizes, image_size, activation="relu"):
  def build():
    from metafam.tasks.image_mlp import ImageMLPTask
    return ImageMLPTask(hidden_sizes, activation=activation, image_size=image_size,
                        name=f"fmnist_mlp_{image_size}x{image_size}_{'x'.join(map(str, hidden_sizes))}")
  return build


def _quadratic(dim):
  def build():
    from metafam.tasks.quadratic import QuadraticTask
    return QuadraticTask(dim)
  return build


def _image_mlp_family(hidden_sizes, image_size):
  def build():
    from metafam.taskfamilies.image_mlp import ImageMLPFamily
    return ImageMLPFamily(hidden_sizes, image_size=image_size)
  return build


def _quadratic_family(noisy):
  def build():
    from metafam.taskfamilies.quadratic import NoisyQuadraticFamily, QuadraticFamily
    return NoisyQuadraticFamily(10) if noisy else QuadraticFamily(10, scale_range=(0.1, 10.0))
  return build


TASKS: Dict[str, Callable] = {
    "quadratic_10": _quadratic(10),
    "fmnist_mlp_8x8_32": _image_mlp((32,), 8),            # 2,410 params
    "fmnist_mlp_28x28_128x128": _image_mlp((128, 128), 28),  # 118,282 params
}

FAMILIES: Dict[str, Callable] = {
    "quadratic_family_10": _quadratic_family(noisy=False),
    "noisy_quadratic_family_10": _quadratic_family(noisy=True),
    "fmnist_mlp_family_8x8_32": _image_mlp_family((32,), 8),
    "fmnist_mlp_family_28x28_128x128": _image_mlp_family((128, 128), 28),
}


def _get(kind: str, table: Dict[str, Callable], name: str):
  if name not in table:
    raise KeyError(f"Unknown {kind} {name!r}; registered {kind}s: {', '.join(sorted(table))}.")
  return table[name]()


def get_task(name: str):
  """Builds the registered task ``name``."""
  return _get("task", TASKS, name)


def get_family(name: str):
  """Builds the registered task family ``name``."""
  return _get("family", FAMILIES, name)


def list_tasks() -> List[str]:
  return sorted(TASKS)


def list_families() -> List[str]:
  return sorted(FAMILIES)
