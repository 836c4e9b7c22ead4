"""How metafam reports non-finite losses and gradients: `NonFiniteWarning`, `NonFiniteError` and ``on_nonfinite``.

Every component that trains through non-finite values (`metafam.training.Trainer`, `metafam.inner.TruncatedStep`,
the estimators of `metafam.outer_trainers` and the meta-training loop `metafam.runs.loop.train`) takes
``on_nonfinite`` (`ON_NONFINITE`):

* ``"warn"`` (the default): a `NonFiniteWarning` (a `RuntimeWarning`) naming what went non-finite (loss, gradient,
  meta-loss, meta-gradient), where (the component, the steps, the lanes or members) and the fraction of steps or
  lanes masked or affected; the results carry that fraction (``nonfinite_fraction``).
* ``"raise"``: a `NonFiniteError` with the same message instead.
* ``"ignore"``: nothing is checked (the fraction is still computed where it is part of a program's metrics).

The checks run on the host after a jitted program has returned, on counts computed inside it, where the results
are read anyway: no callback runs inside a loop. Filter the warnings as any other (``warnings.simplefilter("error",
NonFiniteWarning)`` turns them into exceptions, ``"ignore"`` silences them).
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

ON_NONFINITE = ("warn", "raise", "ignore")


class NonFiniteWarning(RuntimeWarning):
  """A loss, gradient or meta-gradient went non-finite (NaN or infinite); the message says what, where and how much."""


class NonFiniteError(FloatingPointError):
  """Raised instead of a `NonFiniteWarning` with ``on_nonfinite="raise"``."""


def check_on_nonfinite(value: str, name: str = "on_nonfinite") -> str:
  """``value`` if it is one of `ON_NONFINITE`, else ValueError naming ``name``."""
  if not isinstance(value, str) or value not in ON_NONFINITE:
    raise ValueError(f"{name} must be one of {', '.join(map(repr, ON_NONFINITE))} (what to do when a loss or gradient "
                     f"goes non-finite), got {value!r}.")
  return value


def report(message: str, on_nonfinite: str, stacklevel: int = 2) -> None:
  """Warns (`NonFiniteWarning`) or raises (`NonFiniteError`) ``message`` as ``on_nonfinite`` says; "ignore": nothing.
  ``stacklevel`` counts from the caller of `report`."""
  if on_nonfinite == "raise":
    raise NonFiniteError(message)
  if on_nonfinite == "warn":
    warnings.warn(message, NonFiniteWarning, stacklevel=stacklevel + 1)


def percent(count: float, total: float, unit: str = "") -> str:
  """``"COUNT of TOTAL UNIT (P%)"``, the way every message here gives a fraction."""
  share = 100.0 * count / total if total else 0.0
  return f"{count:g} of {total:g}{' ' + unit if unit else ''} ({share:.1f}%)"


def listing(indices: Sequence[int], limit: int = 8) -> str:
  """``"0, 3, 5"``, or the first ``limit`` indices and how many more."""
  indices = [int(i) for i in np.asarray(indices).ravel()]
  shown = ", ".join(map(str, indices[:limit]))
  return shown + (f" and {len(indices) - limit} more" if len(indices) > limit else "")
