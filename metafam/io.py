"""Atomic file writes: every file metafam writes goes through a temporary file and `os.replace`."""

from __future__ import annotations

import io
import json
import os
import secrets
from typing import Any, Tuple


def _create_temporary(directory: str, name: str) -> Tuple[int, str]:
  """A new, exclusively created ``.name-<random>.tmp`` in ``directory``, opened for writing.

  Created with mode 0o666 like `open` creates files, so the kernel applies the process umask (and any default ACL)
  itself: no need to read the umask (``os.umask`` can only be read by setting it, which races with other threads).
  """
  flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
  for _ in range(100):
    tmp = os.path.join(directory, f".{name}-{secrets.token_hex(6)}.tmp")
    try:
      return os.open(tmp, flags, 0o666), tmp
    except FileExistsError:
      continue
  raise FileExistsError(f"could not create a temporary file for {name} in {directory}")


def atomic_write(path: str, data: bytes) -> None:
  """Writes ``data`` (any bytes-like object) to ``path`` via a flushed, fsynced temporary file in the same directory
  and `os.replace`.

  Readers see the old file or the new one, never a partial write; a failure leaves no temporary file behind. The
  file gets the permissions `open` would give a new file (0o666 minus the process umask).
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = _create_temporary(directory, os.path.basename(path))
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
