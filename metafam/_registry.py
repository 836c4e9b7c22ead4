"""The lookup every name table of metafam uses, so an unknown name reads the same everywhere, and the ``name`` of
the objects those tables hold.

    value = lookup(TASKS, "nope", "task")   # UnknownNameError: unknown task 'nope'; valid names: a, b, ...
"""

from __future__ import annotations

from typing import Any, Mapping


class UnknownNameError(KeyError, ValueError):
  """A name that is not in a registry; both a KeyError and a ValueError, so callers catching either still work."""

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else ""


def unknown_name_message(table: Mapping[str, Any], name: Any, what: str) -> str:
  """``unknown {what} {name!r}; valid names: ...`` (sorted)."""
  return f"unknown {what} {name!r}; valid names: {', '.join(sorted(table))}"


def lookup(table: Mapping[str, Any], name: Any, what: str) -> Any:
  """``table[name]``, or UnknownNameError naming ``what`` and listing the valid names."""
  try:
    return table[name]
  except (KeyError, TypeError):  # TypeError: an unhashable name
    raise UnknownNameError(unknown_name_message(table, name, what)) from None


class Named:
  """A settable ``name`` that defaults to the class's name (tasks and task families)."""

  @property
  def name(self) -> str:
    return getattr(self, "_name", None) or type(self).__name__

  @name.setter
  def name(self, value: str) -> None:
    self._name = value
