"""`learned_optimization.tasks.parametric.image_resnet`: the reference's parametric ResNet family.

Per instance (traced, vmappable): the activation of the stem and the final layer (`SampleActivation`). The task is
metafam's `metafam.tasks.resnet.ResNet` (v1 bottleneck blocks, as the reference's default; batch-norm statistics in
the model state) with softmax cross-entropy and the reference's normalizer (``10 * loss / log 2K`` clipped to
[0, 10]). ``initial_conv_stride`` is used (the reference accepts it but builds the default stride 2).
`sample_image_resnet` draws a family configuration.
"""

from __future__ import annotations

from typing import Any, Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.fixed._classifier import patch_model_normalizer
from metafam.compat.learned_optimization.tasks.parametric import cfgobject, parametric_utils as pu
from metafam.datasets.base import Datasets
from metafam.tasks.resnet import ResNet

Batch = Any
Params = Any
ModelState = Any
PRNGKey = jax.Array

__all__ = ["Batch", "Params", "ModelState", "PRNGKey", "ParametricImageResNet", "sample_image_resnet",
           "timed_sample_image_resnet"]


class _ResNetTask(base.Task):

  def __init__(self, family: "ParametricImageResNet", cfg: cfgobject.CFGNamed):
    super().__init__()
    self.datasets, self.cfg = family.datasets, cfg
    self.num_classes = int(family.datasets.extra_info["num_classes"])
    act = pu.SampleActivation.get_dynamic(cfg.values["activation"])

    def forward(images):
      return ResNet(family.blocks_per_group, self.num_classes, channels_per_group=family.channels_per_group,
                    initial_conv_channels=family.initial_conv_channels,
                    initial_conv_kernel_size=family.initial_conv_kernel_size,
                    initial_conv_stride=family.initial_conv_stride, max_pool=family.max_pool,
                    act_fn=act)(images, is_training=True)

    self.net = hk.without_apply_rng(hk.transform_with_state(forward))

  def init_with_state(self, key: PRNGKey):
    image = self.datasets.abstract_batch["image"]
    return self.net.init(key, jnp.zeros(image.shape, image.dtype))

  def loss_with_state_and_aux(self, params, state, key, data):
    logits, state = self.net.apply(params, state, data["image"])
    labels = jax.nn.one_hot(data["label"], self.num_classes)
    return jnp.mean(base.softmax_cross_entropy(logits=logits, labels=labels)), state, {}

  def normalizer(self, loss):
    return patch_model_normalizer(loss, self.num_classes)


class ParametricImageResNet(base.TaskFamily):
  """ResNets with the given stem and group sizes on ``datasets``; per instance an activation."""

  def __init__(self, datasets: Datasets, initial_conv_channels: int, initial_conv_stride: int,
               initial_conv_kernel_size: int, blocks_per_group: Sequence[int], channels_per_group: Sequence[int],
               max_pool: bool):
    super().__init__()
    self.datasets = datasets
    self.initial_conv_channels, self.initial_conv_stride = int(initial_conv_channels), int(initial_conv_stride)
    self.initial_conv_kernel_size = int(initial_conv_kernel_size)
    self.blocks_per_group, self.channels_per_group = tuple(blocks_per_group), tuple(channels_per_group)
    self.max_pool = bool(max_pool)

  def sample(self, key: PRNGKey) -> cfgobject.CFGNamed:
    return cfgobject.CFGNamed("ParametricImageResNet", {"activation": pu.SampleActivation.sample(key)})

  def task_fn(self, task_params: cfgobject.CFGNamed) -> base.Task:
    return _ResNetTask(self, task_params)


def sample_image_resnet(key: PRNGKey) -> cfgobject.CFGObject:
  """A `ParametricImageResNet` configuration: blocks per group log-uniform below a sampled maximum in [1, 10), group
  widths ``w * pattern`` (w in [8, 256)), stem kernel 3/5/7, stem width in [8, 64), stride 1/2, optional max-pool, a
  sampled image dataset at a side in [8, 64) and batch size in [4, 256)."""
  k = jax.random.split(key, 14)
  lf = cfgobject.LogFeature
  top = pu.log_int(k[0], 1, 10)
  pattern = pu.choice(k[5], [(1, 1, 1, 1), (1, 2, 4, 8), (1, 2, 2, 4), (1, 2, 2, 2), (1, 2, 4, 4)])
  width = pu.log_int(k[6], 8, 256)
  side, batch_size = pu.log_int(k[12], 8, 64), pu.log_int(k[13], 4, 256)
  return cfgobject.CFGObject("ParametricImageResNet", {
      "blocks_per_group": lf(tuple(pu.log_int(k[1 + i], 1, top) for i in range(4))),
      "channels_per_group": lf(tuple(width * p for p in pattern)),
      "initial_conv_kernel_size": pu.choice(k[7], [3, 5, 7]), "initial_conv_channels": lf(pu.log_int(k[8], 8, 64)),
      "initial_conv_stride": pu.choice(k[9], [1, 2]), "max_pool": pu.choice(k[10], [True, False]),
      "datasets": cfgobject.CFGObject(pu.SampleImageDataset.sample(k[11]),
                                      {"image_size": lf((side, side)), "batch_size": lf(batch_size)})})


def timed_sample_image_resnet(key: PRNGKey, max_time=1e-4):
  """Not available offline (the reference's learned runtime model); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_image_resnet", "sample_image_resnet")
