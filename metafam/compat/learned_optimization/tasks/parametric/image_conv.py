"""`learned_optimization.tasks.parametric.image_conv`: the reference's parametric conv-net family.

`ParametricImageConv` samples per instance an activation and a conv-kernel initializer (as
`parametric.image_mlp`; vmappable); the task is metafam's `metafam.tasks.conv.conv_forward` (convs with the given
widths, kernel sizes and strides, SAME padding, activation, global average pool, Linear) with softmax
cross-entropy and the parametric normalizer. `sample_image_conv` draws a family configuration.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.parametric import cfgobject, parametric_utils as pu
from metafam.compat.learned_optimization.tasks.parametric.image_mlp import (SampledImageTask,
                                                                            sample_activation_and_initializer)
from metafam.datasets.base import Datasets
from metafam.tasks.conv import conv_forward

Batch = Any
Params = Any
ModelState = Any
PRNGKey = jax.Array

__all__ = ["Batch", "Params", "ModelState", "PRNGKey", "ParametricImageConv", "sample_image_conv",
           "timed_sample_image_conv"]


def _kernel_side(k) -> int:
  side = (k, k) if isinstance(k, int) else tuple(k)
  if len(side) != 2 or side[0] != side[1]:
    raise ValueError(f"kernel sizes must be square, got {k!r}.")
  return int(side[0])


class ParametricImageConv(base.TaskFamily):
  """Conv nets with ``hidden_sizes`` channels, ``kernel_sizes`` and ``strides`` per layer on ``datasets``."""

  def __init__(self, datasets: Datasets, num_classes: int, hidden_sizes: Sequence[int],
               kernel_sizes: Sequence[Any], strides: Sequence[int]):
    super().__init__()
    if not len(hidden_sizes) == len(kernel_sizes) == len(strides):
      raise ValueError(f"hidden_sizes, kernel_sizes and strides need one entry per layer, got "
                       f"{len(hidden_sizes)}, {len(kernel_sizes)}, {len(strides)}.")
    self.datasets, self.num_classes = datasets, int(num_classes)
    self.hidden_sizes, self.strides = tuple(hidden_sizes), tuple(strides)
    self.kernel_sizes = tuple(_kernel_side(k) for k in kernel_sizes)

  def sample(self, key: PRNGKey) -> cfgobject.CFGNamed:
    return sample_activation_and_initializer("ParametricImageConv", key)

  def task_fn(self, task_params: cfgobject.CFGNamed) -> base.Task:
    net_fn = lambda w_init: conv_forward(self.hidden_sizes, self.num_classes, pu.SampleActivation.acts,
                                         self.kernel_sizes, self.strides, w_init=w_init)
    return SampledImageTask(self.datasets, net_fn, self.num_classes, task_params)


def sample_image_conv(key: PRNGKey) -> cfgobject.CFGObject:
  """A `ParametricImageConv` configuration: 0-3 layers of one log-uniform width in [4, 64), 3x3 kernels, the
  first 0-2 layers with stride 2, a sampled dataset at a log-uniform side in [4, 32) and batch in [4, 512)."""
  k = jax.random.split(key, 7)
  hidden = pu.log_int(k[0], 4, 64)
  layers = pu.choice(k[1], [0, 1, 2, 3])
  num_stride = int(pu.choice(k[3], [0, 1, 2]))
  strides = ([2] * num_stride + [1] * layers)[:layers]
  side = pu.log_int(k[4], 4, 32)
  name = pu.SampleImageDataset.sample(k[5])
  lf = cfgobject.LogFeature
  dataset = cfgobject.CFGObject(name, {"image_size": lf((side, side)), "batch_size": lf(pu.log_int(k[6], 4, 512))})
  return cfgobject.CFGObject("ParametricImageConv", {
      "hidden_sizes": lf(layers * [hidden]), "strides": strides, "kernel_sizes": [(3, 3)] * layers,
      "datasets": dataset, "num_classes": pu.SampleImageDataset.num_classes(name)})


def timed_sample_image_conv(key: PRNGKey, max_time=1e-5):
  """Not available offline (the reference's learned runtime model); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_image_conv", "sample_image_conv")
