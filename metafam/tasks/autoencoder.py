"""Image autoencoders (dm-haiku MLPs): a deterministic MLP autoencoder and a small variational autoencoder.

Batches are ``{"image": f32[B, H, W, C], "label": i32[B]}`` with pixels in [0, 1] ("unit" normalization); labels
are ignored. Both models reuse `metafam.tasks.image_mlp.mlp_forward` (flatten -> MLP -> Linear); with ``D = H*W*C``
pixels, an MLP with widths ``(n_0, ..., n_L)`` has ``sum_i (n_{i-1} + 1) * n_i`` parameters.

* `MLPAutoencoderTask`: ``D -> hidden_sizes -> D`` logits, reconstruction ``sigmoid(logits)``; loss = mean squared
  error per pixel. `normalizer` divides by ``RECONSTRUCTION_SCALE = 0.25``, the largest squared error the
  zero-logit output 0.5 can make on a [0, 1] pixel (at initialization Fashion-MNIST gives about 0.7).
* `VAETask`: encoder ``D -> encoder_sizes -> 2 * latent_size`` (mean, log-variance of a diagonal Gaussian),
  decoder ``latent_size -> decoder_sizes -> D`` Bernoulli logits; loss = negative ELBO per example (summed sigmoid
  cross-entropy + KL to N(0, I)), averaged over the batch, with one reparameterized sample drawn from the loss key.
  `normalizer` divides by ``D * log(2)`` (nats per pixel over log 2), so a zero-logit decoder with a zero KL maps to
  1.0.

Registered (parameter counts):

  * ``fmnist_ae_8x8_32x8x32``: 4,744 params.
  * ``fmnist_ae_16x16_64x16x64``: 35,216 params.
  * ``fmnist_vae_8x8_32_z4``: encoder (32,), latent 4, decoder (32,): 4,616 params.
  * ``fmnist_vae_16x16_64_z8``: encoder (64,), latent 8, decoder (64,): 34,704 params.
  * heldout suite (batch size in the name): ``fmnist_ae_16x16_128x32x128_b32``: 74,272 params;
    ``mnist_ae_28x28_64x16x64_b32`` (MNIST digits): 103,328 params; ``mnist_vae_16x16_64_z8_b32``: 34,704 params;
    ``fmnist_vae_28x28_64_z8_b64``: 102,816 params.
  * test suite (the full Fashion-MNIST): ``fmnist60k_ae_28x28_128x32x128_b64``: 209,968 params;
    ``fmnist60k_vae_28x28_128_z16_b64``: 207,920 params.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam.datasets.base import Datasets
from metafam.datasets.images import fashion_mnist_datasets
from metafam.tasks._nn import activation_by_name
from metafam.tasks.base import Task
from metafam.tasks.image_mlp import mlp_forward

RECONSTRUCTION_SCALE = 0.25


def mlp_num_params(widths: Sequence[int]) -> int:
  """Parameters of dense layers ``widths[0] -> widths[1] -> ...`` with biases."""
  return sum((a + 1) * b for a, b in zip(widths[:-1], widths[1:]))


def _image_datasets(datasets: Optional[Datasets], image_size: int, batch_size: int) -> Datasets:
  datasets = datasets if datasets is not None else fashion_mnist_datasets(batch_size, image_size)
  normalization = datasets.extra_info.get("normalization", "unit")
  if normalization != "unit":
    raise ValueError(f"autoencoders need pixels in [0, 1] (normalization 'unit'), got {normalization!r}.")
  return datasets


def sigmoid_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Elementwise ``-[t log sigmoid(l) + (1 - t) log(1 - sigmoid(l))]`` for targets ``t`` in [0, 1] (stable)."""
  return jax.nn.softplus(logits) - targets * logits


class MLPAutoencoderTask(Task):
  """A dense autoencoder: ``D -> hidden_sizes -> D``, mean squared reconstruction error per pixel.

  Args:
    hidden_sizes: widths between input and output, e.g. ``(32, 8, 32)`` for an 8-unit bottleneck; the activation
      follows every hidden layer (the code included).
    activation: a name from `metafam.tasks._nn.ACTIVATIONS`.
    datasets: image data with pixels in [0, 1]; defaults to the embedded Fashion-MNIST at ``image_size``.
    image_size, batch_size: used only to build the default datasets.

  Parameter count: ``mlp_num_params((D,) + hidden_sizes + (D,))`` (registered configs in the module docstring).
  """

  def __init__(self, hidden_sizes: Sequence[int] = (32, 8, 32), activation: str = "relu",
               datasets: Optional[Datasets] = None, image_size: int = 8, batch_size: int = 128,
               name: Optional[str] = None):
    self.datasets = _image_datasets(datasets, image_size, batch_size)
    self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
    self.activation = activation
    shape = self.datasets.abstract_batch["image"].shape
    self.num_pixels = int(np.prod(shape[1:]))
    self.net = mlp_forward(self.hidden_sizes, self.num_pixels, [activation_by_name(activation)])
    self.name = name or f"MLPAutoencoder_{'x'.join(map(str, shape[1:3]))}_{'x'.join(map(str, self.hidden_sizes))}"

  def init(self, key):
    image = self.datasets.abstract_batch["image"]
    return self.net.init(key, jnp.zeros(image.shape, image.dtype))

  def loss(self, params, key, batch):
    images = batch["image"]
    recon = jax.nn.sigmoid(self.net.apply(params, images)).reshape(images.shape)
    return jnp.mean(jnp.square(recon - images))

  def normalizer(self, loss):
    return loss / RECONSTRUCTION_SCALE


class VAETask(Task):
  """A variational autoencoder with a diagonal-Gaussian encoder and a Bernoulli decoder; loss = negative ELBO.

  Params are ``{"encoder": haiku params, "decoder": haiku params}``. The loss draws ``eps ~ N(0, I)`` from the loss
  key (``z = mean + exp(log_var / 2) * eps``) and returns the batch mean of ``reconstruction + kl`` in nats per
  example; aux holds both terms.

  Args:
    encoder_sizes, latent_size, decoder_sizes: widths (see the module docstring).
    activation: a name from `metafam.tasks._nn.ACTIVATIONS`.
    datasets: image data with pixels in [0, 1]; defaults to the embedded Fashion-MNIST at ``image_size``.
    image_size, batch_size: used only to build the default datasets.

  Parameter count: ``mlp_num_params((D,) + encoder_sizes + (2 * latent_size,)) +
  mlp_num_params((latent_size,) + decoder_sizes + (D,))``.
  """

  def __init__(self, encoder_sizes: Sequence[int] = (32,), latent_size: int = 4, decoder_sizes: Sequence[int] = (32,),
               activation: str = "relu", datasets: Optional[Datasets] = None, image_size: int = 8,
               batch_size: int = 128, name: Optional[str] = None):
    self.datasets = _image_datasets(datasets, image_size, batch_size)
    self.encoder_sizes = tuple(int(h) for h in encoder_sizes)
    self.decoder_sizes = tuple(int(h) for h in decoder_sizes)
    self.latent_size = int(latent_size)
    self.activation = activation
    shape = self.datasets.abstract_batch["image"].shape
    self.num_pixels = int(np.prod(shape[1:]))
    act = [activation_by_name(activation)]
    self.encoder = mlp_forward(self.encoder_sizes, 2 * self.latent_size, act)
    self.decoder = mlp_forward(self.decoder_sizes, self.num_pixels, act)
    self.name = name or f"VAE_{'x'.join(map(str, shape[1:3]))}_z{self.latent_size}"

  def init(self, key):
    image = self.datasets.abstract_batch["image"]
    k_enc, k_dec = jax.random.split(key)
    return {"encoder": self.encoder.init(k_enc, jnp.zeros(image.shape, image.dtype)),
            "decoder": self.decoder.init(k_dec, jnp.zeros((image.shape[0], self.latent_size), image.dtype))}

  def loss_and_aux(self, params, key, batch):
    images = batch["image"]
    targets = images.reshape(images.shape[0], -1)
    mean, log_var = jnp.split(self.encoder.apply(params["encoder"], images), 2, axis=-1)
    z = mean + jnp.exp(0.5 * log_var) * jax.random.normal(key, mean.shape, mean.dtype)
    logits = self.decoder.apply(params["decoder"], z)
    reconstruction = jnp.sum(sigmoid_cross_entropy(logits, targets), axis=-1)
    kl = 0.5 * jnp.sum(jnp.exp(log_var) + jnp.square(mean) - 1.0 - log_var, axis=-1)
    return jnp.mean(reconstruction + kl), {"reconstruction": jnp.mean(reconstruction), "kl": jnp.mean(kl)}

  def normalizer(self, loss):
    return loss / (self.num_pixels * math.log(2.0))
