"""`learned_optimization.tasks.fixed.transformer_lm`: the reference's LM1B transformer language models.

Each task runs `tasks.transformer.Transformer` on ``{"obs", "target"}`` batches of the LM1B 32k-token data
(`tasks.datasets.language.lm1b_32k_datasets`, V = 32,100) with the cross-entropy averaged over non-padding tokens
(``obs != 0``) and dropout keyed by the loss key. LM1B is not available offline: the tasks build and initialize,
and raise `DatasetUnavailableError` when a batch is requested. ``TASKS`` maps each name to its configuration.
"""

from __future__ import annotations

from typing import Any, Mapping

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.datasets import language
from metafam.compat.learned_optimization.tasks.transformer import Transformer

_RUNTIME = [(5, 20, 1, 4, 8, 0.1), (6, 24, 1, 4, 8, 0.1), (4, 32, 2, 8, 8, 0.0), (4, 32, 1, 8, 16, 0.0),
            (4, 32, 2, 16, 4, 0.0), (4, 32, 1, 8, 32, 0.0), (5, 80, 1, 4, 64, 0.0), (7, 112, 3, 16, 32, 0.0),
            (4, 128, 1, 64, 32, 0.0), (4, 256, 2, 64, 64, 0.0), (4, 256, 3, 128, 64, 0.0),
            (19, 304, 2, 256, 32, 0.0)]
_KEYS = ("num_heads", "d_model", "num_layers", "batch_size", "sequence_length", "dropout_rate")
TASKS = {f"TransformerLM_LM1B_MultiRuntime_{i}": dict(zip(_KEYS, c)) for i, c in enumerate(_RUNTIME)}
TASKS.update({f"TransformerLM_LM1B_5layer_{d}width": dict(zip(_KEYS, (8, d, 5, 32, 128, 0.1)))
              for d in (32, 128, 256, 512)})

__all__ = list(TASKS) + ["TASKS", "build"]


class _TransformerTask(base.Task):

  def __init__(self, cfg: Mapping[str, Any], name: str = "__TransformerTask"):
    super().__init__()
    self.datasets = language.lm1b_32k_datasets(cfg["batch_size"], cfg["sequence_length"])
    self._cfg, self.name = dict(cfg), name
    vocab = self.datasets.extra_info["vocab_size"]

    def forward(batch):
      model = Transformer(cfg["num_heads"], cfg["num_layers"], cfg["d_model"], vocab, cfg["dropout_rate"])
      mask = batch["obs"] != 0
      logits = model(batch["obs"], mask=mask, is_training=True)
      nll = base.softmax_cross_entropy(logits=logits, labels=jax.nn.one_hot(batch["target"], vocab))
      return jnp.sum(nll * mask) / jnp.sum(mask)

    self._net = hk.transform(forward)

  def init(self, key):
    return self._net.init(key, jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), self.datasets.abstract_batch))

  def loss(self, params, key, data):
    return self._net.apply(params, key, data)


def build(name: str) -> base.Task:
  """The task ``name`` of ``TASKS``."""
  return _TransformerTask(TASKS[name], name=name)


def _task_fn(name: str):
  def task():
    return build(name)
  task.__name__ = task.__qualname__ = name
  task.__doc__ = f"The reference's ``{name}`` (configuration ``TASKS[{name!r}]``)."
  return task


for _name in TASKS:
  globals()[_name] = _task_fn(_name)
del _name
