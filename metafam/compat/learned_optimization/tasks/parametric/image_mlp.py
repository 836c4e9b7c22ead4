"""`learned_optimization.tasks.parametric.image_mlp`: the reference's parametric image-MLP family.

`ParametricImageMLP` samples, per instance, an activation (`SampleActivation`, 12 choices) and a weight
initializer with a scale (`SampleInitializer`): int/float leaves of a `CFGNamed`, so ``sample`` and ``task_fn``
vmap. The task is metafam's `metafam.tasks.image_mlp.mlp_forward` (every activation under one `jax.lax.switch`)
with softmax cross-entropy, initialized from the abstract batch (no data read). `sample_image_mlp` draws a
family configuration (a `CFGObject`: widths, dataset, image and batch size) for `cfgobject.object_from_config`.
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

__all__ = ["Batch", "Params", "ModelState", "PRNGKey", "ParametricImageMLP", "sample_image_mlp",
           "timed_sample_image_mlp", "sample_image_mlp_subsample_data", "timed_sample_image_mlp_subsample_data"]


def image_classification_normalizer(loss: jax.Array, num_classes: int) -> jax.Array:
  """The reference's parametric normalizer: the loss (non-finite -> ``log 2K``) clipped to ``[0, log 2K]``, minus
  ``log(K / 5)``, times ``10 / log K``."""
  top = np.log(2 * num_classes)
  loss = jnp.clip(jnp.nan_to_num(loss, nan=top, posinf=top, neginf=top), 0, top)
  return (loss - np.log(num_classes / 5)) * 10 / np.log(num_classes)


def sample_activation_and_initializer(name: str, key: PRNGKey) -> cfgobject.CFGNamed:
  """``CFGNamed(name, {"initializer": ..., "activation": ...})``: the per-instance part of the image families."""
  act_key, init_key = jax.random.split(key)
  return cfgobject.CFGNamed(name, {"initializer": pu.SampleInitializer.sample(init_key),
                                   "activation": pu.SampleActivation.sample(act_key)})


class SampledImageTask(base.Task):
  """A classifier ``net(images, activation_index)`` (built from the sampled initializer ``cfg``) on ``datasets``
  with softmax cross-entropy and the parametric normalizer; initialized from the abstract batch."""

  def __init__(self, datasets: Datasets, net_fn, num_classes: int, cfg: cfgobject.CFGNamed):
    super().__init__()
    self.datasets, self.num_classes, self.cfg = datasets, num_classes, cfg
    self.net = net_fn(pu.SampleInitializer.get_dynamic(cfg.values["initializer"]))

  def init(self, key: PRNGKey) -> Params:
    image = self.datasets.abstract_batch["image"]
    return self.net.init(key, jnp.zeros(image.shape, image.dtype), self.cfg.values["activation"]["index"])

  def loss(self, params: Params, key: PRNGKey, data: Batch) -> jax.Array:
    logits = self.net.apply(params, data["image"], self.cfg.values["activation"]["index"])
    return jnp.mean(base.softmax_cross_entropy(logits=logits, labels=jax.nn.one_hot(data["label"],
                                                                                     self.num_classes)))

  def normalizer(self, loss):
    return image_classification_normalizer(loss, self.num_classes)


class ParametricImageMLP(base.TaskFamily):
  """MLPs with widths ``hidden_layers`` and ``num_classes`` outputs on ``datasets``; per instance an activation
  and an initializer."""

  def __init__(self, datasets: Datasets, num_classes: int, hidden_layers: Sequence[int] = (32, 32)):
    super().__init__()
    self.datasets, self.num_clases, self.hidden_layers = datasets, int(num_classes), tuple(hidden_layers)

  def sample(self, key: PRNGKey) -> cfgobject.CFGNamed:
    return sample_activation_and_initializer("ParametricImageMLP", key)

  def task_fn(self, task_params: cfgobject.CFGNamed) -> base.Task:
    net_fn = lambda w_init: mlp_forward(self.hidden_layers, self.num_clases, pu.SampleActivation.acts, w_init=w_init)
    return SampledImageTask(self.datasets, net_fn, self.num_clases, task_params)


def sample_image_mlp(key: PRNGKey) -> cfgobject.CFGObject:
  """A `ParametricImageMLP` configuration: 0-4 layers of one log-uniform width in [8, 128), a sampled image
  dataset at a log-uniform side in [4, 32) and batch size in [4, 512)."""
  k1, k2, k3, k4, k5 = jax.random.split(key, 5)
  hidden, layers = pu.log_int(k1, 8, 128), pu.choice(k2, [0, 1, 2, 3, 4])
  side, batch_size = pu.log_int(k3, 4, 32), pu.log_int(k4, 4, 512)
  name = pu.SampleImageDataset.sample(k5)
  lf = cfgobject.LogFeature
  dataset = cfgobject.CFGObject(name, {"image_size": lf((side, side)), "batch_size": lf(batch_size)})
  return cfgobject.CFGObject("ParametricImageMLP", {"hidden_layers": lf(layers * [hidden]),
                                                    "num_classes": pu.SampleImageDataset.num_classes(name),
                                                    "datasets": dataset})


def sample_image_mlp_subsample_data(key: PRNGKey) -> cfgobject.CFGObject:
  """`sample_image_mlp`, with probability 0.2 (not for ImageNet) also a ``data_fraction`` uniform in [0, 1) on
  the dataset (hidden from the "time" and "valid" features)."""
  k1, k2, k3 = jax.random.split(key, 3)
  cfg = sample_image_mlp(k1)
  dataset = cfg.kwargs["datasets"]
  if "imagenet" not in dataset.obj and float(jax.random.uniform(k2, [])) < 0.2:
    fraction = cfgobject.DoNotFeaturize(float(jax.random.uniform(k3, [], minval=1e-3)), ("time", "valid"))
    dataset = cfgobject.CFGObject(dataset.obj, dict(dataset.kwargs, data_fraction=fraction))
    cfg = cfgobject.CFGObject(cfg.obj, dict(cfg.kwargs, datasets=dataset))
  return cfg


def timed_sample_image_mlp(key: PRNGKey, max_time=1e-5):
  """Not available offline (the reference's learned runtime model); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_image_mlp", "sample_image_mlp")


def timed_sample_image_mlp_subsample_data(key: PRNGKey, max_time=1e-5):
  """Not available offline (the reference's learned runtime model); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_image_mlp_subsample_data", "sample_image_mlp_subsample_data")
