"""Atomic, self-describing checkpoints of pytrees (numpy arrays inside a pickle).

A checkpoint file holds ``{"format": FORMAT, "metadata": {...}, "tree": pytree of numpy arrays}``, written with
`metafam.io.atomic_write`, so a crash never leaves a half-written checkpoint. Load only checkpoints you wrote (pickle). PRNG keys are stored as their raw key data (see `MetaTrainState.key_data`).
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Dict, Tuple

import jax
import numpy as np

from metafam.io import atomic_write

FORMAT = "metafam-checkpoint-v1"


class CheckpointError(RuntimeError):
  """A checkpoint file is missing, corrupted, or from a different run."""


def save(path: str, tree: Any, metadata: Dict[str, Any]) -> None:
  """Writes ``tree`` (moved to host numpy) and ``metadata`` to ``path`` atomically."""
  payload = {"format": FORMAT, "metadata": dict(metadata), "tree": jax.tree.map(np.asarray, jax.device_get(tree))}
  atomic_write(path, pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))


def load(path: str) -> Tuple[Any, Dict[str, Any]]:
  """Returns ``(tree, metadata)``; raises `CheckpointError` with the reason if the file is unusable."""
  if not os.path.exists(path):
    raise CheckpointError(f"no checkpoint at {path}.")
  try:
    with open(path, "rb") as f:
      payload = pickle.load(f)
  except Exception as e:  # truncated or garbage bytes
    raise CheckpointError(f"checkpoint {path} is corrupted and cannot be read ({type(e).__name__}: {e}).") from None
  if not isinstance(payload, dict) or payload.get("format") != FORMAT:
    raise CheckpointError(f"{path} is not a {FORMAT} checkpoint.")
  return payload["tree"], payload["metadata"]
