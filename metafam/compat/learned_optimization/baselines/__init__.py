"""`learned_optimization.baselines`: its modules raise ImportError on import (see COVERAGE.md)."""
