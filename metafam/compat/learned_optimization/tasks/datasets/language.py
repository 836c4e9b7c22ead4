"""`learned_optimization.tasks.datasets.language`: the reference's LM1B and Wikipedia datasets, offline.

metafam has neither corpus nor the T5 SentencePiece model, so these functions return `Datasets` with the
reference's ``abstract_batch`` (``{"obs": i32[B, T], "target": i32[B, T]}``) and ``extra_info["vocab_size"]``
(32,100 for the 32k SentencePiece vocabulary with its 100 extra ids; 259 for bytes: 256 values after the pad, eos
and unk ids), so tasks built on them initialize and run on any batch of that shape; requesting a batch raises
`DatasetUnavailableError` saying how to supply the data. metafam's own character corpus is
`metafam.datasets.text.shakespeare_char_datasets` (the reference names no Shakespeare dataset).
"""

from __future__ import annotations

from typing import Any, List, Sequence

import jax
import jax.numpy as jnp

from metafam._checks import check_positive_int
from metafam.compat.learned_optimization.tasks.datasets import base

__all__ = ["DEFAULT_SPM_PATH", "DEFAULT_EXTRA_IDS", "get_32k_sentence_piece_vocab", "get_bytes_vocab",
           "ByteVocabulary", "lm1b_32k_datasets", "lm1b_bytes_datasets", "wikipedia_en_32k_datasets",
           "wikipedia_en_bytes_datasets"]

DEFAULT_SPM_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
DEFAULT_EXTRA_IDS = 100
SENTENCE_PIECE_VOCAB_SIZE = 32000 + DEFAULT_EXTRA_IDS


class ByteVocabulary:
  """UTF-8 bytes as ids: 0 pad, 1 eos, 2 unk, byte ``b`` -> ``b + 3`` (``vocab_size`` 259), as seqio's."""

  num_special_tokens = 3
  vocab_size = 256 + num_special_tokens

  def encode(self, text: str) -> List[int]:
    return [b + self.num_special_tokens for b in text.encode("utf-8")]

  def decode(self, ids: Sequence[int]) -> str:
    data = bytes(int(i) - self.num_special_tokens for i in ids if self.num_special_tokens <= int(i) < self.vocab_size)
    return data.decode("utf-8", errors="ignore")


def get_bytes_vocab() -> ByteVocabulary:
  """The byte vocabulary (`ByteVocabulary`)."""
  return ByteVocabulary()


def get_32k_sentence_piece_vocab():
  """The reference's T5 SentencePiece vocabulary lives at `DEFAULT_SPM_PATH` (cloud storage): not available."""
  raise base.DatasetUnavailableError(f"the 32k SentencePiece vocabulary ({DEFAULT_SPM_PATH}) is not available "
                                     "offline in metafam; tokenize with your own copy and build a Datasets.")


_HOW = ("metafam has no {} corpus; tokenize a local copy into {{'obs', 'target'}} int32 windows, wrap them in "
        "metafam.datasets.ArraySplit / Datasets with the same abstract_batch and assign it to the task's "
        "`datasets` (metafam.datasets.text.shakespeare_char_datasets is the corpus metafam ships)")


def _crop_or_pad(value: Any, size: int, pad_token: int) -> Any:
  """The 1-d token array ``value`` cut to its first ``size`` tokens, or padded with ``pad_token`` up to ``size``."""
  value = jnp.asarray(value)
  if value.ndim != 1:
    raise ValueError(f"value must be a 1-d token array, got shape {value.shape}.")
  if value.shape[0] >= size:
    return value[:size]
  return jnp.pad(value, (0, size - value.shape[0]), constant_values=pad_token)


class _SentencePieceSize:
  """What is known offline of the reference's 32k SentencePiece vocabulary: its size (the model itself is not
  available, so ``encode`` / ``decode`` raise)."""

  vocab_size = SENTENCE_PIECE_VOCAB_SIZE

  def encode(self, text: str) -> List[int]:
    return get_32k_sentence_piece_vocab()

  def decode(self, ids: Sequence[int]) -> str:
    return get_32k_sentence_piece_vocab()


def _make_datasets(tfds_datasetname: str, vocab: Any, batch_size: int, sequence_length: int,
                   has_test: bool = True) -> base.Datasets:
  """The reference's language-model `Datasets` of TFDS dataset ``tfds_datasetname`` tokenized with ``vocab``:
  batches ``{"obs", "target": i32[batch_size, sequence_length]}`` and ``extra_info`` ``{"vocab_size", "vocab"}``.
  No TFDS corpus is available offline, so every split raises `DatasetUnavailableError` (naming the dataset and
  how to supply it) when asked for a batch; ``has_test`` (which splits the reference carves) changes nothing here."""
  del has_test
  if not isinstance(tfds_datasetname, str) or not tfds_datasetname:
    raise ValueError(f"tfds_datasetname must be a TFDS dataset name, got {tfds_datasetname!r}.")
  if not isinstance(getattr(vocab, "vocab_size", None), int):
    raise TypeError(f"vocab must be a vocabulary with an int vocab_size (e.g. get_bytes_vocab()), got {vocab!r}.")
  batch_size = check_positive_int("batch_size", batch_size)
  sequence_length = check_positive_int("sequence_length", sequence_length)
  shape = jax.ShapeDtypeStruct((batch_size, sequence_length), jnp.int32)
  label = f"{tfds_datasetname} ({vocab.vocab_size}-token vocabulary)"
  return base.unavailable_datasets(label, _HOW.format(tfds_datasetname), {"obs": shape, "target": shape},
                                   {"vocab_size": vocab.vocab_size, "vocab": vocab})


def _lm_datasets(corpus: str, vocab: str, batch_size: int, sequence_length: int) -> base.Datasets:
  return _make_datasets(corpus, _SentencePieceSize() if vocab == "32k" else ByteVocabulary(), batch_size,
                        sequence_length)


@base.dataset_lru_cache
def lm1b_32k_datasets(batch_size, sequence_length):
  """LM1B with the 32k SentencePiece vocabulary: unavailable offline (batches raise)."""
  return _lm_datasets("lm1b", "32k", batch_size, sequence_length)


@base.dataset_lru_cache
def lm1b_bytes_datasets(batch_size, sequence_length):
  """LM1B as bytes: unavailable offline (batches raise)."""
  return _lm_datasets("lm1b", "bytes", batch_size, sequence_length)


@base.dataset_lru_cache
def wikipedia_en_32k_datasets(batch_size, sequence_length):
  """English Wikipedia with the 32k SentencePiece vocabulary: unavailable offline (batches raise)."""
  return _lm_datasets("wikipedia_en", "32k", batch_size, sequence_length)


@base.dataset_lru_cache
def wikipedia_en_bytes_datasets(batch_size, sequence_length):
  """English Wikipedia as bytes: unavailable offline (batches raise)."""
  return _lm_datasets("wikipedia_en", "bytes", batch_size, sequence_length)


CACHED = (lm1b_32k_datasets, lm1b_bytes_datasets, wikipedia_en_32k_datasets, wikipedia_en_bytes_datasets)
