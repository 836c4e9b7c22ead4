"""The package's argument checks, in one module: `check_number` (a finite real or int within bounds, never a bool;
"NAME must be a finite number > 0 (not a bool), got X."), `check_positive` and `check_positive_int` (the common
"NAME must be a positive ..." cases), `check_bool` and `check_choice` (one of a few names). Every package checks its
arguments through these."""

from __future__ import annotations

import numbers
from typing import Any, Optional

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


def check_number(name: str, value: Any, low: Optional[float] = None, high: Optional[float] = None,
                 low_open: bool = False, high_open: bool = False, integer: bool = False) -> Any:
  """Returns ``value`` if it is a finite real number (an int with ``integer``) within the bounds, else ValueError.

  A bool is never a number here, and NaN or an infinity never passes: a bare ``if not value > 0`` lets ``inf``
  through, and ``if value <= 0`` lets ``nan`` through. ``low`` / ``high`` bound the value, excluded with
  ``low_open`` / ``high_open``. The error names the argument, what is accepted and what was given.
  """
  kinds = (int, np.integer) if integer else (numbers.Real,)
  ok = isinstance(value, kinds) and not isinstance(value, (bool, np.bool_)) and np.isfinite(value)
  ok = ok and (low is None or (value > low if low_open else value >= low))
  ok = ok and (high is None or (value < high if high_open else value <= high))
  if not ok:
    if low is not None and high is not None:
      bounds = f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
      bounds = f" {'>' if low_open else '>='} {low:g}"
    elif high is not None:
      bounds = f" {'<' if high_open else '<='} {high:g}"
    else:
      bounds = ""
    kind = "an int" if integer else "a finite number"
    raise ValueError(f"{name} must be {kind}{bounds} (not a bool), got {value!r}.")
  return value


def check_bool(name: str, value: Any) -> bool:
  """``bool(value)`` if it is a Python or numpy bool, else ValueError naming ``name`` (0 and 1 are not flags)."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be a bool, got {value!r}.")
  return bool(value)


def check_choice(name: str, value: Any, choices: Any) -> Any:
  """``value`` if it is one of ``choices``, else ValueError naming ``name`` and listing the choices."""
  if not isinstance(value, str) or value not in choices:
    raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}.")
  return value
