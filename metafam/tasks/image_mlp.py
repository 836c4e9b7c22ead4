"""Multi-layer perceptron classifiers on images (dm-haiku models).

Batches are ``{"image": f32[B, H, W, C], "label": i32[B]}``; the loss is the mean softmax cross-entropy and the aux
output holds the accuracy. `normalizer` divides by ``log(num_classes)`` so chance level maps to 1.0.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.datasets.base import Datasets
from metafam.datasets.images import fashion_mnist_datasets
from metafam.tasks._nn import activation_by_name
from metafam.tasks.base import Task

def mlp_forward(hidden_sizes: Sequence[int], num_classes: int,
                activations: Sequence[Callable[[jax.Array], jax.Array]]) -> hk.Transformed:
  """A haiku MLP ``forward(images, activation_index=0) -> logits``.

  flatten -> [Linear -> activation] * len(hidden_sizes) -> Linear(num_classes). With several ``activations`` the
  int32 ``activation_index`` picks one via `jax.lax.switch`, so it may be a traced (vmapped) config leaf.
  """
  activations = tuple(activations)

  def forward(images, activation_index=0):
    if len(activations) == 1:
      act = activations[0]
    else:
      act = lambda v: jax.lax.switch(activation_index, activations, v)
    x = images.reshape(images.shape[0], -1)
    for i, h in enumerate(hidden_sizes):
      x = act(hk.Linear(h, name=f"linear_{i}")(x))
    return hk.Linear(num_classes, name="logits")(x)

  return hk.without_apply_rng(hk.transform(forward))


def cross_entropy_and_accuracy(logits: jax.Array, labels: jax.Array):
  logp = jax.nn.log_softmax(logits)
  loss = -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))
  accuracy = jnp.mean((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))
  return loss, accuracy


class ImageClassifierTask(Task):
  """Base of the image classifiers: a haiku ``self.net`` on ``batch["image"]``, softmax cross-entropy on
  ``batch["label"]`` (aux: accuracy), normalized by ``log(self.num_classes)``. Subclasses set ``net``,
  ``num_classes`` and ``datasets``."""

  def init(self, key):
    image = self.datasets.abstract_batch["image"]
    return self.net.init(key, jnp.zeros(image.shape, image.dtype))

  def loss_and_aux(self, params, key, batch):
    loss, accuracy = cross_entropy_and_accuracy(self.net.apply(params, batch["image"]), batch["label"])
    return loss, {"accuracy": accuracy}

  def normalizer(self, loss):
    return loss / jnp.log(self.num_classes)


class ImageMLPTask(ImageClassifierTask):
  """An MLP classifier on an image `Datasets`.

  Args:
    hidden_sizes: widths of the hidden layers.
    activation: a name from `metafam.tasks._nn.ACTIVATIONS`.
    datasets: the data; defaults to the embedded Fashion-MNIST at ``image_size`` with ``batch_size``.
    image_size, batch_size: used only to build the default datasets.
  """

  def __init__(self, hidden_sizes: Sequence[int] = (32,), activation: str = "relu",
               datasets: Optional[Datasets] = None, image_size: int = 8, batch_size: int = 128,
               name: Optional[str] = None):
    self.datasets = datasets if datasets is not None else fashion_mnist_datasets(batch_size, image_size)
    self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
    self.num_classes = int(self.datasets.extra_info.get("num_classes", 10))
    self.activation = activation
    self.net = mlp_forward(self.hidden_sizes, self.num_classes, [activation_by_name(activation)])
    shape = self.datasets.abstract_batch["image"].shape
    self.name = name or f"ImageMLP_{'x'.join(map(str, shape[1:3]))}_{'x'.join(map(str, self.hidden_sizes))}"

