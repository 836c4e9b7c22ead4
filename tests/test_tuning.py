"""metafam.evaluation.tuning: the one grid and selection rule, used by FamilyEvaluator.tune_adam and the benchmark."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meta_setup import quadratic_family
from metafam.benchmark import sweep
from metafam.evaluation import family_eval, tuning
from metafam.evaluation.family_eval import DEFAULT_ADAM_LRS, FamilyEvaluator
from metafam.tasks.quadratic import QuadraticTask

STEPS = np.arange(1, 11)  # eval points 1..10
LRS = (1e-3, 1e-2, 1e-1, 3.0)


def curves(*finals, length=10):
  """``[L, 2, length]``: rate l's loss decays linearly from 1 to ``finals[l]`` on both seeds."""
  t = np.linspace(0.0, 1.0, length)
  return np.stack([np.stack([1.0 + (f - 1.0) * t] * 2) for f in finals])


def test_an_early_divergence_is_never_selected_even_with_the_best_tail():
  losses = curves(0.5, 0.1, 0.3)
  losses[1, 0, 2] = np.nan  # rate 1 blew up at step 3 on seed 0 and recovered: its tail is the best
  scores, diverged, best = tuning.select_best(STEPS, losses)
  np.testing.assert_array_equal(diverged, [False, True, False])
  assert best == 2 and np.isinf(scores[1]) and np.all(np.isfinite(scores[[0, 2]]))
  train = np.ones((3, 2, 10))
  train[2, 1, 0] = np.inf  # a non-finite training loss disqualifies too
  scores, diverged, best = tuning.select_best(STEPS, curves(0.5, 0.1, 0.3), train)
  np.testing.assert_array_equal(diverged, [False, False, True])
  assert best == 1


def test_score_is_the_tail_mean_and_ties_go_to_the_smaller_rate():
  losses = curves(0.5, 0.2, 0.2, 0.9)
  scores, diverged, best = tuning.select_best(STEPS, losses, tail_fraction=0.3)  # eval points 7..10
  np.testing.assert_allclose(scores, losses[:, :, 6:].mean(axis=(1, 2)))
  assert not diverged.any() and scores[1] == scores[2] and best == 1
  losses = curves(0.5, 0.2, length=30)  # tune_adam's window: the last max(1, T // 10) = 3 of T = 30 steps
  scores, _, _ = tuning.select_best(np.arange(1, 31), losses, tail_fraction=tuning.last_steps_fraction(30, 3))
  np.testing.assert_allclose(scores, losses[:, :, -3:].mean(axis=(1, 2)))


def test_all_diverged_selects_nothing():
  losses = curves(0.5, 0.1)
  losses[:, 1, 4] = np.inf
  scores, diverged, best = tuning.select_best(STEPS, losses)
  assert best == -1 and diverged.all() and np.isinf(scores).all()


def test_one_grid():
  np.testing.assert_array_equal(tuning.default_learning_rates(), np.logspace(-4, -1, 7))
  assert DEFAULT_ADAM_LRS == tuple(float(x) for x in np.logspace(-4, -1, 7))
  assert sweep.default_learning_rates is tuning.default_learning_rates
  assert sweep.check_learning_rates is tuning.check_learning_rates and sweep.select_best is tuning.select_best
  with pytest.raises(ValueError, match="distinct finite positive"):
    tuning.check_learning_rates([0.1, 0.1])
  assert FamilyEvaluator(quadratic_family(), 4, 10, adam_lrs=(0.1, 0.01)).adam_lrs == (0.01, 0.1)  # ascending


def test_tune_adam_and_tune_learning_rate_share_select_best(monkeypatch):
  calls = []
  real = tuning.select_best

  def spy(*args, **kwargs):
    calls.append(np.shape(args[1]))
    return real(*args, **kwargs)
  monkeypatch.setattr(tuning, "select_best", spy)
  result = FamilyEvaluator(quadratic_family(), 4, 10, adam_lrs=(1e-2, 1e-1)).tune_adam(jax.random.key(0))
  assert calls == [(2, 4, 10)]  # [rates, instances, every step]
  assert result["best_lr"] in (1e-2, 1e-1)
  sweep.tune_learning_rate(QuadraticTask(4), optax.sgd, (1e-2, 1e-1), num_steps=10, num_seeds=2, eval_every=5)
  assert calls[1] == (2, 2, 3)  # [rates, seeds, eval points 0, 5, 10]


def test_tune_adam_picks_a_finite_rate_and_never_one_that_diverged_early(monkeypatch):
  """On the quadratic family 0.1 wins; with its first step on every instance turned to inf (the tail untouched) it
  has diverged and the next best rate, 3.0, wins instead."""
  key = jax.random.key(1)
  clean = FamilyEvaluator(quadratic_family(), 4, 30, adam_lrs=LRS).tune_adam(key)
  assert clean["best_lr"] == 0.1 and np.isfinite(clean["select_scores"]).all() and not clean["diverged"].any()
  assert np.isfinite(clean["curve"]).all()
  real = family_eval._curves

  def first_step_of_group_2_is_inf(step, theta, key, num_steps, theta_is_batched):
    out = real(step, theta, key, num_steps, theta_is_batched)
    return out.at[0, 8:12].set(jnp.inf) if out.shape[1] == 16 else out  # lanes 2 * 4 + i: lr 0.1 in the sweep
  monkeypatch.setattr(family_eval, "_curves", first_step_of_group_2_is_inf)
  hurt = FamilyEvaluator(quadratic_family(), 4, 30, adam_lrs=LRS).tune_adam(key)
  np.testing.assert_array_equal(hurt["diverged"], [False, False, True, False])
  assert hurt["best_lr"] == 3.0
  np.testing.assert_allclose(hurt["select_scores"][[0, 1, 3]], clean["select_scores"][[0, 1, 3]], rtol=1e-6)


def test_tune_adam_raises_when_every_rate_diverged():
  with pytest.raises(RuntimeError, match="every learning rate .* diverged"):
    FamilyEvaluator(quadratic_family(), 4, 10, adam_lrs=(1e25, 1e30)).tune_adam(jax.random.key(0))
