"""`learned_optimization.baselines.hparam_sets`: not provided (importing it raises ImportError)."""

from metafam.compat.learned_optimization import _unavailable

_unavailable.fail(__name__, "LO's archive of baseline runs in its cloud bucket (gin, gfile)",
                  "metafam's tuned-Adam baselines and speedups are in metafam.evaluation and metafam.benchmark.")
