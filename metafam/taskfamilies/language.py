"""Families of character language models (LSTM, transformer): fixed architecture; sampled init scale, embedding
scale, label smoothing and (transformer) MLP activation."""

from __future__ import annotations

from typing import Optional, Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.datasets.base import Datasets
from metafam.datasets.text import shakespeare_char_datasets
from metafam.taskfamilies._sampling import (Range, SampledInstance, check_activations, check_range, log_uniform,
                                            uniform)
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks._nn import ACTIVATIONS
from metafam.tasks.language import lstm_lm_forward, token_cross_entropy_and_accuracy, transformer_lm_forward


class _LanguageModelInstance(SampledInstance):

  input_key = "obs"

  def loss_and_aux(self, params, key, batch):
    logits = self.family.net.apply(params, batch["obs"], **self.family.forward_kwargs(self.cfg))
    loss, accuracy = token_cross_entropy_and_accuracy(logits, batch["target"], self.cfg["label_smoothing"])
    return loss, {"accuracy": accuracy}

  def normalizer(self, loss):
    return loss / jnp.log(self.family.vocab_size)


class _LanguageModelFamily(TaskFamily):
  """Shared config leaves of the LM families:

  * ``init_scale``: f32, multiplies every initial dense (and LSTM) weight matrix; log-uniform in
    ``init_scale_range``,
  * ``embed_scale``: f32, multiplies the token embeddings in the forward pass (input scale); log-uniform in
    ``embed_scale_range``,
  * ``label_smoothing``: f32 in ``label_smoothing_range`` (set it to 0 for a clean evaluation loss).

  Initial params come from `metafam.taskfamilies.conv.init_from_one_draw` (haiku's default distributions, one
  random op per instance).
  """

  net: hk.Transformed

  def __init__(self, datasets: Optional[Datasets], batch_size: int, sequence_length: int, init_scale_range: Range,
               embed_scale_range: Range, label_smoothing_range: Range):
    super().__init__()
    self.init_scale_range = check_range("init_scale_range", init_scale_range, positive=True)
    self.embed_scale_range = check_range("embed_scale_range", embed_scale_range, positive=True)
    self.label_smoothing_range = check_range("label_smoothing_range", label_smoothing_range, 0.0, 1.0)
    self.datasets = datasets if datasets is not None else shakespeare_char_datasets(batch_size, sequence_length)
    if "vocab_size" not in self.datasets.extra_info:
      raise ValueError("language-model datasets must give extra_info['vocab_size'].")
    self.vocab_size = int(self.datasets.extra_info["vocab_size"])
    self.sequence_length = int(self.datasets.abstract_batch["obs"].shape[1])

  def sample(self, key):
    k = jax.random.split(key, 3)
    return {"init_scale": log_uniform(k[0], self.init_scale_range),
            "embed_scale": log_uniform(k[1], self.embed_scale_range),
            "label_smoothing": uniform(k[2], self.label_smoothing_range)}

  def forward_kwargs(self, cfg) -> dict:
    return {"embed_scale": cfg["embed_scale"]}

  def task_fn(self, cfg):
    return _LanguageModelInstance(self, cfg)


class LSTMLanguageModelFamily(_LanguageModelFamily):
  """Character LSTM LMs (`metafam.tasks.language.lstm_lm_forward`, sizes fixed per family); config leaves
  ``init_scale``, ``embed_scale``, ``label_smoothing`` (see `_LanguageModelFamily`)."""

  def __init__(self, hidden_size: int = 32, embed_size: int = 16, batch_size: int = 32, sequence_length: int = 32,
               init_scale_range: Range = (0.5, 2.0), embed_scale_range: Range = (0.5, 2.0),
               label_smoothing_range: Range = (0.0, 0.1), datasets: Optional[Datasets] = None):
    super().__init__(datasets, batch_size, sequence_length, init_scale_range, embed_scale_range,
                     label_smoothing_range)
    self.hidden_size, self.embed_size = int(hidden_size), int(embed_size)
    self.net = lstm_lm_forward(self.vocab_size, self.embed_size, self.hidden_size)
    self.name = f"LSTMLanguageModelFamily_{self.hidden_size}_T{self.sequence_length}"


class TransformerLanguageModelFamily(_LanguageModelFamily):
  """Character transformer LMs (`metafam.tasks.language.transformer_lm_forward`, sizes fixed per family); config
  leaves ``init_scale``, ``embed_scale``, ``label_smoothing`` and ``activation`` (int32 index into ``activations``
  for the MLP blocks, dispatched with `jax.lax.switch`)."""

  def __init__(self, num_layers: int = 1, model_size: int = 32, num_heads: int = 2, mlp_size: Optional[int] = None,
               batch_size: int = 32, sequence_length: int = 32,
               activations: Sequence[str] = ("gelu", "relu", "swish", "tanh"),
               init_scale_range: Range = (0.5, 2.0), embed_scale_range: Range = (0.5, 2.0),
               label_smoothing_range: Range = (0.0, 0.1), datasets: Optional[Datasets] = None):
    super().__init__(datasets, batch_size, sequence_length, init_scale_range, embed_scale_range,
                     label_smoothing_range)
    self.activations = check_activations(activations)
    self.num_layers, self.model_size, self.num_heads = int(num_layers), int(model_size), int(num_heads)
    self.net = transformer_lm_forward(self.vocab_size, self.sequence_length, self.model_size, self.num_layers,
                                      self.num_heads, mlp_size, [ACTIVATIONS[a] for a in self.activations])
    self.name = f"TransformerLanguageModelFamily_{self.num_layers}x{self.model_size}_T{self.sequence_length}"

  def sample(self, key):
    k_act, k_rest = jax.random.split(key)
    return dict(super().sample(k_rest),
                activation=jax.random.randint(k_act, (), 0, len(self.activations), jnp.int32))

  def forward_kwargs(self, cfg) -> dict:
    return {"activation_index": cfg["activation"], "embed_scale": cfg["embed_scale"]}
