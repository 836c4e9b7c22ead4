"""`learned_optimization.tasks.fixed.rnn_lm`: the reference's teacher-forced RNN language models.

`TeacherForcedRNNLM` runs metafam's `metafam.tasks.language.rnn_lm_forward` (embedding -> any haiku RNN core with
a learned initial state -> Linear(V)) with the per-token cross-entropy averaged over non-padding tokens (``obs !=
0``), as the reference. Parameters: ``V*E + core + (H + 1)*V`` plus the initial-state leaves (an LSTM: ``4*H*(E +
H) + 4*H`` and ``2*H``). The registered tasks use LM1B / Wikipedia (`tasks.datasets.language`), which metafam does
not have: they build and initialize, and raise `DatasetUnavailableError` when a batch is requested. ``TASKS`` maps
each name to ``(dataset function, batch size, sequence length, core, hidden size, embedding size)``; ``cfgs`` lists
the same tuples.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import haiku as hk
import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization.tasks import base
from metafam.compat.learned_optimization.tasks.datasets import language
from metafam.datasets.base import Datasets
from metafam.tasks.language import IRNN, rnn_lm_forward
from metafam.compat.learned_optimization.tasks.fixed._named import named_task_functions

Params = base.Params
ModelState = base.ModelState
PRNGKey = base.PRNGKey

CORES = {"IRNN": IRNN, "LSTM": hk.LSTM, "GRU": hk.GRU, "VanillaRNN": hk.VanillaRNN}

cfgs = [
    ("lm1b_bytes", 128, 32, "IRNN", 128, 64), ("lm1b_bytes", 128, 32, "LSTM", 128, 64),
    ("lm1b_bytes", 128, 32, "GRU", 128, 64), ("lm1b_bytes", 128, 32, "VanillaRNN", 128, 64),
    ("lm1b_bytes", 128, 128, "LSTM", 128, 64),
    ("lm1b_bytes", 128, 32, "LSTM", 256, 128), ("lm1b_bytes", 128, 32, "GRU", 256, 128),
    ("lm1b_32k", 128, 32, "VanillaRNN", 256, 128), ("lm1b_32k", 128, 32, "LSTM", 256, 128),
    ("lm1b_32k", 128, 32, "IRNN", 256, 128),
    ("wikipedia_en_32k", 128, 32, "LSTM", 256, 128), ("wikipedia_en_32k", 128, 32, "GRU", 256, 128),
    ("wikipedia_en_bytes", 128, 32, "LSTM", 256, 128), ("wikipedia_en_bytes", 128, 32, "GRU", 256, 128),
]
TASKS = {f"RNNLM_{d.replace('_', '')}_Patch{t}_{core}{h}_Embed{e}": (d, b, t, core, h, e)
         for d, b, t, core, h, e in cfgs}

__all__ = list(TASKS) + ["Params", "ModelState", "PRNGKey", "TeacherForcedRNNLM", "cfgs", "softmax_cross_entropy",
                         "TASKS", "build", "fold_ids"]


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-position ``-log softmax(logits)[label]`` for integer ``labels``."""
  return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1)[..., 0]


def fold_ids(ids: jax.Array, vocab_size: int, max_vocab: int) -> jax.Array:
  """Token ids of a ``max_vocab`` dataset mapped into ``[0, vocab_size)``: ids ``>= vocab_size`` become ``1 + id %
  (vocab_size - 1)`` (never the padding id 0); unchanged when ``vocab_size >= max_vocab``."""
  if vocab_size >= max_vocab:
    return ids
  return jnp.where(ids >= vocab_size, 1 + ids % (vocab_size - 1), ids)


class TeacherForcedRNNLM(base.Task):
  """An RNN LM on ``{"obs", "target"}`` batches; ``rnn_core_fn()`` builds the core inside the haiku function.

  ``vocab_size`` None uses the datasets' ``extra_info["vocab_size"]``; a smaller one folds larger ids into
  ``1 + id % (vocab_size - 1)`` (observations and targets). ``w_init`` initializes the embedding and output weights.
  """

  def __init__(self, rnn_core_fn: Callable[[], hk.RNNCore], embedding_dim: int, vocab_size: Optional[int],
               datasets: Datasets, w_init=None):
    super().__init__()
    self.datasets = datasets
    self._max_vocab = int(datasets.extra_info["vocab_size"])
    self._vocab_size = self._max_vocab if vocab_size is None else int(vocab_size)
    self.net = rnn_lm_forward(self._vocab_size, int(embedding_dim), rnn_core_fn, learned_initial_state=True,
                              w_init=w_init)

  def init(self, key: PRNGKey) -> Params:
    obs = self.datasets.abstract_batch["obs"]
    return self.net.init(key, jnp.ones(obs.shape, obs.dtype))

  def _fold(self, ids):
    return fold_ids(ids, self._vocab_size, self._max_vocab)

  def loss(self, params: Params, key: PRNGKey, data: Any) -> jax.Array:
    mask = (data["obs"] != 0).astype(jnp.float32)
    logits = self.net.apply(params, self._fold(data["obs"]))
    per_token = softmax_cross_entropy(logits, self._fold(data["target"]))
    return jnp.sum(per_token * mask) / jnp.sum(mask)


def build(name: str) -> TeacherForcedRNNLM:
  """The task ``name`` of ``TASKS``."""
  dataset, batch_size, length, core, hidden, embed = TASKS[name]
  datasets = getattr(language, f"{dataset}_datasets")(batch_size, length)
  task = TeacherForcedRNNLM(lambda: CORES[core](hidden), embed, None, datasets)
  task.name = name
  return task


def _delay_fn(klass: Callable, *args: Any):
  """``(partial(klass, *args), klass.__name__, args)``: a core constructor and its description."""
  return functools.partial(klass, *args), klass.__name__, args


def _delay(klass: Callable, *args: Any):
  """``(klass(*args), klass.__name__, args)``."""
  return klass(*args), klass.__name__, args


def _partial(rnn_fn: Callable, embedding_dim: int, vocab_size: Optional[int], datasets: Callable[[], Datasets]):
  """A zero-argument constructor of ``TeacherForcedRNNLM(rnn_fn, embedding_dim, vocab_size, datasets())``."""
  def task():
    return TeacherForcedRNNLM(rnn_fn, embedding_dim=embedding_dim, vocab_size=vocab_size, datasets=datasets())
  return task


globals().update(named_task_functions(TASKS, build))
