"""`learned_optimization.entry_points`: its modules raise ImportError on import (see COVERAGE.md)."""
