"""`learned_optimization.filesystem`: the file operations LO code calls, on local paths.

LO routes ``gs://`` paths through TensorFlow's gfile; metafam has no cloud storage client, so such a path raises
NotImplementedError naming the missing dependency. Local paths use the standard library.
"""

from __future__ import annotations

import glob as _glob
import os
import shutil
from typing import Sequence

__all__ = ["file_open", "make_dirs", "copy", "rename", "exists", "glob", "remove"]


def _local(path: str, what: str) -> str:
  path = os.fspath(path)
  if "://" in path:
    raise NotImplementedError(f"filesystem.{what}: {path!r} is a remote path; LO reads those with TensorFlow's gfile "
                              "(tensorflow), which metafam does not use. Use a local path.")
  return path


def file_open(path: str, mode: str):
  """``open(path, mode)`` for a local path."""
  return open(_local(path, "file_open"), mode)


def make_dirs(path: str) -> None:
  """Creates ``path`` and its parents (nothing if it exists)."""
  os.makedirs(_local(path, "make_dirs"), exist_ok=True)


def copy(path: str, target: str):
  """Copies the file ``path`` to ``target``."""
  return shutil.copy(_local(path, "copy"), _local(target, "copy"))


def rename(path: str, target: str):
  """Moves ``path`` to ``target``."""
  return shutil.move(_local(path, "rename"), _local(target, "rename"))


def exists(path: str) -> bool:
  return os.path.exists(_local(path, "exists"))


def glob(pattern: str) -> Sequence[str]:
  return _glob.glob(_local(pattern, "glob"))


def remove(path: str) -> None:
  """Removes the file or the directory tree ``path``."""
  path = _local(path, "remove")
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path)
  else:
    os.remove(path)
