"""Safe file writes: atomic replacement, all-or-nothing appends, and a lock on an output directory.

Every file metafam writes goes through a temporary file and `os.replace` (`atomic_write`), except logs that grow by
one record at a time, which `append_line` extends all-or-nothing. `DirectoryLock` keeps two runs out of one output
directory; `check_output_dir` (creating nothing) and `lock_output_dir` (create, prove writable, lock) are the checks
every command makes of its output directory before expensive work.
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import secrets
import tempfile
from typing import Any, Optional, Tuple

__all__ = ["atomic_write", "write_json", "save_figure", "append_line", "LOCK_NAME", "DirectoryLock",
           "DirectoryBusyError", "OutputDirectoryError", "check_output_dir", "lock_output_dir"]


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


def append_line(path: str, line: str) -> None:
  """Appends ``line`` (a newline is added) to ``path`` all-or-nothing.

  A write that fails part-way (a full disk, a quota, a file-size limit, an I/O error) is undone by truncating the
  file back to its previous length before the `OSError` propagates, so the file never ends in a partial record
  because of a failed write. A crash of the process mid-write can still leave one; readers of such logs drop a
  partial last line (`metafam.runs.read_metrics`).
  """
  data = (line.rstrip("\n") + "\n").encode()
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
  try:
    size = os.fstat(fd).st_size
    try:
      view = memoryview(data)
      while view:
        view = view[os.write(fd, view):]
    except OSError:
      try:
        os.ftruncate(fd, size)
      except OSError:
        pass  # nothing more can be done; the reader drops a partial last line
      raise
  finally:
    os.close(fd)


LOCK_NAME = ".metafam.lock"


class DirectoryBusyError(RuntimeError):
  """Another live process holds the lock of an output directory."""


def _busy(path: str, lock_path: str, holder: bytes) -> DirectoryBusyError:
  pid = holder.decode(errors="replace").strip()
  who = f"process {pid}" if pid.isdigit() else "another process"
  return DirectoryBusyError(f"{path!r} is in use by a live metafam run ({who} holds {lock_path}); wait for it to "
                            "finish or choose another output directory.")


def _times(stat: os.stat_result) -> Tuple[int, int]:
  return stat.st_atime_ns, stat.st_mtime_ns


class DirectoryLock:
  """An advisory, exclusive lock on an output directory for the life of a run (``with DirectoryLock(path): ...``).

  It is an ``flock`` on ``PATH/.metafam.lock``: the kernel releases it when the holder exits in any way (kill -9
  included), so a dead run never leaves a stale lock, and a file left behind by one means nothing by itself; a run
  that ends removes the file (`release`). The file
  holds the holder's pid, for the message a second run gets. A second `DirectoryLock` on the same directory, from
  another process or this one, raises `DirectoryBusyError` at once, without changing anything in the directory.
  Creates ``path`` if needed. Advisory: it keeps out metafam runs, not other programs; on file systems without
  ``flock`` support (some network mounts) the lock is refused with the OS error rather than silently skipped.
  """

  def __init__(self, path: str):
    self.path = path
    self.lock_path = os.path.join(path, LOCK_NAME)
    self._fd: Optional[int] = None

  @staticmethod
  def check_free(path: str) -> None:
    """Raises `DirectoryBusyError` if a live process holds ``path``'s lock; creates and changes nothing (a cheap
    early check: `acquire` is what excludes)."""
    lock_path = os.path.join(path, LOCK_NAME)
    try:
      fd = os.open(lock_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
      return  # no lock file (or none readable): nobody holds it through metafam
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise _busy(path, lock_path, os.pread(fd, 64, 0)) from None
    finally:
      os.close(fd)  # also drops the shared lock taken for the look

  def acquire(self) -> "DirectoryLock":
    if self._fd is not None:
      raise RuntimeError(f"DirectoryLock({self.path!r}) is already held by this object.")
    created_dir = not os.path.isdir(self.path)
    os.makedirs(self.path, exist_ok=True)
    try:
      with open(self.lock_path, "rb") as f:
        previous: Optional[Tuple[bytes, int, int]] = (f.read(), *_times(os.fstat(f.fileno())))
    except FileNotFoundError:
      previous = None
    while True:
      fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        holder = os.pread(fd, 64, 0)
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
          raise _busy(self.path, self.lock_path, holder) from None
        raise
      try:  # the file locked must still be the one at the path: a holder that just ended removed it
        if os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino:
          break
      except FileNotFoundError:
        pass
      os.close(fd)
    pid = str(os.getpid()).encode()
    if os.pread(fd, 64, 0) != pid:  # the holder's pid, for the message a second run gets
      os.ftruncate(fd, 0)
      os.pwrite(fd, pid, 0)
    self._fd = fd
    self._previous, self._created_dir = previous, created_dir
    return self

  def release(self, restore: bool = False) -> None:
    """Releases the lock and removes the lock file; with ``restore`` (a run refused after taking it) the lock file
    instead gets back the bytes and times it had before `acquire` (or is removed, with the directory if `acquire`
    created it and it is empty again). The file is removed while still locked, and `acquire` checks that the file it
    locked is still the one at the path, so no two holders can ever lock different files."""
    if self._fd is None:
      return
    if not restore:
      try:
        os.unlink(self.lock_path)
      except FileNotFoundError:
        pass
    else:
      if self._previous is None:
        os.unlink(self.lock_path)
        if self._created_dir and not os.listdir(self.path):
          os.rmdir(self.path)
      else:
        data, atime, mtime = self._previous
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        os.utime(self._fd, ns=(atime, mtime))
    os.close(self._fd)  # closing the descriptor releases the flock
    self._fd = None

  @property
  def held(self) -> bool:
    return self._fd is not None

  def __enter__(self) -> "DirectoryLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


class OutputDirectoryError(ValueError):
  """An output directory that cannot be used (empty path, a file, not writable)."""


def check_output_dir(path: str, what: str = "output directory") -> None:
  """Raises `OutputDirectoryError` (starting with ``what`` and the path), creating nothing, for an output directory
  that is empty, a file or under one, or whose nearest existing ancestor is not writable; `DirectoryBusyError` when a
  live metafam process holds its lock."""
  if not path:
    raise OutputDirectoryError(f"{what} must not be empty.")
  if os.path.exists(path) and not os.path.isdir(path):
    raise OutputDirectoryError(f"{what} {path!r} exists and is not a directory.")
  ancestor = os.path.abspath(path)
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if not os.path.isdir(ancestor):
    raise OutputDirectoryError(f"{what} {path!r} cannot be created: {ancestor!r} is a file, not a directory.")
  if not os.access(ancestor, os.W_OK | os.X_OK):
    raise OutputDirectoryError(f"{what} {path!r} is not writable ({ancestor!r} denies writing).")
  try:
    DirectoryLock.check_free(path)
  except DirectoryBusyError as e:
    raise DirectoryBusyError(f"{what} {e}") from None


def lock_output_dir(path: str, what: str = "output directory") -> DirectoryLock:
  """Creates ``path``, proves it writable with a probe file (removed again) and returns its held `DirectoryLock`
  (`OutputDirectoryError` naming ``what`` if it cannot be written, `DirectoryBusyError` if a live run holds it). A
  caller refused after this releases with ``restore=True``: the directory is then as it was."""
  created = not os.path.isdir(path)
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as e:
    if created and os.path.isdir(path) and not os.listdir(path):
      os.rmdir(path)
    raise OutputDirectoryError(f"{what} {path!r} cannot be written ({e.strerror or e}).") from None
  lock = DirectoryLock(path)
  try:
    lock.acquire()
  except BaseException as e:
    if created and not os.listdir(path):
      os.rmdir(path)
    if isinstance(e, DirectoryBusyError):
      raise DirectoryBusyError(f"{what} {e}") from None
    raise
  lock._created_dir = created
  return lock
