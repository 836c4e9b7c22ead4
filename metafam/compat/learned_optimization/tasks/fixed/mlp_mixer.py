"""`learned_optimization.tasks.fixed.mlp_mixer`: the reference's MLP-Mixer tasks over metafam's `mlp_mixer_forward`.

`MLPMixerTask(cfg, datasets)` takes the reference's configuration as a mapping (``small_config16()`` and
``tiny_config16()`` return plain dicts): ``patches.size``, ``hidden_dim``, ``num_blocks``, ``tokens_mlp_dim``,
``channels_mlp_dim``. Parameters: `metafam.tasks.vision.mlp_mixer_num_params`. The registered tasks use ImageNet-64,
Food-101 or CIFAR-100: they build and initialize offline and raise `DatasetUnavailableError` when a batch is
requested.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from metafam.compat.learned_optimization.tasks.fixed._patch_models import DATASETS, PatchModelTask, task_table
from metafam.tasks.vision import mlp_mixer_forward
from metafam.compat.learned_optimization.tasks.fixed._named import named_task_functions

__all__ = ["MLPMixerTask", "small_config16", "tiny_config16", "TASKS", "build"]


def small_config16() -> dict:
  """Mixer-B/16 with 8 blocks: width 768, token MLP 384, channel MLP 3072."""
  return {"model_name": "modified_Mixer-B_16", "patches": {"size": (16, 16)}, "hidden_dim": 768, "num_blocks": 8,
          "tokens_mlp_dim": 384, "channels_mlp_dim": 3072}


def tiny_config16() -> dict:
  """A narrower Mixer/16 with 5 blocks: width 512, token MLP 384, channel MLP 2048."""
  return {"model_name": "modified_Mixer-B_16", "patches": {"size": (16, 16)}, "hidden_dim": 512, "num_blocks": 5,
          "tokens_mlp_dim": 384, "channels_mlp_dim": 2048}


def _mixer_net(cfg: Mapping[str, Any], num_classes: int):
  size = tuple(cfg["patches"]["size"])
  if size[0] != size[1]:
    raise ValueError(f"patches.size must be square, got {size}.")
  return mlp_mixer_forward(num_classes, size[0], cfg["hidden_dim"], cfg["num_blocks"], cfg["tokens_mlp_dim"],
                           cfg["channels_mlp_dim"])


class MLPMixerTask(PatchModelTask):
  """An MLP-Mixer classifier (softmax cross-entropy) on ``datasets`` built from the configuration ``cfg``."""

  def __init__(self, cfg: Mapping[str, Any], datasets, name: str = "MLPMixerTask"):
    super().__init__(cfg, datasets, _mixer_net, name)


TASKS = {**task_table("MLPMixer", (("small16", small_config16), ("tiny16", tiny_config16))),
         **task_table("MLPMixer", (("tiny16", tiny_config16),), batch_sizes=(256,))}


def _make(cfg_fn: Callable[[], Any], dataset_fn: Callable[[], Any]) -> Callable[[], MLPMixerTask]:
  """The reference's task constructor: ``task()`` builds a `MLPMixerTask` from ``cfg_fn()`` and ``dataset_fn()``."""
  def task():
    return MLPMixerTask(cfg_fn(), dataset_fn())
  return task


def build(name: str) -> MLPMixerTask:
  """The task ``name`` of ``TASKS``."""
  cfg_fn, dataset, batch_size = TASKS[name]
  return MLPMixerTask(cfg_fn(), DATASETS[dataset](batch_size), name)


globals().update(named_task_functions(TASKS, build))
__all__ += list(TASKS)
