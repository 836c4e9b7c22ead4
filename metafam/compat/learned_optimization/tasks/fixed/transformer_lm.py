"""`learned_optimization.tasks.fixed.transformer_lm`: the reference's LM1B transformer language models.

Each task runs `tasks.transformer.Transformer` on ``{"obs", "target"}`` batches of the LM1B 32k-token data
(`tasks.datasets.language.lm1b_32k_datasets`, V = 32,100) with the cross-entropy averaged over non-padding tokens
(``obs != 0``) and dropout keyed by the loss key. LM1B is not available offline: the tasks build and initialize,
and raise `DatasetUnavailableError` when a batch is requested. ``TASKS`` maps each name to its configuration.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.datasets import language
from metafam.compat.learned_optimization.tasks.fixed.rnn_lm import fold_ids
from metafam.compat.learned_optimization.tasks.transformer import Transformer
from metafam.datasets.base import Datasets
from metafam.compat.learned_optimization.tasks.fixed._named import named_task_functions

_RUNTIME = [(5, 20, 1, 4, 8, 0.1), (6, 24, 1, 4, 8, 0.1), (4, 32, 2, 8, 8, 0.0), (4, 32, 1, 8, 16, 0.0),
            (4, 32, 2, 16, 4, 0.0), (4, 32, 1, 8, 32, 0.0), (5, 80, 1, 4, 64, 0.0), (7, 112, 3, 16, 32, 0.0),
            (4, 128, 1, 64, 32, 0.0), (4, 256, 2, 64, 64, 0.0), (4, 256, 3, 128, 64, 0.0),
            (19, 304, 2, 256, 32, 0.0)]
_KEYS = ("num_heads", "d_model", "num_layers", "batch_size", "sequence_length", "dropout_rate")
TASKS = {f"TransformerLM_LM1B_MultiRuntime_{i}": dict(zip(_KEYS, c)) for i, c in enumerate(_RUNTIME)}
TASKS.update({f"TransformerLM_LM1B_5layer_{d}width": dict(zip(_KEYS, (8, d, 5, 32, 128, 0.1)))
              for d in (32, 128, 256, 512)})

__all__ = list(TASKS) + ["TASKS", "build", "TransformerLMTask"]


class TransformerLMTask(base.Task):
  """`tasks.transformer.Transformer` on ``datasets`` (``{"obs", "target"}``), the cross-entropy averaged over
  non-padding tokens (``obs != 0``); ``vocab_size`` smaller than the data's folds larger ids (`fold_ids`)."""

  def __init__(self, datasets: Datasets, num_heads: int, num_layers: int, d_model: int, dropout_rate: float,
               vocab_size: Optional[int] = None, name: str = "TransformerLMTask"):
    super().__init__()
    self.datasets, self.name = datasets, name
    max_vocab = int(datasets.extra_info["vocab_size"])
    vocab = max_vocab if vocab_size is None else int(vocab_size)
    self.vocab_size = vocab

    def forward(batch):
      obs, target = fold_ids(batch["obs"], vocab, max_vocab), fold_ids(batch["target"], vocab, max_vocab)
      model = Transformer(num_heads, num_layers, d_model, vocab, dropout_rate)
      mask = obs != 0
      logits = model(obs, mask=mask, is_training=True)
      nll = base.softmax_cross_entropy(logits=logits, labels=jax.nn.one_hot(target, vocab))
      return jnp.sum(nll * mask) / jnp.sum(mask)

    self._net = hk.transform(forward)

  def init(self, key):
    return self._net.init(key, jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), self.datasets.abstract_batch))

  def loss(self, params, key, data):
    return self._net.apply(params, key, data)


class _TransformerTask(TransformerLMTask):

  def __init__(self, cfg: Mapping[str, Any], name: str = "__TransformerTask"):
    super().__init__(language.lm1b_32k_datasets(cfg["batch_size"], cfg["sequence_length"]), cfg["num_heads"],
                     cfg["num_layers"], cfg["d_model"], cfg["dropout_rate"], name=name)
    self._cfg = dict(cfg)


def build(name: str) -> base.Task:
  """The task ``name`` of ``TASKS``."""
  return _TransformerTask(TASKS[name], name=name)


globals().update(named_task_functions(TASKS, build))
