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

NORMS = (None, "layer_norm", "batch_norm")


def normalization_layer(norm: Optional[str], name: str) -> Callable[[jax.Array], jax.Array]:
  """The haiku layer for ``norm``: identity (None), LayerNorm over the last axis (scale and offset), or BatchNorm
  in training mode (batch statistics; decay 0.9 for the running averages kept in the haiku state)."""
  if norm is None:
    return lambda x: x
  if norm == "layer_norm":
    return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, name=name)
  if norm == "batch_norm":
    batch_norm = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9, name=name)
    return lambda x: batch_norm(x, is_training=True)
  raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")


def mlp_forward(hidden_sizes: Sequence[int], num_classes: int,
                activations: Sequence[Callable[[jax.Array], jax.Array]], norm: Optional[str] = None,
                dropout_rate: float = 0.0, w_init: Optional[hk.initializers.Initializer] = None) -> hk.Transformed:
  """A haiku MLP ``forward(images, activation_index=0, dropout_key=None) -> logits``.

  flatten -> [Linear -> norm -> dropout -> activation] * len(hidden_sizes) -> Linear(num_classes). With several
  ``activations`` the int32 ``activation_index`` picks one via `jax.lax.switch`, so it may be a traced (vmapped)
  config leaf. ``norm`` is one of `NORMS` (`normalization_layer`); with "batch_norm" the result is an
  ``hk.TransformedWithState`` (``init -> (params, state)``, ``apply(params, state, ...) -> (logits, state)``).
  Dropout (rate ``dropout_rate``, before the activation as in ``hk.nets.MLP``) is applied only when ``dropout_key``
  is given. ``w_init`` initializes every weight matrix (haiku's default, truncated normal of std ``1/sqrt(fan_in)``,
  if None); it may close over traced config values.
  """
  activations = tuple(activations)
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")
  if not 0.0 <= float(dropout_rate) < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate!r}.")

  def forward(images, activation_index=0, dropout_key=None):
    if len(activations) == 1:
      act = activations[0]
    else:
      act = lambda v: jax.lax.switch(activation_index, activations, v)
    x = images.reshape(images.shape[0], -1)
    for i, h in enumerate(hidden_sizes):
      x = normalization_layer(norm, f"norm_{i}")(hk.Linear(h, w_init=w_init, name=f"linear_{i}")(x))
      if dropout_rate and dropout_key is not None:
        x = hk.dropout(jax.random.fold_in(dropout_key, i), dropout_rate, x)
      x = act(x)
    return hk.Linear(num_classes, w_init=w_init, name="logits")(x)

  return hk.without_apply_rng(hk.transform_with_state(forward) if norm == "batch_norm" else hk.transform(forward))


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

  def logits(self, params, key, images):
    """The network's logits for ``images`` (``key`` feeds dropout where a subclass has it)."""
    return self.net.apply(params, images)

  def loss_and_aux(self, params, key, batch):
    loss, accuracy = cross_entropy_and_accuracy(self.logits(params, key, batch["image"]), batch["label"])
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
    dropout_rate: hidden units dropped during the loss (keyed by the loss key; see `mlp_forward`).

  Parameter count: ``sum_i (n_{i-1} + 1) * n_i`` over widths ``(H*W*C, *hidden_sizes, num_classes)``.
  """

  def __init__(self, hidden_sizes: Sequence[int] = (32,), activation: str = "relu",
               datasets: Optional[Datasets] = None, image_size: int = 8, batch_size: int = 128,
               name: Optional[str] = None, dropout_rate: float = 0.0):
    self.datasets = datasets if datasets is not None else fashion_mnist_datasets(batch_size, image_size)
    self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
    self.num_classes = int(self.datasets.extra_info.get("num_classes", 10))
    self.activation = activation
    self.dropout_rate = float(dropout_rate)
    self.net = mlp_forward(self.hidden_sizes, self.num_classes, [activation_by_name(activation)],
                           dropout_rate=self.dropout_rate)
    shape = self.datasets.abstract_batch["image"].shape
    self.name = name or f"ImageMLP_{'x'.join(map(str, shape[1:3]))}_{'x'.join(map(str, self.hidden_sizes))}"

  def logits(self, params, key, images):
    return self.net.apply(params, images, 0, key if self.dropout_rate else None)
