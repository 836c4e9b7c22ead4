"""`learned_optimization.learned_optimizers.test_utils`: `smoketest_learned_optimizer` (LO's tests call it).

Initializes the meta-parameters, builds the optimizer with ``opt_fn`` and runs `optimizers.test_utils`'s
`smoketest_optimizer` on it.
"""

from __future__ import annotations

from typing import Any

import jax

from metafam.compat.learned_optimization.optimizers import test_utils as _opt_test_utils

__all__ = ["smoketest_learned_optimizer"]


def smoketest_learned_optimizer(learned_optimizer: Any, strict_types: bool = True) -> None:
  theta = learned_optimizer.init(jax.random.PRNGKey(0))
  _opt_test_utils.smoketest_optimizer(learned_optimizer.opt_fn(theta), strict_types=strict_types)
