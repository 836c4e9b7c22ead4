"""`learned_optimization.research.general_lopt.tasks.fast_mlp_diff_data`: VeLO's small "same MLP, different data" list.

Four task families, each one 8x8 image MLP (one hidden layer of 32 ReLU units, batch ``inner_bs = 64``) on CIFAR-10
(black and white), Fashion-MNIST, MNIST or SVHN (black and white), turned into a family by
`tasks.base.single_task_to_family` and augmented per tensor by `tasks.task_augmentation.ReparamWeightsFamily` with
scales in ``[0.01, 100]``. The named evaluation tasks ``Jun24FastMLPEval_TaskFamily_<dataset>_Seed<s>`` (s = 0..7)
are zero-argument functions returning one task of family ``i`` at task-family seed ``8 i + s``.

Fashion-MNIST trains offline on metafam's data; CIFAR-10 and MNIST are read from local files on the first batch
(``$METAFAM_CIFAR10_DIR``, ``$METAFAM_MNIST_DIR``) and SVHN raises `DatasetUnavailableError` then. Building a task
reads no data. Unlike the reference, ``_get_task`` keeps no process-wide cache: each call builds a fresh task (the
programs metafam compiles are keyed by the task's configuration, not its identity).
"""

from __future__ import annotations

import functools
from typing import Callable, List

from metafam.compat.learned_optimization.tasks import base, task_augmentation
from metafam.compat.learned_optimization.tasks.datasets import image
from metafam.compat.learned_optimization.tasks.fixed._classifier import ImageClassifier
from metafam.tasks._nn import activation_by_name
from metafam.tasks.image_mlp import mlp_forward

inner_bs = 64

_DATASETS = ("cifar", "fashion_mnist", "mnist", "svhn")
_datasets = _DATASETS  # the reference's name of this tuple


def _mlp_task(datasets: base.Datasets, name: str) -> base.Task:
  net = mlp_forward((32,), datasets.extra_info["num_classes"], [activation_by_name("relu")])
  return ImageClassifier(net, datasets, name)


def cifar_task() -> base.Task:
  """8x8 black-and-white CIFAR-10, MLP 64-32-10, batch 64."""
  return _mlp_task(image.cifar10_datasets(batch_size=inner_bs, image_size=(8, 8), convert_to_black_and_white=True),
                   "FastMLP_Cifar10_8x8_32")


def fashion_mnist_task() -> base.Task:
  """8x8 Fashion-MNIST, MLP 64-32-10, batch 64."""
  return _mlp_task(image.fashion_mnist_datasets(batch_size=inner_bs, image_size=(8, 8)),
                   "FastMLP_FashionMnist_8x8_32")


def mnist_task() -> base.Task:
  """8x8 MNIST, MLP 64-32-10, batch 64."""
  return _mlp_task(image.mnist_datasets(batch_size=inner_bs, image_size=(8, 8)), "FastMLP_Mnist_8x8_32")


def svhn_task() -> base.Task:
  """8x8 black-and-white SVHN (cropped digits), MLP 64-32-10, batch 64."""
  return _mlp_task(image.svhn_cropped_datasets(batch_size=inner_bs, image_size=(8, 8),
                                               convert_to_black_and_white=True), "FastMLP_Svhn_8x8_32")


def task_to_augmented_task_family(task_fn: Callable[[], base.Task]) -> base.TaskFamily:
  """The one-task family of ``task_fn()`` with its weights reparameterized per tensor, scales in [0.01, 100]."""
  return task_augmentation.ReparamWeightsFamily(base.single_task_to_family(task=task_fn()), "tensor", (0.01, 100))


def jun24_fast_mlp_diff_data_task_list() -> List[List[Callable[[], base.TaskFamily]]]:
  """``[[family constructor]]`` for the four datasets, in the order cifar, fashion_mnist, mnist, svhn (the
  reference's task-list format: one list of constructors per entry)."""
  return [[functools.partial(task_to_augmented_task_family, fn)]
          for fn in (cifar_task, fashion_mnist_task, mnist_task, svhn_task)]


def _get_task(task_family_idx: int, task_family_seed: int) -> base.Task:
  family = jun24_fast_mlp_diff_data_task_list()[task_family_idx][0]()
  return base.get_task(family, task_family_seed=task_family_seed)


def _named(index: int, seed: int) -> Callable[[], base.Task]:
  def task() -> base.Task:
    return _get_task(index, index * 8 + seed)
  task.__name__ = task.__qualname__ = f"Jun24FastMLPEval_TaskFamily_{_DATASETS[index]}_Seed{seed}"
  task.__doc__ = f"Task family {index} ({_DATASETS[index]}) at task-family seed {index * 8 + seed}."
  return task


TASKS = {f"Jun24FastMLPEval_TaskFamily_{_DATASETS[i]}_Seed{s}": _named(i, s) for i in range(4) for s in range(8)}
globals().update(TASKS)
