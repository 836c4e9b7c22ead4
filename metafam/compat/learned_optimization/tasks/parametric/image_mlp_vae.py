"""`learned_optimization.tasks.parametric.image_mlp_vae`: the reference's parametric MLP-VAE family.

Per instance (traced, vmappable): an activation, an initializer, ``center_data`` (images mapped to ``2 (x - 0.5)``)
and ``per_dim_loss`` (the negative ELBO divided by the ``D`` pixels). Encoder: metafam's `mlp_forward` to ``2 * n_z``
(means, log standard deviations); decoder: `mlp_forward` from ``n_z`` to ``2 * D`` clipped to [-10, 10] (a Gaussian
per pixel with 1/255 quantization, `generative_model_utils.quantized_log_prob`); prior N(0, I). The loss is the
batch mean of ``-(log p(x|z) - KL(q(z|x) || p(z)))`` with one reparameterized ``z`` (keys from the loss key).
Params are ``{"encoder": ..., "decoder": ...}``.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam.compat.learned_optimization.tasks import base, generative_model_utils as gmu
from metafam.compat.learned_optimization.tasks.parametric import cfgobject, parametric_utils as pu
from metafam.datasets.base import Datasets
from metafam.tasks.image_mlp import mlp_forward

Batch = Any
Params = Any
ModelState = Any
PRNGKey = jax.Array

__all__ = ["Batch", "Params", "ModelState", "PRNGKey", "ParametricImageMLPVAE", "sample_image_mlp_vae",
           "timed_sample_image_mlp_vae"]


class _VAETask(base.Task):

  def __init__(self, datasets: Datasets, enc: Sequence[int], dec: Sequence[int], n_z: int, cfg: cfgobject.CFGNamed):
    super().__init__()
    self.datasets, self.cfg, self.n_z = datasets, cfg, int(n_z)
    self.num_pixels = int(np.prod(datasets.abstract_batch["image"].shape[1:]))
    w_init = pu.SampleInitializer.get_dynamic(cfg.values["initializer"])
    self.encoder = mlp_forward(tuple(enc), 2 * self.n_z, pu.SampleActivation.acts, w_init=w_init)
    self.decoder = mlp_forward(tuple(dec), 2 * self.num_pixels, pu.SampleActivation.acts, w_init=w_init)

  def init(self, key: PRNGKey) -> Params:
    image = self.datasets.abstract_batch["image"]
    act = self.cfg.values["activation"]["index"]
    k1, k2 = jax.random.split(key)
    return {"encoder": self.encoder.init(k1, jnp.zeros(image.shape, image.dtype), act),
            "decoder": self.decoder.init(k2, jnp.zeros((image.shape[0], self.n_z), image.dtype), act)}

  def loss(self, params: Params, key: PRNGKey, data: Batch) -> jax.Array:
    v, act = self.cfg.values, self.cfg.values["activation"]["index"]
    image = jnp.where(v["center_data"], 2 * (data["image"] - 0.5), data["image"])
    x = image.reshape(image.shape[0], -1)
    k_z, k_noise = jax.random.split(key)
    encoder = lambda inp: gmu.LogStddevNormal(self.encoder.apply(params["encoder"], inp, act))
    decoder = lambda z: _Quantized(jnp.clip(self.decoder.apply(params["decoder"], z, act), -10, 10), k_noise)
    prior = gmu.Normal(jnp.zeros((x.shape[0], self.n_z)), jnp.ones((x.shape[0], self.n_z)))
    log_p_x, kl = gmu.log_prob_elbo_components(encoder, decoder, prior, x, k_z)
    elbo = log_p_x - kl
    return jnp.mean(-jnp.where(v["per_dim_loss"], elbo / self.num_pixels, elbo))

  def normalizer(self, loss):
    out = jnp.where(self.cfg.values["per_dim_loss"], loss, loss / self.num_pixels)
    return jnp.clip(jnp.nan_to_num(out, nan=10, neginf=10, posinf=10), 0, 10)


class _Quantized(gmu.LogStddevNormal):
  """`LogStddevNormal` whose ``log_prob`` is `gmu.quantized_log_prob` with an explicit key (outside haiku)."""

  def __init__(self, mu_and_log_sigma, key):
    super().__init__(mu_and_log_sigma)
    self._key = key

  def log_prob(self, x, name="log_prob"):
    return gmu.quantized_log_prob(self, x, self._key, 1 / 255)


class ParametricImageMLPVAE(base.TaskFamily):
  """MLP VAEs (encoder ``enc_hidden_sizes``, decoder ``dec_hidden_sizes``, latent ``n_z``) on ``datasets``."""

  def __init__(self, datasets: Datasets, enc_hidden_sizes: Sequence[int] = (32, 32),
               dec_hidden_sizes: Sequence[int] = (32, 32), n_z: int = 32):
    super().__init__()
    self.datasets, self._n_z = datasets, int(n_z)
    self._enc_hidden_sizes, self._dec_hidden_sizes = tuple(enc_hidden_sizes), tuple(dec_hidden_sizes)

  def sample(self, key: PRNGKey) -> cfgobject.CFGNamed:
    k = jax.random.split(key, 4)
    flags = jnp.asarray([True, False])
    return cfgobject.CFGNamed("ParametricImageMLPVAE", {
        "initializer": pu.SampleInitializer.sample(k[0]), "activation": pu.SampleActivation.sample(k[1]),
        "center_data": pu.choice(k[2], flags), "per_dim_loss": pu.choice(k[3], flags)})

  def task_fn(self, cfg: cfgobject.CFGNamed) -> base.Task:
    return _VAETask(self.datasets, self._enc_hidden_sizes, self._dec_hidden_sizes, self._n_z, cfg)


def sample_image_mlp_vae(key: PRNGKey) -> cfgobject.CFGObject:
  """A `ParametricImageMLPVAE` configuration: encoder / decoder of 0-4 layers of log-uniform widths in [4, 128),
  latent in [2, 128), a sampled image dataset at a side in [4, 32) and batch size in [4, 512)."""
  k = jax.random.split(key, 8)
  lf = cfgobject.LogFeature
  enc, dec = pu.log_int(k[0], 4, 128), pu.log_int(k[1], 4, 128)
  enc_layers, dec_layers = pu.choice(k[2], [0, 1, 2, 3, 4]), pu.choice(k[3], [0, 1, 2, 3, 4])
  side, batch_size = pu.log_int(k[4], 4, 32), pu.log_int(k[5], 4, 512)
  dataset = cfgobject.CFGObject(pu.SampleImageDataset.sample(k[7]),
                                {"image_size": lf((side, side)), "batch_size": lf(batch_size)})
  return cfgobject.CFGObject("ParametricImageMLPVAE", {
      "enc_hidden_sizes": lf(tuple(enc_layers * [enc])), "dec_hidden_sizes": lf(tuple(dec_layers * [dec])),
      "n_z": lf(pu.log_int(k[6], 2, 128)), "datasets": dataset})


def timed_sample_image_mlp_vae(key: PRNGKey, max_time=1e-5):
  """Not available offline (the reference's learned runtime model); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_image_mlp_vae", "sample_image_mlp_vae")
