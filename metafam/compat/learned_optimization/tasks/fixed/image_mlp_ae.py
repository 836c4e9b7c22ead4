"""`learned_optimization.tasks.fixed.image_mlp_ae`: the reference's MLP autoencoders, as metafam's
`metafam.tasks.autoencoder.MLPAutoencoderTask`.

``D -> hidden -> D`` with ReLU, reconstruction ``sigmoid(logits)``, loss the mean squared error per pixel (the same
loss as the reference); parameters ``sum_i (n_{i-1} + 1) * n_i`` over widths ``(D, *hidden, D)``. `normalizer` is the
reference's (the loss clipped to [0, 1]). Initialization uses the abstract batch (the reference draws a training
batch), so building and initializing read no data. ``TASKS`` maps each name to ``(dataset, batch size, hidden)``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.fixed.image_mlp import image_datasets
from metafam.tasks.autoencoder import MLPAutoencoderTask
from metafam.compat.learned_optimization.tasks.fixed._named import named_task_functions

PRNGKey = base.PRNGKey
Data = Any
LossFN = Callable[[Data], jax.Array]

TASKS = {
    "ImageMLPAE_Cifar10_32x32x32_bs128": ("cifar10", 128, (32, 32, 32)),
    "ImageMLPAE_Cifar10_256x256x256_bs128": ("cifar10", 128, (256, 256, 256)),
    "ImageMLPAE_Cifar10_256x256x256_bs1024": ("cifar10", 1024, (256, 256, 256)),
    "ImageMLPAE_Cifar10_128x32x128_bs256": ("cifar10", 256, (128, 32, 128)),
    "ImageMLPAE_Mnist_128x32x128_bs128": ("mnist", 128, (128, 32, 128)),
    "ImageMLPAE_FashionMnist_128x32x128_bs128": ("fashion_mnist", 128, (128, 32, 128)),
}

__all__ = list(TASKS) + ["PRNGKey", "Data", "LossFN", "TASKS", "build"]


class _Autoencoder(MLPAutoencoderTask):

  def normalizer(self, loss):
    return jnp.clip(loss, 0.0, 1.0)


def build(name: str) -> MLPAutoencoderTask:
  """The task ``name`` of ``TASKS``."""
  dataset, batch_size, hidden = TASKS[name]
  side = {"cifar10": 32, "mnist": 28, "fashion_mnist": 28}[dataset]
  return _Autoencoder(hidden, "relu", datasets=image_datasets(dataset, batch_size, side), name=name)


globals().update(named_task_functions(TASKS, build))
