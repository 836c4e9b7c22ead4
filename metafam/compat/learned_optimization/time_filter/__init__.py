"""`learned_optimization.time_filter`: its modules raise ImportError on import (see COVERAGE.md)."""
