"""`learned_optimization.tasks.fixed.vit`: the reference's Vision Transformer tasks over metafam's `vit_forward`.

`VisionTransformerTask(cfg, datasets)` takes the reference's configuration as a mapping (``wide16_config()`` and
``tall16_config()`` return plain dicts: metafam has no ml_collections): ``patches.size``, ``hidden_size``,
``transformer.{mlp_dim, num_heads, num_layers, dropout_rate, attention_dropout_rate}``, ``classifier`` ("token"
or "gap"); ``representation_size`` must be None (as in every reference config). Dropout is keyed by the loss key. Parameters: `metafam.tasks.vision.vit_num_params`.
The registered tasks use ImageNet-64, Food-101 or CIFAR-100: they build and initialize offline and raise
`DatasetUnavailableError` when a batch is requested.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from metafam.compat.learned_optimization.tasks.fixed._patch_models import DATASETS, PatchModelTask, task_table
from metafam.tasks.vision import vit_forward
from metafam.compat.learned_optimization.tasks.fixed._named import named_task_functions

__all__ = ["VisionTransformerTask", "wide16_config", "tall16_config", "TASKS", "build"]


def _config(hidden_size: int, mlp_dim: int, num_heads: int, num_layers: int) -> dict:
  return {"model_name": "small16_config", "patches": {"size": (16, 16)}, "hidden_size": hidden_size,
          "transformer": {"mlp_dim": mlp_dim, "num_heads": num_heads, "num_layers": num_layers,
                          "attention_dropout_rate": 0.0, "dropout_rate": 0.0},
          "classifier": "token", "representation_size": None}


def wide16_config() -> dict:
  """ViT-S/16 with 6 layers: width 384, MLP 1536, 6 heads."""
  return _config(384, 1536, 6, 6)


def tall16_config() -> dict:
  """A narrow ViT/16: width 128, MLP 512, 4 heads, 10 layers."""
  return _config(128, 512, 4, 10)


def _vit_net(cfg: Mapping[str, Any], num_classes: int):
  t = cfg["transformer"]
  if cfg.get("representation_size"):
    raise ValueError("metafam's ViT has no representation layer: set representation_size to None.")
  size = tuple(cfg["patches"]["size"])
  if size[0] != size[1]:
    raise ValueError(f"patches.size must be square, got {size}.")
  return vit_forward(num_classes, size[0], cfg["hidden_size"], t["num_layers"], t["num_heads"], t["mlp_dim"],
                     cfg.get("classifier", "token"), float(t.get("dropout_rate", 0.0)),
                     float(t.get("attention_dropout_rate", 0.0)))


class VisionTransformerTask(PatchModelTask):
  """A ViT classifier (softmax cross-entropy) on ``datasets`` built from the configuration ``cfg``."""

  def __init__(self, cfg: Mapping[str, Any], datasets, name: str = "VisionTransformerTask"):
    super().__init__(cfg, datasets, _vit_net, name)
    t = cfg["transformer"]
    self._dropout = bool(t.get("dropout_rate", 0.0) or t.get("attention_dropout_rate", 0.0))


TASKS = task_table("VIT", (("wideshallow", wide16_config), ("skinnydeep", tall16_config)))


def _make(cfg_fn: Callable[[], Any], dataset_fn: Callable[[], Any]) -> Callable[[], VisionTransformerTask]:
  """The reference's task constructor: ``task()`` builds a `VisionTransformerTask` from ``cfg_fn()`` and ``dataset_fn()``."""
  def task():
    return VisionTransformerTask(cfg_fn(), dataset_fn())
  return task


def build(name: str) -> VisionTransformerTask:
  """The task ``name`` of ``TASKS``."""
  cfg_fn, dataset, batch_size = TASKS[name]
  return VisionTransformerTask(cfg_fn(), DATASETS[dataset](batch_size), name)


globals().update(named_task_functions(TASKS, build))
__all__ += list(TASKS)
