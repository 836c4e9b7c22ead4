"""`learned_optimization.optimizers`: the names of `optimizers.base` and `optimizers.optax_opts`, as the reference's
package exports them (its other modules are imported by name)."""

from metafam.compat.learned_optimization.optimizers.base import *  # noqa: F401,F403
from metafam.compat.learned_optimization.optimizers.optax_opts import *  # noqa: F401,F403
