"""`learned_optimization.tasks.datasets.image`: the reference's image dataset functions, offline.

Each function has the reference's signature and returns batches ``{"image": f32[B, H, W, C], "label": i32[B]}``
with the reference's ``abstract_batch``, built by
`metafam.compat.learned_optimization.tasks.datasets.base.image_classification_datasets`:

  * ``fashion_mnist_datasets``: metafam's Fashion-MNIST at any square size (the embedded slice, or the full set
    when ``$METAFAM_FASHION_MNIST_DIR`` or ``/usr/share/datasets/fashion-mnist`` holds it).
  * ``mnist_datasets``, ``cifar10_datasets``: read from local files (``$METAFAM_MNIST_DIR``,
    ``$METAFAM_CIFAR10_DIR``) when a batch is first requested.
  * CIFAR-100, SVHN, Food-101 and the resized ImageNets: no offline reader; requesting a batch raises
    `DatasetUnavailableError` saying how to supply the data.

``data_fraction`` (the reference's share of the training split) must be in (0, 1] and is otherwise unused:
metafam's splits are fixed. Results are memoized per arguments (by
`base.image_classification_datasets`).
"""

from __future__ import annotations

from typing import Tuple

from metafam.compat.learned_optimization.tasks.datasets import base

__all__ = ["mnist_datasets", "fashion_mnist_datasets", "cifar10_datasets", "cifar100_datasets",
           "svhn_cropped_datasets", "food101_datasets", "imagenet8_datasets", "imagenet16_datasets",
           "imagenet32_datasets", "imagenet64_datasets"]


def _check_fraction(data_fraction: float) -> None:
  if not isinstance(data_fraction, (int, float)) or not 0.0 < data_fraction <= 1.0:
    raise ValueError(f"data_fraction must be a number in (0, 1], got {data_fraction!r}.")


def mnist_datasets(batch_size: int, image_size: Tuple[int, int] = (28, 28), stack_channels: int = 1
                   ) -> base.Datasets:
  """MNIST digits from ``$METAFAM_MNIST_DIR`` (read on the first batch)."""
  return base.image_classification_datasets("mnist", batch_size, image_size, stack_channels)


def fashion_mnist_datasets(batch_size: int, image_size: Tuple[int, int] = (28, 28), stack_channels: int = 1,
                           prefetch_batches: int = 300) -> base.Datasets:
  """Fashion-MNIST served by metafam at ``image_size`` (square); ``prefetch_batches`` is unused."""
  del prefetch_batches
  return base.image_classification_datasets("fashion_mnist", batch_size, image_size, stack_channels)


def cifar10_datasets(batch_size: int, image_size: Tuple[int, int] = (32, 32), data_fraction: float = 1.,
                     **kwargs) -> base.Datasets:
  """CIFAR-10 from ``$METAFAM_CIFAR10_DIR`` (read on the first batch); ``kwargs`` as in
  `base.image_classification_datasets` (``normalize_mean``, ``normalize_std``, ``convert_to_black_and_white``)."""
  _check_fraction(data_fraction)
  return base.image_classification_datasets("cifar10", batch_size, image_size, **kwargs)


def cifar100_datasets(batch_size: int, image_size: Tuple[int, int] = (32, 32), data_fraction: float = 1.
                      ) -> base.Datasets:
  """CIFAR-100 (100 classes): no offline reader, batches raise `DatasetUnavailableError`."""
  _check_fraction(data_fraction)
  return base.image_classification_datasets("cifar100", batch_size, image_size)


def svhn_cropped_datasets(batch_size: int, image_size: Tuple[int, int] = (32, 32), data_fraction: float = 1.,
                          **kwargs) -> base.Datasets:
  """SVHN (cropped digits): no offline reader, batches raise `DatasetUnavailableError`."""
  _check_fraction(data_fraction)
  return base.image_classification_datasets("svhn_cropped", batch_size, image_size, **kwargs)


def food101_datasets(batch_size: int, image_size: Tuple[int, int] = (32, 32), data_fraction: float = 1.0,
                     **kwargs) -> base.Datasets:
  """Food-101 (101 classes): no offline reader, batches raise `DatasetUnavailableError`."""
  _check_fraction(data_fraction)
  return base.image_classification_datasets("food101", batch_size, image_size, **kwargs)


def _imagenet(side: int, batch_size: int, image_size: Tuple[int, int], kwargs: dict) -> base.Datasets:
  return base.image_classification_datasets(f"imagenet2012_{side}", batch_size, image_size, **kwargs)


def imagenet8_datasets(batch_size: int, image_size: Tuple[int, int] = (8, 8), **kwargs) -> base.Datasets:
  """ImageNet resized to 8x8 (1000 classes): no offline reader."""
  return _imagenet(8, batch_size, image_size, kwargs)


def imagenet16_datasets(batch_size: int, image_size: Tuple[int, int] = (16, 16), **kwargs) -> base.Datasets:
  """ImageNet resized to 16x16 (1000 classes): no offline reader."""
  return _imagenet(16, batch_size, image_size, kwargs)


def imagenet32_datasets(batch_size: int, image_size: Tuple[int, int] = (32, 32), **kwargs) -> base.Datasets:
  """ImageNet resized to 32x32 (1000 classes): no offline reader."""
  return _imagenet(32, batch_size, image_size, kwargs)


def imagenet64_datasets(batch_size: int, image_size: Tuple[int, int] = (64, 64), **kwargs) -> base.Datasets:
  """ImageNet resized to 64x64 (1000 classes): no offline reader."""
  return _imagenet(64, batch_size, image_size, kwargs)

