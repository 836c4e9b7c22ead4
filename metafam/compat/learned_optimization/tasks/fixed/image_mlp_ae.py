"""`learned_optimization.tasks.fixed.image_mlp_ae`: the reference's MLP autoencoders, as metafam's
`metafam.tasks.autoencoder.MLPAutoencoderTask`.

``D -> hidden -> D`` with ReLU, reconstruction ``sigmoid(logits)``, loss the mean squared error per pixel (the same
loss as the reference); parameters ``sum_i (n_{i-1} + 1) * n_i`` over widths ``(D, *hidden, D)``. `normalizer` is the
reference's (the loss clipped to [0, 1]). Initialization uses the abstract batch (the reference draws a training
batch), so building and initializing read no data. ``TASKS`` maps each name to ``(dataset, batch size, hidden)``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import haiku as hk

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


def _fc_ae_loss_fn(hidden_units: Sequence[int], activation: Callable[[jax.Array], jax.Array]) -> LossFN:
  """The reference's haiku loss of a fully connected autoencoder: ``batch["image"]`` flattened to ``D`` features,
  an MLP ``hidden_units + [D]`` with ``activation``, the mean over examples of the per-pixel squared error of the
  ``sigmoid`` reconstruction. To be transformed by the caller (`_make_task`)."""
  def fn(batch):
    x = hk.Flatten()(batch["image"])
    logits = hk.nets.MLP(list(hidden_units) + [x.shape[-1]], activation=activation)(x)
    return jnp.mean(jnp.square(x - jax.nn.sigmoid(logits)))
  return fn


def _make_task(hk_fn: LossFN, datasets: Any) -> base.Task:
  """A task whose loss is the haiku function ``hk_fn`` on ``datasets``' batches (normalizer: clipped to [0, 1]).
  Parameters are initialized from zeros shaped like the abstract batch (the reference draws a training batch)."""
  net = hk.transform(hk_fn)

  class _Task(base.Task):

    def __init__(self):
      super().__init__()
      self.datasets = datasets

    def init(self, key: PRNGKey):
      return net.init(key, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), datasets.abstract_batch))

    def loss(self, params, key, data):
      return net.apply(params, key, data)

    def normalizer(self, loss):
      return jnp.clip(loss, 0.0, 1.0)

  return _Task()


def build(name: str) -> MLPAutoencoderTask:
  """The task ``name`` of ``TASKS``."""
  dataset, batch_size, hidden = TASKS[name]
  side = {"cifar10": 32, "mnist": 28, "fashion_mnist": 28}[dataset]
  return _Autoencoder(hidden, "relu", datasets=image_datasets(dataset, batch_size, side), name=name)


globals().update(named_task_functions(TASKS, build))
