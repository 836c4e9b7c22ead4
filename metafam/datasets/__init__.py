"""Datasets: four seeded splits from your arrays or files, on-device sampling, embedded Fashion-MNIST and Shakespeare,
CIFAR-10 files."""

from metafam.datasets.arrays import datasets_from_arrays, datasets_from_directory, split_arrays
from metafam.datasets.base import SPLITS, ArraySplit, Datasets, DeviceData, check_batch, dataset_lru_cache
from metafam.datasets.cifar import cifar10_datasets, color_image_datasets, read_cifar10_dir
from metafam.datasets.idx import read_idx, write_idx
from metafam.datasets.images import (fashion_mnist_datasets, image_datasets, mnist_datasets,
                                     mnist_digits_datasets)
from metafam.datasets.text import shakespeare_char_datasets

__all__ = ["SPLITS", "ArraySplit", "Datasets", "DeviceData", "check_batch", "dataset_lru_cache", "datasets_from_arrays",
           "datasets_from_directory", "split_arrays", "read_idx",
           "write_idx", "fashion_mnist_datasets", "image_datasets", "mnist_datasets", "mnist_digits_datasets",
           "shakespeare_char_datasets", "cifar10_datasets", "color_image_datasets", "read_cifar10_dir"]
