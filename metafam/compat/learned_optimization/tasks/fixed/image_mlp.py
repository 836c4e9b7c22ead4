"""`learned_optimization.tasks.fixed.image_mlp`: the reference's image-MLP task names metafam can serve offline.

Each name is a function returning metafam's `metafam.tasks.image_mlp.ImageMLPTask` (a haiku MLP with ReLU hidden
layers, softmax cross-entropy, batches ``{"image": f32[128, H, W, 1], "label": i32[128]}``) on the Fashion-MNIST
that ships inside metafam, at the reference's image size and batch size 128; the task's ``name`` is the reference
name. Only Fashion-MNIST tasks are here: the reference's CIFAR-10 / ImageNet / MNIST tasks read TensorFlow-Datasets,
which metafam does not download (`metafam.tasks.cifar10_conv_task(dir)` reads a local CIFAR-10 copy).
"""

from __future__ import annotations

from typing import Sequence

from metafam.tasks.image_mlp import ImageMLPTask

__all__ = ["ImageMLP_FashionMnist_Relu128x128", "ImageMLP_FashionMnist8_Relu32", "ImageMLP_FashionMnist16_Relu32",
           "ImageMLP_FashionMnist32_Relu32"]


def _fashion_mnist_mlp(name: str, hidden_sizes: Sequence[int], image_size: int) -> ImageMLPTask:
  return ImageMLPTask(tuple(hidden_sizes), activation="relu", image_size=image_size, batch_size=128, name=name)


def ImageMLP_FashionMnist_Relu128x128() -> ImageMLPTask:  # noqa: N802 -- the reference's name
  """28x28 Fashion-MNIST, hidden layers (128, 128) (metafam's ``fmnist_mlp_28x28_128x128``)."""
  return _fashion_mnist_mlp("ImageMLP_FashionMnist_Relu128x128", (128, 128), 28)


def ImageMLP_FashionMnist8_Relu32() -> ImageMLPTask:  # noqa: N802
  """8x8 Fashion-MNIST, one hidden layer of 32 (metafam's ``fmnist_mlp_8x8_32``)."""
  return _fashion_mnist_mlp("ImageMLP_FashionMnist8_Relu32", (32,), 8)


def ImageMLP_FashionMnist16_Relu32() -> ImageMLPTask:  # noqa: N802
  """16x16 Fashion-MNIST, one hidden layer of 32."""
  return _fashion_mnist_mlp("ImageMLP_FashionMnist16_Relu32", (32,), 16)


def ImageMLP_FashionMnist32_Relu32() -> ImageMLPTask:  # noqa: N802
  """32x32 Fashion-MNIST (upsampled), one hidden layer of 32."""
  return _fashion_mnist_mlp("ImageMLP_FashionMnist32_Relu32", (32,), 32)
