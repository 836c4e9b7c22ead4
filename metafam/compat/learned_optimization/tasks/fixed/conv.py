"""`learned_optimization.tasks.fixed.conv`: the reference's conv-net tasks over metafam's `conv_forward`.

Architecture (the reference's): ``[Conv2D(c_i, 3x3, SAME, stride 2 for the first layer and 1 after) -> activation
-> (norm)] * L -> global average pool -> Linear(K)``, softmax cross-entropy; an `ImageClassifier` (see
`_classifier`) named like the reference. Parameters: ``sum_i (9 * c_{i-1} + 1) * c_i + (c_L + 1) * K`` plus
``2 * c_i`` per layer with a norm. All these tasks use CIFAR-10 (read from ``$METAFAM_CIFAR10_DIR`` when a batch is
requested), CIFAR-100 or ImageNet (unavailable offline: `DatasetUnavailableError` when a batch is requested);
building and initializing never read data. ``TASKS`` maps each name to ``(dataset, batch size, image side,
channels, activation, norm)``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.fixed._classifier import ImageClassifier
from metafam.compat.learned_optimization.tasks.fixed.image_mlp import image_datasets
from metafam.tasks._nn import activation_by_name
from metafam.tasks.conv import conv_forward
from metafam.tasks.image_mlp import cross_entropy_and_accuracy
from metafam.compat.learned_optimization.tasks.fixed._named import named_task_functions

Params = base.Params
ModelState = base.ModelState
PRNGKey = base.PRNGKey

_C = (32, 64, 64)
TASKS = {
    "Conv_Cifar10_8_16x32": ("cifar10", 128, 8, (16, 32), "relu", None),
    "Conv_Cifar10_16_32x64x64": ("cifar10", 128, 16, _C, "relu", None),
    "Conv_Cifar10_32x64x64": ("cifar10", 128, 32, _C, "relu", None),
    "Conv_Cifar100_32x64x64": ("cifar100", 128, 32, _C, "relu", None),
    "Conv_Cifar100_32x64x64_BS32": ("cifar100", 32, 32, _C, "relu", None),
    "Conv_Cifar100_32x64x64_Tanh": ("cifar100", 128, 32, _C, "tanh", None),
    "Conv_Cifar10_32x64x64_Tanh": ("cifar10", 128, 32, _C, "tanh", None),
    "Conv_imagenet32_16_32x64x64": ("imagenet32", 128, 32, _C, "relu", None),
    "Conv_imagenet16_16_64x128x128x128": ("imagenet16", 128, 16, (64, 128, 128, 128), "relu", None),
    "Conv_Cifar10_32x64x64_batchnorm": ("cifar10", 128, 32, _C, "relu", "batch_norm"),
    "Conv_Cifar10_32x64x64_layernorm": ("cifar10", 128, 32, _C, "relu", "layer_norm"),
}

__all__ = list(TASKS) + ["Params", "ModelState", "PRNGKey", "TASKS", "build"]


def _cross_entropy_pool_loss(hidden_units: Sequence[int], activation_fn: Callable[[jax.Array], jax.Array],
                             initializers: Optional[Any] = None,
                             norm_fn: Callable[[jax.Array], jax.Array] = lambda x: x, pool: str = "avg",
                             num_classes: int = 10) -> Callable[[Any], jax.Array]:
  """The reference's haiku loss function ``fn(batch) -> mean softmax cross-entropy`` of a conv net on
  ``batch["image"]``: ``[Conv2D(h, 3x3, SAME, stride 2 first then 1) -> activation_fn -> norm_fn]`` per entry of
  ``hidden_units``, a global ``pool`` ("avg" or "max") and ``Linear(num_classes)``. To be transformed by the caller
  (`_ConvTask` uses ``hk.transform_with_state``, so ``norm_fn`` may hold state such as batch norm). ``initializers``
  is accepted and unused, as in the reference."""
  del initializers
  if pool not in ("avg", "max"):
    raise ValueError(f"pool must be 'avg' or 'max', got {pool!r}.")
  hidden_units = tuple(int(h) for h in hidden_units)

  def fn(batch):
    x = batch["image"]
    for i, h in enumerate(hidden_units):
      x = norm_fn(activation_fn(hk.Conv2D(h, 3, stride=2 if i == 0 else 1)(x)))
    x = jnp.mean(x, axis=(1, 2)) if pool == "avg" else jnp.max(x, axis=(1, 2))
    return cross_entropy_and_accuracy(hk.Linear(num_classes)(x), batch["label"])[0]

  return fn


class _ConvTask(base.Task):
  """The reference's conv task, the base research code subclasses: ``base_model_fn`` (a haiku function
  ``batch -> loss``, e.g. `_cross_entropy_pool_loss`) under ``hk.transform_with_state`` on ``datasets``.
  ``with_state`` is kept as the reference does (the haiku state is always threaded through)."""

  def __init__(self, base_model_fn: Callable[[Any], jax.Array], datasets: Any, with_state: bool = False):
    super().__init__()
    self._mod = hk.transform_with_state(base_model_fn)
    self.datasets = datasets
    self._with_state = with_state

  def init_with_state(self, key: PRNGKey):
    batch = jax.tree.map(lambda x: jnp.ones(x.shape, x.dtype), self.datasets.abstract_batch)
    return self._mod.init(key, batch)

  def loss_with_state_and_aux(self, params, state, key, data):
    loss, state = self._mod.apply(params, state, key, data)
    return loss, state, {}

  def normalizer(self, loss):
    return jnp.clip(loss, 0, 1.5 * jnp.log(self.datasets.extra_info["num_classes"]))


def build(name: str) -> ImageClassifier:
  """The task ``name`` of ``TASKS``."""
  dataset, batch_size, side, channels, activation, norm = TASKS[name]
  datasets = image_datasets(dataset, batch_size, side)
  strides = (2,) + (1,) * (len(channels) - 1)
  net = conv_forward(channels, datasets.extra_info["num_classes"], [activation_by_name(activation)], 3, strides,
                     norm)
  return ImageClassifier(net, datasets, name)


globals().update(named_task_functions(TASKS, build))
