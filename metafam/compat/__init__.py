"""Compatibility layers: other libraries' public names as thin adapters over metafam's own objects.

`metafam.compat.learned_optimization` mirrors the module tree of google/learned_optimization, so code written for
it runs on metafam after changing only the import prefix. See its ``COVERAGE.md`` for what is covered.
"""
