"""Named task families, family kinds and augmentations: plain dicts from name to a constructor.

* `FAMILIES`: registered families, each a zero-argument constructor (`get_family`, `list_families`).
* `FAMILY_KINDS`: family constructors by kind, taking keyword arguments (what `FamilySpec.kind` names).
* `AUGMENTATIONS`: family wrappers by name, taking the family and keyword arguments.

Constructors import their modules on first call, so listing names costs nothing. Unknown names raise
`metafam._registry.UnknownNameError` listing the valid ones.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Dict, List

from metafam._registry import lookup
from metafam.taskfamilies.base import TaskFamily, single_task_to_family


@dataclasses.dataclass(frozen=True)
class LazyConstructor:
  """Calls ``module.attr(*args, **kwargs)``, importing ``module`` only when called or inspected."""
  module: str
  attr: str

  def load(self) -> Callable:
    return getattr(importlib.import_module(self.module), self.attr)

  def __call__(self, *args, **kwargs):
    return self.load()(*args, **kwargs)


_PKG = "metafam.taskfamilies."


def _image_mlp_family(hidden_sizes, image_size):
  return lambda: LazyConstructor(_PKG + "image_mlp", "ImageMLPFamily")(hidden_sizes, image_size=image_size)


def _conv_family(channels, image_size):
  return lambda: LazyConstructor(_PKG + "conv", "ConvFamily")(channels, image_size=image_size)


def _autoencoder_family(hidden_sizes, image_size):
  return lambda: LazyConstructor(_PKG + "autoencoder", "AutoencoderFamily")(hidden_sizes, image_size=image_size)


def _lm_family(kind):
  return lambda: LazyConstructor(_PKG + "language", f"{kind}LanguageModelFamily")()


def _quadratic_family(noisy):
  if noisy:
    return lambda: LazyConstructor(_PKG + "quadratic", "NoisyQuadraticFamily")(10)
  return lambda: LazyConstructor(_PKG + "quadratic", "QuadraticFamily")(10, scale_range=(0.1, 10.0))


FAMILIES: Dict[str, Callable[[], TaskFamily]] = {
    "quadratic_family_10": _quadratic_family(noisy=False),
    "noisy_quadratic_family_10": _quadratic_family(noisy=True),
    "fmnist_mlp_family_8x8_32": _image_mlp_family((32,), 8),
    "fmnist_mlp_family_28x28_128x128": _image_mlp_family((128, 128), 28),
    "fmnist_conv_family_16x16_16x32": _conv_family((16, 32), 16),  # 5,130 params per instance
    "fmnist_ae_family_8x8_32x8x32": _autoencoder_family((32, 8, 32), 8),  # 4,744 params per instance
    "shakespeare_lstm_family_32": _lm_family("LSTM"),  # H = 32, E = 16, T = 32: 9,996 params per instance
    "shakespeare_transformer_family_1x32": _lm_family("Transformer"),  # 1 layer, d = 32, T = 32: 18,732 params
}


def get_family(name: str) -> TaskFamily:
  """Builds the registered task family ``name``."""
  return lookup(FAMILIES, name, "family")()


def list_families() -> List[str]:
  return sorted(FAMILIES)


def _registered_task_family(name: str) -> TaskFamily:
  """The registered task ``name`` (`metafam.tasks.get_task`) as a one-task family."""
  from metafam.tasks.registry import get_task
  return single_task_to_family(get_task(name))


FAMILY_KINDS: Dict[str, Callable[..., TaskFamily]] = {
    "quadratic": LazyConstructor(_PKG + "quadratic", "QuadraticFamily"),
    "noisy_quadratic": LazyConstructor(_PKG + "quadratic", "NoisyQuadraticFamily"),
    "image_mlp": LazyConstructor(_PKG + "image_mlp", "ImageMLPFamily"),
    "conv": LazyConstructor(_PKG + "conv", "ConvFamily"),
    "autoencoder": LazyConstructor(_PKG + "autoencoder", "AutoencoderFamily"),
    "lstm_lm": LazyConstructor(_PKG + "language", "LSTMLanguageModelFamily"),
    "transformer_lm": LazyConstructor(_PKG + "language", "TransformerLanguageModelFamily"),
    "task": _registered_task_family,
    "registered": get_family,
}

_AUG = _PKG + "augmentations"
AUGMENTATIONS: Dict[str, Callable[..., TaskFamily]] = {
    "reparam": LazyConstructor(_AUG, "ReparamFamily"),
    "loss_scale": LazyConstructor(_AUG, "LossScaleFamily"),
    "noisy_gradients": LazyConstructor(_AUG, "NoisyGradientsFamily"),
    "clip_gradients": LazyConstructor(_AUG, "ClipGradientsFamily"),
    "reduced_batch_size": LazyConstructor(_AUG, "ReducedBatchSizeFamily"),
    "low_precision": LazyConstructor(_AUG, "LowPrecisionFamily"),
}
