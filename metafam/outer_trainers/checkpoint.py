"""Atomic, self-describing checkpoints of pytrees (numpy arrays inside a pickle).

A checkpoint file holds ``{"format": FORMAT, "metadata": {...}, "tree": pytree of numpy arrays}``. It is written to
a temporary file in the same directory, flushed, fsynced and renamed over the target, so a crash never leaves a
half-written checkpoint. PRNG keys are stored as their raw key data (see `MetaTrainState.key_data`).
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any, Dict, Tuple

import jax
import numpy as np

FORMAT = "metafam-checkpoint-v1"


class CheckpointError(RuntimeError):
  """A checkpoint file is missing, corrupted, or from a different run."""


def save(path: str, tree: Any, metadata: Dict[str, Any]) -> None:
  """Writes ``tree`` (moved to host numpy) and ``metadata`` to ``path`` atomically."""
  payload = {"format": FORMAT, "metadata": dict(metadata), "tree": jax.tree.map(np.asarray, jax.device_get(tree))}
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".ckpt-", dir=directory)
  try:
    with os.fdopen(fd, "wb") as f:
      pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


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
