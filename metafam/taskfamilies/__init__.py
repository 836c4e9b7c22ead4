"""Task families: distributions over static-shape tasks, their wrappers, specs and the family registry."""

from metafam.taskfamilies.augmentations import (ClipGradientsFamily, FamilyWrapper, LossScaleFamily,
                                                LowPrecisionFamily, NoisyGradientsFamily, ReducedBatchSizeFamily,
                                                ReparamFamily)
from metafam.taskfamilies.autoencoder import AutoencoderFamily
from metafam.taskfamilies.base import FunctionFamily, TaskFamily, check_family, single_task_to_family
from metafam.taskfamilies.conv import ConvFamily
from metafam.taskfamilies.image_mlp import ImageMLPFamily
from metafam.taskfamilies.language import LSTMLanguageModelFamily, TransformerLanguageModelFamily
from metafam.taskfamilies.quadratic import NoisyQuadraticFamily, QuadraticFamily
from metafam.taskfamilies.registry import FAMILIES, get_family, list_families
from metafam.taskfamilies.spec import FamilyMixture, FamilySpec

__all__ = ["TaskFamily", "FunctionFamily", "check_family", "single_task_to_family", "FAMILIES", "get_family", "list_families",
           "AutoencoderFamily", "ConvFamily", "ImageMLPFamily", "LSTMLanguageModelFamily",
           "TransformerLanguageModelFamily", "NoisyQuadraticFamily", "QuadraticFamily", "FamilyMixture", "FamilySpec",
           "ClipGradientsFamily", "FamilyWrapper", "LossScaleFamily", "LowPrecisionFamily", "NoisyGradientsFamily",
           "ReducedBatchSizeFamily", "ReparamFamily"]
