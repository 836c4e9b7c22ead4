"""`learned_optimization.distributed`: not provided (importing it raises ImportError)."""

from metafam.compat.learned_optimization import _unavailable

_unavailable.fail(__name__, "courier (LO's multi-machine learner/worker RPC)",
                  'metafam runs multi-process jobs with jax.distributed: see metafam.distributed.')
