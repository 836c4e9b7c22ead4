"""`learned_optimization.tasks.fixed.resnet`: the reference's ImageNet ResNet tasks over metafam's `ResNet`.

Each ``Resnet_MultiRuntime_i`` is a v2 bottleneck `metafam.tasks.resnet.ResNet` (batch-norm statistics in the
model state, training mode) with softmax cross-entropy on resized ImageNet (16, 32 or 64 pixels), which is not
available offline: the tasks build and initialize, and raise `DatasetUnavailableError` when a batch is requested.
Parameters: `metafam.tasks.resnet.resnet_num_params`. ``TASKS`` maps each name to its configuration.
"""

from __future__ import annotations

from typing import Any, Mapping

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.datasets import image
from metafam.tasks.resnet import ResNet
from metafam.compat.learned_optimization.tasks.fixed._named import named_task_functions

_P = (True, True, True, True)
_ROWS = [(16, 64, (1, 1, 1, 1), (8, 16, 16, 16), 3, True), (16, 64, (1, 1, 1, 1), (8, 16, 16, 32), 3, True),
         (16, 64, (1, 1, 1, 1), (64, 128, 128, 128), 3, True), (16, 192, (1, 1, 1, 1), (64, 128, 256, 512), 5, True),
         (16, 192, (1, 1, 1, 1), (128, 256, 512, 512), 5, True), (32, 128, (1, 1, 1, 1), (128, 256, 512, 512), 5, True),
         (32, 256, (1, 1, 1, 1), (128, 256, 512, 512), 3, True), (32, 256, (1, 1, 1, 1), (256, 512, 512, 1024), 5, True),
         (64, 256, (1, 1, 1, 1), (256, 512, 1024, 1024), 3, True), (64, 256, (1, 2, 4, 5), (256, 512, 1024, 1024), 3, True),
         (64, 256, (1, 1, 3, 4), (256, 512, 1024, 1024), 5, False)]
TASKS = {f"Resnet_MultiRuntime_{i}": {"image_size": s, "batch_size": b, "blocks_per_group": g, "use_projection": _P,
                                      "channels_per_group": c, "initial_conv_kernel_size": k,
                                      "initial_conv_stride": 2, "max_pool": m, "resnet_v2": True}
         for i, (s, b, g, c, k, m) in enumerate(_ROWS)}
_MODEL_ARGS = ("blocks_per_group", "use_projection", "channels_per_group", "initial_conv_kernel_size",
               "initial_conv_stride", "max_pool", "resnet_v2")

__all__ = list(TASKS) + ["TASKS", "build"]


class _ResnetTask(base.Task):

  def __init__(self, cfg: Mapping[str, Any], name: str = "__Resnet"):
    super().__init__()
    datasets_fn = {16: image.imagenet16_datasets, 32: image.imagenet32_datasets, 64: image.imagenet64_datasets}
    self.datasets = datasets_fn[cfg["image_size"]](cfg["batch_size"])
    self._cfg, self.name = dict(cfg), name
    num_classes = self.datasets.extra_info["num_classes"]

    def forward(batch):
      logits = ResNet(num_classes=num_classes, **{k: cfg[k] for k in _MODEL_ARGS})(batch["image"], is_training=True)
      labels = jax.nn.one_hot(batch["label"], num_classes)
      return jnp.mean(base.softmax_cross_entropy(logits=logits, labels=labels))

    self._net = hk.transform_with_state(forward)

  def init_with_state(self, key):
    return self._net.init(key, jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), self.datasets.abstract_batch))

  def loss_with_state_and_aux(self, params, state, key, data):
    loss, state = self._net.apply(params, state, key, data)
    return loss, state, {}


def build(name: str) -> base.Task:
  """The task ``name`` of ``TASKS``."""
  return _ResnetTask(TASKS[name], name=name)


globals().update(named_task_functions(TASKS, build))
