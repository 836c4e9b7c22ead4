"""`learned_optimization.tasks.fixed.es_wrapped`: the reference's image-MLP tasks with ES gradients.

Each name is `tasks.es_wrapper.ESTask` (std 0.01, the named number of antithetic pairs) around the image-MLP task
of `tasks.fixed.image_mlp` with the same suffix; ``TASKS`` maps each name to ``(inner task name, pairs)``.
"""

from __future__ import annotations

from metafam.compat.learned_optimization.tasks import es_wrapper
from metafam.compat.learned_optimization.tasks.fixed import image_mlp
from metafam.compat.learned_optimization.tasks.fixed._named import named_task_functions

TASKS = {
    "ESWrapped_8pair_ImageMLP_Cifar10_128x128x128_Relu": ("ImageMLP_Cifar10_128x128x128_Relu", 8),
    "ESWrapped_1pair_ImageMLP_Cifar10_128x128x128_Relu": ("ImageMLP_Cifar10_128x128x128_Relu", 1),
    "ESWrapped_1pair_ImageMLP_Mnist_128x128x128_Relu": ("ImageMLP_Mnist_128x128x128_Relu", 1),
    "ESWrapped_8pair_ImageMLP_Mnist_128x128x128_Relu": ("ImageMLP_Mnist_128x128x128_Relu", 8),
    "ESWrapped_1pair_ImageMLP_FashionMnist8_Relu32": ("ImageMLP_FashionMnist8_Relu32", 1),
    "ESWrapped_1pair_ImageMLP_Cifar10BW8_Relu32": ("ImageMLP_Cifar10BW8_Relu32", 1),
}

__all__ = list(TASKS) + ["TASKS", "build"]


def build(name: str) -> es_wrapper.ESTask:
  """The task ``name`` of ``TASKS``."""
  inner, n_pairs = TASKS[name]
  task = es_wrapper.ESTask(image_mlp.build(inner), 0.01, n_pairs=n_pairs)
  task.name = name
  return task


globals().update(named_task_functions(TASKS, build))
