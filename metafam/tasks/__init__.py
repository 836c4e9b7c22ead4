"""Tasks: `Task`, adapters for plain functions and Equinox / Flax models, the built-in task models, their wrappers
and the registry of named tasks."""

from metafam.tasks.augmentations import (BF16Params, ClipGradients, GradientModifier, LossScale, LowPrecision,
                                         NoisyGradients, ReducedBatchSize, ReparamWeights, TaskWrapper)
from metafam.tasks.adapters import FunctionTask, ModelTask, equinox_task, linen_task, nnx_task
from metafam.tasks.autoencoder import MLPAutoencoderTask, VAETask
from metafam.tasks.base import Task, non_array_leaf
from metafam.tasks.conv import ConvTask, cifar10_conv_task
from metafam.tasks.image_mlp import ImageClassifierTask, ImageMLPTask
from metafam.tasks.language import LanguageModelTask, LSTMLanguageModelTask, TransformerLanguageModelTask
from metafam.tasks.quadratic import QuadraticTask
from metafam.tasks.registry import TASKS, get_task, list_tasks

__all__ = ["Task", "non_array_leaf", "FunctionTask", "ModelTask", "equinox_task", "nnx_task", "linen_task", "TASKS",
           "get_task", "list_tasks", "MLPAutoencoderTask", "VAETask", "ConvTask", "cifar10_conv_task", "ImageClassifierTask", "ImageMLPTask", "LanguageModelTask", "LSTMLanguageModelTask",
           "TransformerLanguageModelTask", "QuadraticTask", "BF16Params", "ClipGradients", "GradientModifier",
           "LossScale", "LowPrecision", "NoisyGradients", "ReducedBatchSize", "ReparamWeights", "TaskWrapper"]
