"""Argument checks shared across the package: one wording for "must be a positive ..." everywhere."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np


def check_positive(name: str, value: Any, integer: bool = False) -> Any:
  """``value`` if it is a positive finite number (a positive int with ``integer``), else ValueError naming ``name``.

  Bools, NaN and infinities are refused (``nan <= 0`` is False, so a plain comparison would let NaN through).
  """
  ok = isinstance(value, int) if integer else isinstance(value, numbers.Real)
  if not ok or isinstance(value, (bool, np.bool_)) or not np.isfinite(value) or not value > 0:
    raise ValueError(f"{name} must be a positive {'int' if integer else 'number'} (finite, not a bool), got {value!r}.")
  return value


def check_positive_int(name: str, value: Any) -> int:
  """``int(value)`` if it is a positive integer (a Python or numpy int, not a bool), else ValueError naming ``name``."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be a positive int, got {value!r}.")
  return int(value)
