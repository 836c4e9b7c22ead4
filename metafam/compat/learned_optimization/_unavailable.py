"""The one error of the reference's modules this layer does not provide (launchers, cluster scripts).

Such a module's import raises ImportError naming the dependency metafam does not use and what to use instead, so
research code fails at the import with a reason rather than later with an AttributeError.
"""

from __future__ import annotations

_PREFIX = "metafam.compat."


def fail(module_name: str, dependency: str, instead: str) -> None:
  """Raises ImportError: ``learned_optimization.<module> needs <dependency> ...; <instead>``."""
  lo_name = module_name[len(_PREFIX):] if module_name.startswith(_PREFIX) else module_name
  raise ImportError(f"{lo_name} needs {dependency}, which metafam does not use, so this module is not provided "
                    f"(see metafam/compat/learned_optimization/COVERAGE.md). {instead}")
