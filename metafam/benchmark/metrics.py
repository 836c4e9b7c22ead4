"""The benchmark's metrics, which live in the lower layer `metafam.evaluation.metrics` (the held-out comparison
uses them too); re-exported here under their old import path."""

from metafam.evaluation.metrics import (STATISTICS, Aggregate, RunCurves, Speedup, aggregate, final_and_best, iqm,
                                        median, normalize, running_min, speedup_over_baseline)

__all__ = ["STATISTICS", "Aggregate", "RunCurves", "Speedup", "aggregate", "final_and_best", "iqm", "median",
           "normalize", "running_min", "speedup_over_baseline"]
