"""A family of small conv-net classifiers: fixed architecture; sampled init scale, activation, label smoothing and
input scale/shift."""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp

from metafam.datasets.base import Datasets
from metafam.datasets.images import fashion_mnist_datasets
from metafam.taskfamilies._sampling import (Range, SampledInstance, check_activations, check_range, log_uniform,
                                            uniform)
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks._nn import ACTIVATIONS
from metafam.tasks.conv import conv_forward, smoothed_cross_entropy

class _ConvInstance(SampledInstance):

  def loss_and_aux(self, params, key, batch):
    images = batch["image"] * self.cfg["input_scale"] + self.cfg["input_shift"]
    logits = self.family.net.apply(params, images, self.cfg["activation"])
    loss = smoothed_cross_entropy(logits, batch["label"], self.cfg["label_smoothing"])
    accuracy = jnp.mean((jnp.argmax(logits, axis=-1) == batch["label"]).astype(jnp.float32))
    return loss, {"accuracy": accuracy}

  def normalizer(self, loss):
    return loss / jnp.log(self.family.num_classes)


class ConvFamily(TaskFamily):
  """Conv-net classifiers (`metafam.tasks.conv.conv_forward`, channels fixed per family); per instance (config leaves):

  * ``activation``: int32 index into ``activations`` (dispatched with `jax.lax.switch`),
  * ``init_scale``: f32, multiplies every initial conv kernel and dense weight; log-uniform in ``init_scale_range``,
  * ``label_smoothing``: f32 in ``label_smoothing_range``; the target puts ``1 - s`` on the label and ``s / K`` on
    every class (set it to 0 for a clean evaluation loss),
  * ``input_scale``, ``input_shift``: f32; the net sees ``image * input_scale + input_shift`` (log-uniform /
    uniform in their ranges).

  Initial params come from `init_from_one_draw` (haiku's default distributions, one random op per instance).
  """

  def __init__(self, channels: Sequence[int] = (16, 32), image_size: int = 16, in_channels: int = 1,
               batch_size: int = 128, kernel_size: int = 3,
               activations: Sequence[str] = ("relu", "tanh", "gelu", "swish"), init_scale_range: Range = (0.5, 2.0),
               label_smoothing_range: Range = (0.0, 0.2), input_scale_range: Range = (0.5, 2.0),
               input_shift_range: Range = (-0.5, 0.5), datasets: Optional[Datasets] = None):
    super().__init__()
    self.activations = check_activations(activations)
    self.init_scale_range = check_range("init_scale_range", init_scale_range, positive=True)
    self.label_smoothing_range = check_range("label_smoothing_range", label_smoothing_range, 0.0, 1.0)
    self.input_scale_range = check_range("input_scale_range", input_scale_range, positive=True)
    self.input_shift_range = check_range("input_shift_range", input_shift_range)
    self.datasets = datasets if datasets is not None else fashion_mnist_datasets(batch_size, image_size,
                                                                                 channels=in_channels)
    self.channels = tuple(int(c) for c in channels)
    self.num_classes = int(self.datasets.extra_info.get("num_classes", 10))
    self.net = conv_forward(self.channels, self.num_classes, [ACTIVATIONS[a] for a in self.activations], kernel_size)
    shape = self.datasets.abstract_batch["image"].shape
    self.name = f"ConvFamily_{'x'.join(map(str, shape[1:]))}_{'x'.join(map(str, self.channels))}"

  def sample(self, key):
    k = jax.random.split(key, 5)
    return {"activation": jax.random.randint(k[0], (), 0, len(self.activations), jnp.int32),
            "init_scale": log_uniform(k[1], self.init_scale_range),
            "label_smoothing": uniform(k[2], self.label_smoothing_range),
            "input_scale": log_uniform(k[3], self.input_scale_range),
            "input_shift": uniform(k[4], self.input_shift_range)}

  def task_fn(self, cfg):
    return _ConvInstance(self, cfg)
