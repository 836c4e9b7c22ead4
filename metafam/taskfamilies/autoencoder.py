"""A family of MLP autoencoders: fixed widths; sampled init scale, activation and input scale/shift."""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam.datasets.base import Datasets
from metafam.datasets.images import fashion_mnist_datasets
from metafam.taskfamilies._sampling import (Range, SampledInstance, check_activations, check_range, log_uniform,
                                            uniform)
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks._nn import ACTIVATIONS
from metafam.tasks.autoencoder import RECONSTRUCTION_SCALE
from metafam.tasks.image_mlp import mlp_forward


class _AutoencoderInstance(SampledInstance):

  def loss(self, params, key, batch):
    images = batch["image"]
    inputs = images * self.cfg["input_scale"] + self.cfg["input_shift"]
    recon = jax.nn.sigmoid(self.family.net.apply(params, inputs, self.cfg["activation"])).reshape(images.shape)
    return jnp.mean(jnp.square(recon - images))

  def normalizer(self, loss):
    return loss / RECONSTRUCTION_SCALE


class AutoencoderFamily(TaskFamily):
  """MLP autoencoders as `metafam.tasks.autoencoder.MLPAutoencoderTask` (widths fixed per family); per instance:

  * ``activation``: int32 index into ``activations`` (dispatched with `jax.lax.switch`),
  * ``init_scale``: f32, multiplies every initial weight matrix; log-uniform in ``init_scale_range``,
  * ``input_scale``, ``input_shift``: f32; the encoder sees ``image * input_scale + input_shift`` while the target
    stays the clean image in [0, 1] (log-uniform / uniform in their ranges).

  The loss is the per-pixel mean squared error of ``sigmoid(logits)``; `normalizer` divides by 0.25. Initial params
  come from `metafam.taskfamilies.conv.init_from_one_draw` (haiku's default distributions, one random op).
  """

  def __init__(self, hidden_sizes: Sequence[int] = (32, 8, 32), image_size: int = 8, batch_size: int = 128,
               activations: Sequence[str] = ("relu", "tanh", "gelu", "swish"), init_scale_range: Range = (0.5, 2.0),
               input_scale_range: Range = (0.5, 2.0), input_shift_range: Range = (-0.5, 0.5),
               datasets: Optional[Datasets] = None):
    super().__init__()
    self.activations = check_activations(activations)
    self.init_scale_range = check_range("init_scale_range", init_scale_range, positive=True)
    self.input_scale_range = check_range("input_scale_range", input_scale_range, positive=True)
    self.input_shift_range = check_range("input_shift_range", input_shift_range)
    self.datasets = datasets if datasets is not None else fashion_mnist_datasets(batch_size, image_size)
    normalization = self.datasets.extra_info.get("normalization", "unit")
    if normalization != "unit":
      raise ValueError(f"autoencoders need pixels in [0, 1] (normalization 'unit'), got {normalization!r}.")
    self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
    shape = self.datasets.abstract_batch["image"].shape
    self.net = mlp_forward(self.hidden_sizes, int(np.prod(shape[1:])), [ACTIVATIONS[a] for a in self.activations])
    self.name = f"AutoencoderFamily_{'x'.join(map(str, shape[1:3]))}_{'x'.join(map(str, self.hidden_sizes))}"

  def sample(self, key):
    k = jax.random.split(key, 4)
    return {"activation": jax.random.randint(k[0], (), 0, len(self.activations), jnp.int32),
            "init_scale": log_uniform(k[1], self.init_scale_range),
            "input_scale": log_uniform(k[2], self.input_scale_range),
            "input_shift": uniform(k[3], self.input_shift_range)}

  def task_fn(self, cfg):
    return _AutoencoderInstance(self, cfg)
