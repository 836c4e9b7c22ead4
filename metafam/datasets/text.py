"""Character-level language-modeling data from the embedded Shakespeare corpus.

Batches are ``{"obs": i32[B, T], "target": i32[B, T]}`` with ``target[:, t] == obs[:, t + 1]`` within a window.
The corpus (eight plays, ~1.04M characters, public domain; see LICENSE_SHAKESPEARE.txt) is split into contiguous,
disjoint character ranges: the first 80% -> ``train``, next 5% -> ``inner_valid``, next 7.5% -> ``outer_valid``,
last 7.5% -> ``test``. Each range is cut into non-overlapping windows of ``T + 1`` characters.
"""

from __future__ import annotations

import gzip
import importlib.resources
from typing import Optional, Tuple

import numpy as np

from metafam._checks import check_positive_int
from metafam.datasets.arrays import datasets_from_arrays
from metafam.datasets.base import Datasets, SPLITS, dataset_lru_cache

SPLIT_FRACTIONS = (0.80, 0.05, 0.075, 0.075)


def shakespeare_text() -> str:
  """The embedded corpus as one string."""
  res = importlib.resources.files("metafam.datasets").joinpath("data/shakespeare_8plays.txt.gz")
  with res.open("rb") as f:
    return gzip.decompress(f.read()).decode("ascii")


def char_vocab(text: str) -> Tuple[str, np.ndarray]:
  """(sorted distinct characters, lookup table byte -> id)."""
  chars = "".join(sorted(set(text)))
  table = np.full(256, -1, np.int32)
  table[np.frombuffer(chars.encode("ascii"), np.uint8)] = np.arange(len(chars), dtype=np.int32)
  return chars, table


def windows(ids: np.ndarray, sequence_length: int) -> dict:
  """Non-overlapping windows of ``sequence_length + 1`` ids -> ``{"obs", "target"}`` arrays [N, T]."""
  n = (len(ids) - 1) // sequence_length
  if n < 1:
    raise ValueError(f"a split of {len(ids)} characters is too short for sequence_length={sequence_length}.")
  idx = np.arange(n)[:, None] * sequence_length + np.arange(sequence_length + 1)[None, :]
  w = ids[idx]
  return {"obs": np.ascontiguousarray(w[:, :-1]), "target": np.ascontiguousarray(w[:, 1:])}


@dataset_lru_cache
def shakespeare_char_datasets(batch_size: int = 32, sequence_length: int = 64, seed: int = 0,
                              text: Optional[str] = None) -> Datasets:
  """Character LM batches ``{"obs": i32[B, T], "target": i32[B, T]}`` from the embedded corpus.

  Args:
    batch_size: sequences per batch.
    sequence_length: T.
    seed: seed of the shuffling streams (split i uses ``4 * seed + i``).
    text: a different ASCII corpus to use instead of the embedded one (same splitting rules).

  ``extra_info`` holds ``vocab_size`` and ``vocab`` (the id -> character string).
  """
  sequence_length = check_positive_int("sequence_length", sequence_length)
  text = shakespeare_text() if text is None else text
  try:
    raw = np.frombuffer(text.encode("ascii"), np.uint8)
  except UnicodeEncodeError as e:
    raise ValueError(f"text must be ASCII: {e}") from None
  vocab, table = char_vocab(text)
  ids = table[raw]
  bounds = np.round(np.cumsum((0.0,) + SPLIT_FRACTIONS) * len(ids)).astype(int)
  arrays = {name: windows(ids[bounds[i]:bounds[i + 1]], sequence_length) for i, name in enumerate(SPLITS)}
  return datasets_from_arrays(**arrays, batch_size=batch_size, seed=seed,
                              extra_info={"vocab_size": len(vocab), "vocab": vocab})
