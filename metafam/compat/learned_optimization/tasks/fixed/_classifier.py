"""The image classifier the reference's fixed image tasks share, over metafam's haiku nets.

`ImageClassifier` runs a net built by `metafam.tasks.image_mlp.mlp_forward` or `metafam.tasks.conv.conv_forward`
(stateless, or with batch-norm state) on ``batch["image"]`` with softmax cross-entropy (or, ``mse=True``, the
reference's mean squared error against one-hot labels) on ``batch["label"]``; aux holds the accuracy. Parameters
are initialized from zeros shaped like ``datasets.abstract_batch``, so building and initializing a task never reads
data. `normalizer` is the reference's: the loss clipped to ``[0, 1.5 log K]`` with non-finite values mapped to the
top (cross-entropy), or ``10 * min(loss, 1)`` (MSE).
"""

from __future__ import annotations

import math

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.tasks import base
from metafam.datasets.base import Datasets
from metafam.tasks.image_mlp import cross_entropy_and_accuracy


def cross_entropy_normalizer(loss: jax.Array, num_classes: int) -> jax.Array:
  """The reference's cross-entropy normalizer: ``loss`` clipped to ``[0, 1.5 log K]``, non-finite values -> the top."""
  top = 1.5 * math.log(num_classes)
  return jnp.nan_to_num(jnp.clip(loss, 0.0, top), nan=top, posinf=top, neginf=top)


def patch_model_normalizer(loss: jax.Array, num_classes: int) -> jax.Array:
  """The reference's ViT / MLP-Mixer normalizer: ``10 * loss / log(2K)`` clipped to [0, 10] (non-finite -> 10)."""
  top = math.log(2 * num_classes)
  loss = jnp.nan_to_num(loss, nan=top, posinf=top, neginf=top)
  return jnp.clip(10 * loss / top, 0, 10)


class ImageClassifier(base.Task):
  """A reference fixed image task: ``net`` (haiku, optionally with state) on ``datasets``, named ``name``; with
  ``dropout`` the loss key is passed to the net as ``dropout_key``."""

  def __init__(self, net, datasets: Datasets, name: str, mse: bool = False, dropout: bool = False):
    super().__init__()
    self.net, self.datasets, self.name = net, datasets, name
    self.num_classes = int(datasets.extra_info["num_classes"])
    self._mse, self._dropout = bool(mse), bool(dropout)
    self._stateful = isinstance(net, hk.TransformedWithState)

  def init_with_state(self, key):
    image = self.datasets.abstract_batch["image"]
    out = self.net.init(key, jnp.zeros(image.shape, image.dtype))
    return out if self._stateful else (out, None)

  def loss_with_state_and_aux(self, params, state, key, batch):
    kwargs = {"dropout_key": key} if self._dropout else {}
    if self._stateful:
      logits, state = self.net.apply(params, state, batch["image"], **kwargs)
    else:
      logits = self.net.apply(params, batch["image"], **kwargs)
    loss, accuracy = cross_entropy_and_accuracy(logits, batch["label"])
    if self._mse:
      loss = jnp.mean(jnp.square(logits - jax.nn.one_hot(batch["label"], self.num_classes)))
    return loss, state, {"accuracy": accuracy}

  def normalizer(self, loss):
    if self._mse:
      return 10.0 * jnp.minimum(jnp.nan_to_num(loss, nan=1.0, posinf=1.0, neginf=1.0), 1.0)
    return cross_entropy_normalizer(loss, self.num_classes)
