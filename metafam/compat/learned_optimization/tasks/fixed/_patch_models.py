"""What `fixed.vit` and `fixed.mlp_mixer` share: the task class over a metafam patch model and the task table."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from metafam.compat.learned_optimization.tasks.datasets import image
from metafam.compat.learned_optimization.tasks.fixed._classifier import ImageClassifier, patch_model_normalizer

DATASETS = {"ImageNet64": lambda bs: image.imagenet64_datasets(bs, (64, 64)),
            "Food101_64": lambda bs: image.food101_datasets(bs, (64, 64)),
            "Cifar100": lambda bs: image.cifar100_datasets(bs)}


class PatchModelTask(ImageClassifier):
  """An `ImageClassifier` with the reference's ViT / MLP-Mixer normalizer; ``net_fn(cfg, num_classes)`` builds
  the haiku net from the configuration mapping ``cfg``."""

  def __init__(self, cfg: Mapping[str, Any], datasets, net_fn: Callable, name: str):
    super().__init__(net_fn(cfg, int(datasets.extra_info["num_classes"])), datasets, name)
    self.cfg = cfg

  def normalizer(self, loss):
    return patch_model_normalizer(loss, self.num_classes)


def task_table(prefix: str, sizes, batch_sizes=(128,)) -> dict:
  """``{f"{prefix}_{dataset}[_bs{B}]_{size}": (config function, dataset name, batch size)}``."""
  table = {}
  for batch_size in batch_sizes:
    for dataset in DATASETS:
      for size, cfg_fn in sizes:
        infix = "" if batch_size == 128 else f"_bs{batch_size}"
        table[f"{prefix}_{dataset}{infix}_{size}"] = (cfg_fn, dataset, batch_size)
  return table
