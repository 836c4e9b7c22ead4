"""`learned_optimization.tasks.fixed.image_mlp`: the reference's image-MLP tasks over metafam's `mlp_forward`.

Every reference name is a zero-argument function returning an `ImageClassifier` (see `_classifier`) named like the
reference: ``flatten -> [Linear -> (norm) -> (dropout) -> activation] * hidden -> Linear(K)``, softmax
cross-entropy (``_MSE``: squared error to one-hot labels), on the reference's dataset, image size and batch size
(`tasks.datasets.image`). Fashion-MNIST tasks train offline on metafam's data; the CIFAR-10 / MNIST tasks read
local files when a batch is requested and the CIFAR-100 / ImageNet ones raise `DatasetUnavailableError` then;
building or initializing any task reads no data. ``TASKS`` maps each name to its configuration
``(dataset, batch size, image side, hidden sizes, activation, options)``.

Parameters: ``sum_i (n_{i-1} + 1) * n_i`` over widths ``(H*W*C, *hidden, K)``, plus ``2 * n_i`` per hidden layer with
a norm (LayerNorm/BatchNorm scale and offset).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.datasets import image
from metafam.compat.learned_optimization.tasks.fixed._classifier import ImageClassifier, cross_entropy_normalizer
from metafam.tasks._nn import activation_by_name
from metafam.tasks.image_mlp import cross_entropy_and_accuracy, mlp_forward
from metafam.compat.learned_optimization.tasks.fixed._named import named_task_functions

Params = base.Params
ModelState = base.ModelState
PRNGKey = base.PRNGKey

TASKS = {
    "ImageMLP_Cifar10BW8_Relu32": ("cifar10", 128, 8, (32,), "relu", {'bw': True}),
    "ImageMLP_FashionMnist_Relu128x128": ("fashion_mnist", 128, 28, (128, 128), "relu", {}),
    "ImageMLP_FashionMnist8_Relu32": ("fashion_mnist", 128, 8, (32,), "relu", {}),
    "ImageMLP_FashionMnist16_Relu32": ("fashion_mnist", 128, 16, (32,), "relu", {}),
    "ImageMLP_FashionMnist32_Relu32": ("fashion_mnist", 128, 32, (32,), "relu", {}),
    "ImageMLP_Cifar10_8_Relu32": ("cifar10", 128, 8, (32,), "relu", {}),
    "ImageMLP_Imagenet16_Relu256x256x256": ("imagenet16", 128, 16, (256, 256, 256), "relu", {}),
    "ImageMLP_Cifar10_128x128x128_Relu": ("cifar10", 128, 32, (128, 128, 128), "relu", {}),
    "ImageMLP_Cifar100_128x128x128_Relu": ("cifar100", 128, 32, (128, 128, 128), "relu", {}),
    "ImageMLP_Cifar10_128x128x128_Tanh_bs64": ("cifar10", 64, 32, (128, 128, 128), "tanh", {}),
    "ImageMLP_Cifar10_128x128x128_Tanh_bs128": ("cifar10", 128, 32, (128, 128, 128), "tanh", {}),
    "ImageMLP_Cifar10_128x128x128_Tanh_bs256": ("cifar10", 256, 32, (128, 128, 128), "tanh", {}),
    "ImageMLP_Mnist_128x128x128_Relu": ("mnist", 128, 28, (128, 128, 128), "relu", {}),
    "ImageMLP_Cifar10_256x256_Relu": ("cifar10", 128, 32, (256, 256), "relu", {}),
    "ImageMLP_Cifar10_256x256_Relu_BS32": ("cifar10", 32, 32, (256, 256), "relu", {}),
    "ImageMLP_Cifar10_1024x1024_Relu": ("cifar10", 128, 32, (1024, 1024), "relu", {}),
    "ImageMLP_Cifar10_4096x4096_Relu": ("cifar10", 128, 32, (4096, 4096), "relu", {}),
    "ImageMLP_Cifar10_8192x8192_Relu": ("cifar10", 128, 32, (8192, 8192), "relu", {}),
    "ImageMLP_Cifar10_16384x16384_Relu": ("cifar10", 128, 32, (16384, 16384), "relu", {}),
    "ImageMLP_Cifar10_128x128x128_Relu_MSE": ("cifar10", 128, 32, (128, 128, 128), "relu", {'mse': True}),
    "ImageMLP_Cifar10_128x128_Dropout05_Relu_MSE": ("cifar10", 128, 32, (128, 128), "relu", {'mse': True, 'dropout_rate': 0.5}),
    "ImageMLP_Cifar10_128x128_Dropout08_Relu_MSE": ("cifar10", 128, 32, (128, 128), "relu", {'mse': True, 'dropout_rate': 0.8}),
    "ImageMLP_Cifar10_128x128_Dropout02_Relu_MSE": ("cifar10", 128, 32, (128, 128), "relu", {'mse': True, 'dropout_rate': 0.2}),
    "ImageMLP_Cifar10_128x128x128_LayerNorm_Relu": ("cifar10", 128, 32, (128, 128, 128), "relu", {'norm': 'layer_norm'}),
    "ImageMLP_Cifar10_128x128x128_LayerNorm_Tanh": ("cifar10", 128, 32, (128, 128, 128), "tanh", {'norm': 'layer_norm'}),
    "ImageMLP_Cifar10_128x128x128_BatchNorm_Relu": ("cifar10", 128, 32, (128, 128, 128), "relu", {'norm': 'batch_norm'}),
    "ImageMLP_Cifar10_128x128x128_BatchNorm_Tanh": ("cifar10", 128, 32, (128, 128, 128), "tanh", {'norm': 'batch_norm'}),
}

__all__ = list(TASKS) + ["Params", "ModelState", "PRNGKey", "TASKS", "build", "image_datasets"]


class _MLPImageTask(base.Task):
  """The reference's MLP image task, the base research code subclasses to define new MLP tasks: ``flatten ->
  [Linear -> dropout -> act_fn] * len(hidden_sizes) -> Linear(K)`` (metafam's `mlp_forward`) on
  ``datasets`` (``K = datasets.extra_info["num_classes"]``), mean softmax cross-entropy on ``batch["label"]``.

  Like the reference it defines ``init`` and ``loss`` (every other loss variant is derived from ``loss``, so a
  subclass that overrides ``loss`` changes what is trained) and the reference's normalizer. The loss key drives
  dropout when ``dropout_rate > 0``.
  """

  def __init__(self, datasets: Any, hidden_sizes: Sequence[int], act_fn: Callable[[jax.Array], jax.Array] = jax.nn.relu,
               dropout_rate: float = 0.0):
    super().__init__()
    if not callable(act_fn):
      raise TypeError(f"act_fn must be a callable activation (e.g. jax.nn.relu), got {act_fn!r}.")
    self.datasets = datasets
    self._dropout = float(dropout_rate) > 0
    self._mod = mlp_forward(tuple(int(h) for h in hidden_sizes), int(datasets.extra_info["num_classes"]), [act_fn],
                            dropout_rate=dropout_rate)

  def init(self, key: PRNGKey) -> Params:
    image = self.datasets.abstract_batch["image"]
    return self._mod.init(key, jnp.ones(image.shape, image.dtype))

  def loss(self, params: Params, key: PRNGKey, data: Any) -> jax.Array:
    logits = self._mod.apply(params, data["image"], dropout_key=key if self._dropout else None)
    return cross_entropy_and_accuracy(logits, data["label"])[0]

  def normalizer(self, loss: jax.Array) -> jax.Array:
    return cross_entropy_normalizer(loss, int(self.datasets.extra_info["num_classes"]))


def image_datasets(dataset: str, batch_size: int, side: int, black_and_white: bool = False):
  """The reference's dataset function ``{dataset}_datasets`` at ``side x side`` (lazy for unavailable data)."""
  if dataset.startswith("imagenet"):
    return getattr(image, f"{dataset}_datasets")(batch_size)
  kwargs = {"convert_to_black_and_white": True} if black_and_white else {}
  return getattr(image, f"{dataset}_datasets")(batch_size, image_size=(side, side), **kwargs)


def build(name: str) -> ImageClassifier:
  """The task ``name`` of ``TASKS``."""
  dataset, batch_size, side, hidden, activation, options = TASKS[name]
  datasets = image_datasets(dataset, batch_size, side, options.get("bw", False))
  num_classes = datasets.extra_info["num_classes"]
  dropout_rate = options.get("dropout_rate", 0.0)
  net = mlp_forward(hidden, num_classes, [activation_by_name(activation)], norm=options.get("norm"),
                    dropout_rate=dropout_rate)
  return ImageClassifier(net, datasets, name, mse=options.get("mse", False), dropout=dropout_rate > 0)


globals().update(named_task_functions(TASKS, build))


class _MLPImageTaskMSE(_MLPImageTask):
  """`_MLPImageTask` with the mean squared error between the logits and the one-hot labels; normalizer ``10 *
  min(loss, 1)`` (non-finite -> 10), as the reference."""

  def loss(self, params: Params, key: PRNGKey, data: Any) -> jax.Array:
    logits = self._mod.apply(params, data["image"], dropout_key=key if self._dropout else None)
    labels = jax.nn.one_hot(data["label"], int(self.datasets.extra_info["num_classes"]))
    return jnp.mean(jnp.square(logits - labels))

  def normalizer(self, loss: jax.Array) -> jax.Array:
    return 10.0 * jnp.minimum(jnp.nan_to_num(loss, nan=1.0, posinf=1.0, neginf=1.0), 1.0)


class _MLPImageTaskNorm(base.Task):
  """The reference's MLP image task with a norm after every hidden Linear (``norm_type`` "layer_norm" or
  "batch_norm", training-mode statistics; `mlp_forward`): ``init_with_state`` / ``loss_with_state`` (mean softmax
  cross-entropy), the model state is haiku's (``{}`` for layer norm, the batch-norm averages otherwise)."""

  def __init__(self, datasets: Any, hidden_sizes: Sequence[int], norm_type: str,
               act_fn: Callable[[jax.Array], jax.Array] = jax.nn.relu):
    super().__init__()
    if norm_type not in ("layer_norm", "batch_norm"):
      raise ValueError(f"No norm {norm_type} implemented! norm_type must be 'layer_norm' or 'batch_norm'.")
    self.datasets = datasets
    self._stateful = norm_type == "batch_norm"
    self._mod = mlp_forward(tuple(int(h) for h in hidden_sizes), int(datasets.extra_info["num_classes"]), [act_fn],
                            norm=norm_type)

  def init_with_state(self, key: PRNGKey):
    image = self.datasets.abstract_batch["image"]
    out = self._mod.init(key, jnp.ones(image.shape, image.dtype))
    return out if self._stateful else (out, {})

  def loss_with_state(self, params: Params, state: ModelState, key: PRNGKey, data: Any):
    if self._stateful:
      logits, state = self._mod.apply(params, state, data["image"])
    else:
      logits = self._mod.apply(params, data["image"])
    return cross_entropy_and_accuracy(logits, data["label"])[0], state

  def normalizer(self, loss: jax.Array) -> jax.Array:
    return cross_entropy_normalizer(loss, int(self.datasets.extra_info["num_classes"]))
