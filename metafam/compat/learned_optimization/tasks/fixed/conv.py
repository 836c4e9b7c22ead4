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

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.fixed._classifier import ImageClassifier
from metafam.compat.learned_optimization.tasks.fixed.image_mlp import image_datasets
from metafam.tasks._nn import activation_by_name
from metafam.tasks.conv import conv_forward
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


def build(name: str) -> ImageClassifier:
  """The task ``name`` of ``TASKS``."""
  dataset, batch_size, side, channels, activation, norm = TASKS[name]
  datasets = image_datasets(dataset, batch_size, side)
  strides = (2,) + (1,) * (len(channels) - 1)
  net = conv_forward(channels, datasets.extra_info["num_classes"], [activation_by_name(activation)], 3, strides,
                     norm)
  return ImageClassifier(net, datasets, name)


globals().update(named_task_functions(TASKS, build))
