"""`learned_optimization.outer_trainers.test_utils`: `trainer_smoketest(estimator)`, as LO's tests call it.

Builds `WorkerWeights` from the estimator's learned optimizer, initializes the worker state and computes one
gradient estimate with summaries; returns ``(GradientEstimatorOut, metrics)``. Raises AssertionError when the
gradient's structure differs from theta's or the mean loss is not a finite scalar.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from metafam.compat.learned_optimization.outer_trainers import gradient_learner

__all__ = ["trainer_smoketest"]


def trainer_smoketest(trainer: Any):
  key = jax.random.PRNGKey(0)
  theta = trainer.learned_opt.init(key)
  weights = gradient_learner.WorkerWeights(theta, None, gradient_learner.OuterState(1))
  state = trainer.init_worker_state(weights, key=key)
  out, metrics = trainer.compute_gradient_estimate(weights, key, state, with_summary=True)
  assert jax.tree.structure(out.grad) == jax.tree.structure(theta), "the gradient does not match theta's structure"
  assert jnp.shape(out.mean_loss) == () and np.isfinite(float(out.mean_loss)), f"mean loss {out.mean_loss!r}"
  return out, metrics
