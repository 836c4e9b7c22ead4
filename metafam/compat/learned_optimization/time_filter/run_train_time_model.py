"""`learned_optimization.time_filter.run_train_time_model`: not provided (importing it raises ImportError)."""

from metafam.compat.learned_optimization import _unavailable

_unavailable.fail(__name__, "LO's timing models trained on its cloud timing data (haiku, gin, tensorflow)",
                  "Time a family's step with metafam's benchmarks/ scripts instead.")
