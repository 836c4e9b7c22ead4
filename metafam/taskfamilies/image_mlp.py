"""A family of image-MLP classifiers: fixed architecture, sampled initialization, activation and label noise."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metafam.datasets.base import Datasets
from metafam.datasets.images import fashion_mnist_datasets
from metafam.taskfamilies._sampling import check_activations
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks._nn import ACTIVATIONS
from metafam.tasks.base import Task
from metafam.tasks.image_mlp import cross_entropy_and_accuracy, mlp_forward


class _ImageMLPInstance(Task):

  def __init__(self, family: "ImageMLPFamily", cfg):
    self.family, self.cfg, self.datasets = family, cfg, family.datasets
    self.name = family.name

  def init(self, key):
    image = self.datasets.abstract_batch["image"]
    params = self.family.net.init(key, jnp.zeros(image.shape, image.dtype))
    # Scale the weight matrices (not the biases) by the sampled initializer scale.
    return {mod: {k: v * self.cfg["init_scale"] if k == "w" else v for k, v in p.items()}
            for mod, p in params.items()}

  def loss_and_aux(self, params, key, batch):
    labels = batch["label"]
    # One uniform draw per example: u < p flips the label, and given a flip u / p is uniform on [0, 1), which
    # picks the replacement class (half the random numbers of a separate bernoulli + randint).
    # A family without label noise draws nothing (the same labels as a draw with p = 0, without its cost).
    noisy = labels if self.family.label_noise_range[1] == 0 else self._noisy_labels(labels, key)
    loss, accuracy = cross_entropy_and_accuracy(self.family.net.apply(params, batch["image"],
                                                                     self.cfg["activation"]), noisy)
    return loss, {"accuracy": accuracy}

  def _noisy_labels(self, labels, key):
    p, k = self.cfg["label_noise"], self.family.num_classes
    u = jax.random.uniform(key, labels.shape)
    random_labels = jnp.minimum((u / jnp.maximum(p, 1e-12) * k).astype(jnp.int32), k - 1)
    return jnp.where(u < p, random_labels, labels)

  def normalizer(self, loss):
    return loss / jnp.log(self.family.num_classes)


class ImageMLPFamily(TaskFamily):
  """MLP classifiers whose hidden sizes are fixed per family; per instance (config leaves):

  * ``activation``: int32 index into ``activations`` (dispatched with `jax.lax.switch`),
  * ``init_scale``: f32, multiplies every initial weight matrix; log-uniform in ``init_scale_range``,
  * ``label_noise``: f32, probability that a training label is replaced by a uniformly random class (drawn from the
    loss key, so evaluation with ``label_noise = 0`` sees clean labels); uniform in ``label_noise_range``.
  """

  def __init__(self, hidden_sizes: Sequence[int] = (32,), image_size: int = 8, batch_size: int = 128,
               activations: Sequence[str] = ("relu", "tanh", "gelu", "swish"),
               init_scale_range: Tuple[float, float] = (0.5, 2.0),
               label_noise_range: Tuple[float, float] = (0.0, 0.1), datasets: Optional[Datasets] = None):
    super().__init__()
    self.activations = check_activations(activations)
    if not 0 < init_scale_range[0] <= init_scale_range[1]:
      raise ValueError(f"init_scale_range must satisfy 0 < low <= high, got {init_scale_range!r}.")
    if not 0 <= label_noise_range[0] <= label_noise_range[1] <= 1:
      raise ValueError(f"label_noise_range must satisfy 0 <= low <= high <= 1, got {label_noise_range!r}.")
    self.datasets = datasets if datasets is not None else fashion_mnist_datasets(batch_size, image_size)
    self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
    self.init_scale_range = tuple(float(x) for x in init_scale_range)
    self.label_noise_range = tuple(float(x) for x in label_noise_range)
    self.num_classes = int(self.datasets.extra_info.get("num_classes", 10))
    fns = [ACTIVATIONS[a] for a in self.activations]
    self.net = mlp_forward(self.hidden_sizes, self.num_classes, fns)
    shape = self.datasets.abstract_batch["image"].shape
    self.name = f"ImageMLPFamily_{shape[1]}x{shape[2]}_{'x'.join(map(str, self.hidden_sizes))}"

  def sample(self, key):
    k1, k2, k3 = jax.random.split(key, 3)
    lo, hi = np.log(self.init_scale_range[0]), np.log(self.init_scale_range[1])
    return {"activation": jax.random.randint(k1, (), 0, len(self.activations), jnp.int32),
            "init_scale": jnp.exp(jax.random.uniform(k2, (), jnp.float32, lo, hi)),
            "label_noise": jax.random.uniform(k3, (), jnp.float32, *self.label_noise_range)}

  def task_fn(self, cfg):
    return _ImageMLPInstance(self, cfg)
