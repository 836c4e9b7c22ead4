"""`learned_optimization.tasks.parametric.image_mlp_ae`: the reference's parametric MLP-autoencoder family.

Per instance (traced, vmappable): an activation, an initializer, and three switches: ``center_data`` (images mapped
to ``2 (x - 0.5)``), ``constrain_output`` (outputs through ``tanh`` for centered data, else ``sigmoid``) and
``log_loss`` (the loss is ``log(mse + 1e-8)``). The net is metafam's `mlp_forward` to ``D = H*W*C`` outputs;
the loss is the mean squared reconstruction error; `normalizer` is the reference's (``log`` of a plain loss,
clipped to ``[-12, 1]``, times 0.5, plus 10).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.parametric import cfgobject, parametric_utils as pu
from metafam.datasets.base import Datasets
from metafam.tasks.image_mlp import mlp_forward

Batch = Any
Params = Any
ModelState = Any
PRNGKey = jax.Array

__all__ = ["Batch", "Params", "ModelState", "PRNGKey", "ParametricImageMLPAE", "sample_image_mlp_ae",
           "timed_sample_image_mlp_ae"]


class _AutoencoderTask(base.Task):

  def __init__(self, datasets: Datasets, hidden_sizes: Sequence[int], cfg: cfgobject.CFGNamed):
    super().__init__()
    self.datasets, self.cfg = datasets, cfg
    shape = datasets.abstract_batch["image"].shape
    w_init = pu.SampleInitializer.get_dynamic(cfg.values["initializer"])
    self.net = mlp_forward(tuple(hidden_sizes), int(np.prod(shape[1:])), pu.SampleActivation.acts, w_init=w_init)

  def init(self, key: PRNGKey) -> Params:
    image = self.datasets.abstract_batch["image"]
    return self.net.init(key, jnp.zeros(image.shape, image.dtype), self.cfg.values["activation"]["index"])

  def loss(self, params: Params, key: PRNGKey, data: Batch) -> jax.Array:
    v = self.cfg.values
    image = jnp.where(v["center_data"], 2 * (data["image"] - 0.5), data["image"])
    pred = self.net.apply(params, image, v["activation"]["index"]).reshape(image.shape)
    constrained = jnp.where(v["center_data"], jnp.tanh(pred), jax.nn.sigmoid(pred))
    pred = jnp.where(v["constrain_output"], constrained, pred)
    mse = jnp.mean(jnp.square(pred - image))
    return jnp.where(v["log_loss"], jnp.log(mse + 1e-8), mse)

  def normalizer(self, loss):
    out = jnp.where(self.cfg.values["log_loss"], loss, jnp.log(loss + 1e-8))
    return jnp.clip(jnp.nan_to_num(out, nan=1, neginf=1, posinf=1), -12, 1) * 0.5 + 10


class ParametricImageMLPAE(base.TaskFamily):
  """MLP autoencoders with ``hidden_sizes`` on ``datasets``; per instance the choices of the module docstring."""

  def __init__(self, datasets: Datasets, hidden_sizes: Sequence[int] = (32, 32)):
    super().__init__()
    self.datasets, self.hidden_sizes = datasets, tuple(hidden_sizes)

  def sample(self, key: PRNGKey) -> cfgobject.CFGNamed:
    k = jax.random.split(key, 5)
    flags = jnp.asarray([True, False])
    return cfgobject.CFGNamed("ParametricImageMLP", {
        "initializer": pu.SampleInitializer.sample(k[0]), "activation": pu.SampleActivation.sample(k[1]),
        "log_loss": pu.choice(k[2], flags), "center_data": pu.choice(k[3], flags),
        "constrain_output": pu.choice(k[4], flags)})

  def task_fn(self, cfg: cfgobject.CFGNamed) -> base.Task:
    return _AutoencoderTask(self.datasets, self.hidden_sizes, cfg)


def sample_image_mlp_ae(key: PRNGKey) -> cfgobject.CFGObject:
  """A `ParametricImageMLPAE` configuration: 0-4 layers of one log-uniform width in [8, 128), a sampled image
  dataset at a log-uniform side in [4, 32) and batch size in [4, 512)."""
  k = jax.random.split(key, 5)
  hidden, layers = pu.log_int(k[0], 8, 128), pu.choice(k[1], [0, 1, 2, 3, 4])
  side, batch_size = pu.log_int(k[2], 4, 32), pu.log_int(k[3], 4, 512)
  lf = cfgobject.LogFeature
  dataset = cfgobject.CFGObject(pu.SampleImageDataset.sample(k[4]),
                                {"image_size": lf((side, side)), "batch_size": lf(batch_size)})
  return cfgobject.CFGObject("ParametricImageMLPAE", {"hidden_sizes": lf(layers * [hidden]), "datasets": dataset})


def timed_sample_image_mlp_ae(key: PRNGKey, max_time=1e-5):
  """Not available offline (the reference's learned runtime model); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_image_mlp_ae", "sample_image_mlp_ae")
