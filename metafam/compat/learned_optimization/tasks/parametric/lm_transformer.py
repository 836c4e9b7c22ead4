"""`learned_optimization.tasks.parametric.lm_transformer`: the reference's parametric transformer-LM family.

`ParametricLMTransformer` has no per-instance randomness (its config is an empty `CFGNamed`); its task is
`tasks.fixed.transformer_lm.TransformerLMTask` (metafam's transformer blocks, loss over non-padding tokens, ids
folded into ``vocab_size``) with the parametric normalizer. `sample_lm_transformer` draws a family configuration
over the LM1B / Wikipedia datasets (unavailable offline: batches raise `DatasetUnavailableError`).
"""

from __future__ import annotations

from typing import Any, Optional

import jax

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.fixed.transformer_lm import TransformerLMTask
from metafam.compat.learned_optimization.tasks.parametric import cfgobject, parametric_utils as pu
from metafam.compat.learned_optimization.tasks.parametric.image_mlp import image_classification_normalizer
from metafam.datasets.base import Datasets

Batch = Any
Params = Any
ModelState = Any

__all__ = ["Batch", "Params", "ModelState", "ParametricLMTransformer", "sample_lm_transformer",
           "timed_sample_lm_transformer"]


class _SampledTransformer(TransformerLMTask):

  def normalizer(self, loss):
    return image_classification_normalizer(loss, self.vocab_size)


class ParametricLMTransformer(base.TaskFamily):
  """Transformer LMs of ``num_layers`` x ``d_model`` with ``num_heads`` 32-wide heads on ``datasets``."""

  def __init__(self, datasets: Datasets, vocab_size: Optional[int], num_heads: int, num_layers: int, d_model: int,
               dropout_rate: float = 0.1):
    super().__init__()
    self.datasets, self.vocab_size = datasets, vocab_size
    self.num_heads, self.num_layers, self.d_model = int(num_heads), int(num_layers), int(d_model)
    self.dropout_rate = float(dropout_rate)

  def sample(self, key: jax.Array) -> cfgobject.CFGNamed:
    return cfgobject.CFGNamed("ParametricLMTransformer", {})

  def task_fn(self, task_params: cfgobject.CFGNamed) -> base.Task:
    return _SampledTransformer(self.datasets, self.num_heads, self.num_layers, self.d_model, self.dropout_rate,
                               self.vocab_size, name="ParametricLMTransformer")


def sample_lm_transformer(key: jax.Array) -> cfgobject.CFGObject:
  """A `ParametricLMTransformer` configuration: log-uniform heads and width per head in [8, 128), layers in [1, 8),
  batch and sequence length in [4, 512), vocabulary in [100, 10000); an LM1B / Wikipedia dataset."""
  k = jax.random.split(key, 8)
  per_head, heads = pu.log_int(k[0], 8, 128), pu.log_int(k[1], 8, 128)
  names = ["lm1b_32k_datasets", "lm1b_bytes_datasets", "wikipedia_en_32k_datasets", "wikipedia_en_bytes_datasets"]
  lf = cfgobject.LogFeature
  dataset = cfgobject.CFGObject(pu.choice(k[6], names), {"sequence_length": lf(pu.log_int(k[5], 4, 512)),
                                                         "batch_size": lf(pu.log_int(k[4], 4, 512))})
  return cfgobject.CFGObject("ParametricLMTransformer", {
      "vocab_size": lf(pu.log_int(k[7], 100, 10000)), "d_model": lf(heads * per_head), "num_heads": lf(heads),
      "num_layers": lf(pu.log_int(k[3], 1, 8)), "datasets": dataset})


def timed_sample_lm_transformer(key: jax.Array, max_time: float = 1e-4):
  """Not available offline (the reference's learned runtime models); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_lm_transformer", "sample_lm_transformer")
