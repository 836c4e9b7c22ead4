"""Atomic file writes: every file metafam writes goes through a temporary file and `os.replace`."""

from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Any


def atomic_write(path: str, data: bytes) -> None:
  """Writes ``data`` to ``path`` via a flushed, fsynced temporary file in the same directory and `os.replace`.

  Readers see the old file or the new one, never a partial write; a failure leaves no temporary file behind.
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}-", dir=directory)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def write_json(path: str, obj: Any) -> None:
  """``obj`` as indented, key-sorted JSON, atomically."""
  atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def save_figure(fig: Any, path: str, dpi: int = 110) -> None:
  """A matplotlib figure as PNG, atomically."""
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
  atomic_write(path, buf.getvalue())
