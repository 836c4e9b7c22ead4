"""`learned_optimization.tasks.parametric.lm_rnn`: the reference's parametric RNN language-model family.

`ParametricLMRNN` samples per instance a weight initializer (`SampleInitializer`, vmappable) for the embedding and
output layers of `tasks.fixed.rnn_lm.TeacherForcedRNNLM` (metafam's `rnn_lm_forward` with a learned initial state;
loss over non-padding tokens, larger ids folded into ``vocab_size``), with the parametric normalizer.
`sample_lm_rnn` draws a family configuration over the LM1B / Wikipedia datasets (unavailable offline: batches
raise `DatasetUnavailableError`). ``lstm_fn``, ``gru_fn``, ``vanilla_rnn_fn`` and ``irnn_fn`` return the core
classes their names say (the reference returns ``hk.LSTM`` for the GRU and vanilla RNN names).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import haiku as hk
import jax

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.fixed.rnn_lm import TeacherForcedRNNLM
from metafam.compat.learned_optimization.tasks.parametric import cfgobject, parametric_utils as pu
from metafam.compat.learned_optimization.tasks.parametric.image_mlp import image_classification_normalizer
from metafam.datasets.base import Datasets
from metafam.tasks.language import IRNN

Batch = Any
Params = Any
ModelState = Any
PRNGKey = jax.Array

__all__ = ["Batch", "Params", "ModelState", "PRNGKey", "ParametricLMRNN", "lstm_fn", "vanilla_rnn_fn", "gru_fn",
           "irnn_fn", "sample_lm_rnn", "timed_sample_lm_rnn"]


class _SampledLM(TeacherForcedRNNLM):

  def normalizer(self, loss):
    return image_classification_normalizer(loss, self._vocab_size)


class ParametricLMRNN(base.TaskFamily):
  """RNN LMs with ``rnn_core_fn(rnn_size)`` cores and ``embed_size`` embeddings on ``datasets``."""

  def __init__(self, datasets: Datasets, rnn_size: int, embed_size: int, rnn_core_fn: Callable[[int], hk.RNNCore],
               vocab_size: Optional[int] = None):
    super().__init__()
    self.datasets, self.rnn_size, self.embed_size = datasets, int(rnn_size), int(embed_size)
    self.rnn_core_fn, self.vocab_size = rnn_core_fn, vocab_size

  def sample(self, key: PRNGKey) -> cfgobject.CFGNamed:
    return cfgobject.CFGNamed("ParametricLMRNN", {"initializer": pu.SampleInitializer.sample(key)})

  def task_fn(self, task_params: cfgobject.CFGNamed) -> base.Task:
    w_init = pu.SampleInitializer.get_dynamic(task_params.values["initializer"])
    return _SampledLM(lambda: self.rnn_core_fn(self.rnn_size), self.embed_size, self.vocab_size, self.datasets,
                      w_init=w_init)


def lstm_fn():
  """``hk.LSTM``."""
  return hk.LSTM


def vanilla_rnn_fn():
  """``hk.VanillaRNN``."""
  return hk.VanillaRNN


def gru_fn():
  """``hk.GRU``."""
  return hk.GRU


def irnn_fn():
  """`IRNN`."""
  return IRNN


def sample_lm_rnn(key: PRNGKey) -> cfgobject.CFGObject:
  """A `ParametricLMRNN` configuration: log-uniform RNN and embedding sizes in [8, 256), batch in [4, 512),
  sequence length in [4, 512), vocabulary in [100, 10000); an LM1B / Wikipedia dataset; an LSTM, vanilla or GRU
  core."""
  k = jax.random.split(key, 8)
  names = ["lm1b_32k_datasets", "lm1b_bytes_datasets", "wikipedia_en_32k_datasets", "wikipedia_en_bytes_datasets"]
  lf = cfgobject.LogFeature
  dataset = cfgobject.CFGObject(pu.choice(k[4], names), {"sequence_length": lf(pu.log_int(k[3], 4, 512)),
                                                         "batch_size": lf(pu.log_int(k[2], 4, 512))})
  return cfgobject.CFGObject("ParametricLMRNN", {
      "vocab_size": lf(pu.log_int(k[5], 100, 10000)), "rnn_size": lf(pu.log_int(k[0], 8, 256)),
      "embed_size": lf(pu.log_int(k[1], 8, 256)), "datasets": dataset,
      "rnn_core_fn": cfgobject.CFGObject(pu.choice(k[6], ["lstm_fn", "vanilla_rnn_fn", "gru_fn"]), {})})


def timed_sample_lm_rnn(key: PRNGKey, max_time=1e-4):
  """Not available offline (the reference's learned runtime model); raises NotImplementedError."""
  pu.timed_sampler_unavailable("timed_sample_lm_rnn", "sample_lm_rnn")
