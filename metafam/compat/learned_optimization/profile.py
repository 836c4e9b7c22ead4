"""`learned_optimization.profile`: wall-clock timing of a block or a function, logged at DEBUG level.

``with Profile(name): ...`` and ``@wrap()`` log ``"<name> took <seconds> seconds"`` to the Python logger
``metafam.compat.learned_optimization.profile`` at DEBUG level (LO switches this with an absl flag; here the
logger's level does, so nothing is logged by default and no flag is defined at import).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Callable, TypeVar

__all__ = ["T", "Profile", "wrap"]

T = TypeVar("T")

_LOG = logging.getLogger(__name__)


class Profile:
  """Context manager that logs how long its block took (wall clock), under ``name``."""

  def __init__(self, name: str):
    self.name = name
    self._start_time = None

  def __enter__(self):
    self._start_time = time.perf_counter()
    return self

  def __exit__(self, exc_type, exc_value, traceback):
    if _LOG.isEnabledFor(logging.DEBUG):
      _LOG.debug("%s took %.6f seconds", self.name, time.perf_counter() - self._start_time)


def wrap() -> Callable[[T], T]:
  """A decorator that runs the function inside ``Profile(<function name>)``."""

  def decorate(fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
      with Profile(fn.__name__):
        return fn(*args, **kwargs)
    return wrapped

  return decorate
