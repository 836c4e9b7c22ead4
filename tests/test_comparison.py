"""Held-out comparison with tuned Adam: per-instance speedups on curves with known answers, and the full pipeline."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.evaluation.metrics import aggregate
from metafam.evaluation.comparison import (compare_with_tuned_adam, instance_curves, instance_speedups,
                                           mean_curve_speedup, smooth_curves)
from metafam.evaluation.family_eval import FamilyEvaluator
from metafam.optimizers.learned import LearnableAdam, LearnableSGD
from metafam.taskfamilies.quadratic import QuadraticFamily

T = 200


def exp_curves(rates, speed=1.0, num_steps=T):
  """``[num_steps, len(rates)]``: ``exp(-rate * speed * t)`` for t = 1..num_steps (log-linear, so interpolation is
  exact)."""
  t = np.arange(1, num_steps + 1, dtype=np.float64)[:, None]
  return np.exp(-np.asarray(rates)[None, :] * speed * t)


def test_twice_as_fast_curves_score_two_per_instance():
  """A learned curve c(2t) against Adam's c(t) reaches Adam's step-T loss at T / 2: speedup exactly 2."""
  rates = np.linspace(0.005, 0.05, 16)
  speedups, reached, steps = instance_speedups(exp_curves(rates, 2.0), exp_curves(rates))
  np.testing.assert_allclose(speedups, 2.0, rtol=1e-9)
  np.testing.assert_allclose(steps, T / 2, rtol=1e-9)
  assert reached.all()
  assert mean_curve_speedup(exp_curves(rates, 2.0), exp_curves(rates)) == pytest.approx(2.0, rel=0.02)


def test_non_integer_speedups_are_interpolated_exactly():
  rates = np.full(4, 0.02)
  speedups, _, _ = instance_speedups(exp_curves(rates, 2.5), exp_curves(rates))
  np.testing.assert_allclose(speedups, 2.5, rtol=1e-9)


def test_identical_curves_score_one_and_slower_curves_score_zero():
  rates = np.linspace(0.01, 0.03, 5)
  same, reached, _ = instance_speedups(exp_curves(rates), exp_curves(rates))
  np.testing.assert_allclose(same, 1.0)
  assert reached.all()
  slow, reached, steps = instance_speedups(exp_curves(rates, 0.5), exp_curves(rates))
  np.testing.assert_array_equal(slow, 0.0)  # never reaches Adam's final loss within T: counted as 0
  assert not reached.any() and np.isnan(steps).all()


def test_non_finite_learned_steps_never_count():
  """A step that went non-finite (inf in the curves) cannot reach the target; the finite rest still can."""
  rates = np.full(2, 0.02)
  learned = exp_curves(rates, 2.0)
  learned[:, 0] = np.inf  # diverged from the start
  learned[50:, 1] = np.inf  # diverged at step 51, before it would reach the target (step 100)
  speedups, reached, _ = instance_speedups(learned, exp_curves(rates))
  np.testing.assert_array_equal(speedups, 0.0)
  assert not reached.any()


def test_median_interval_contains_the_known_speedup():
  """Per-instance speedups scattered around 2 (noisy curves, then smoothed): the median's bootstrap interval holds
  the true value 2, and the point estimate is close to it."""
  rng = np.random.default_rng(0)
  rates = rng.uniform(0.005, 0.02, 32)
  speeds = 2.0 * np.exp(rng.normal(0.0, 0.1, 32))  # per-instance true speedups, median about 2
  base = 0.3 + exp_curves(rates)
  learned = 0.3 + exp_curves(rates * speeds)
  noise = lambda: rng.normal(0.0, 0.002, base.shape)
  speedups, reached, _ = instance_speedups(smooth_curves(learned + noise(), 10), smooth_curves(base + noise(), 10))
  assert reached.all()
  agg = aggregate(speedups, "median", num_resamples=2000)
  assert agg.low <= np.median(speeds) <= agg.high
  assert agg.low <= 2.0 <= agg.high
  assert agg.value == pytest.approx(np.median(speeds), rel=0.1)


def test_smooth_curves_is_a_trailing_mean():
  x = np.arange(1.0, 7.0)[:, None]  # 1..6
  np.testing.assert_allclose(smooth_curves(x, 3)[:, 0], [1, 1.5, 2, 3, 4, 5])
  np.testing.assert_array_equal(smooth_curves(x, 1), x)
  y = x.copy()
  y[2] = np.inf
  s = smooth_curves(y, 2)[:, 0]
  assert np.isinf(s[2]) and np.isinf(s[3]) and s[4] == 4.5
  with pytest.raises(ValueError, match="window"):
    smooth_curves(x, 0)


def test_instance_speedups_checks_shapes():
  with pytest.raises(ValueError, match="num_steps, num_tasks"):
    instance_speedups(np.ones((5, 2)), np.ones((5, 3)))
  with pytest.raises(ValueError, match="num_steps, num_tasks"):
    instance_speedups(np.ones(5), np.ones(5))


# -- the pipeline on a small quadratic family --------------------------------------------------------------------
NUM_TASKS, NUM_STEPS, LRS = 16, 40, (1e-2, 1e-1, 3e-1)


@pytest.fixture(scope="module")
def evaluator():
  return FamilyEvaluator(QuadraticFamily(4, scale_range=(0.5, 2.0)), NUM_TASKS, NUM_STEPS, adam_lrs=LRS)


def test_instance_curves_average_to_the_evaluator_curve(evaluator):
  lopt, key = LearnableSGD(0.1), jax.random.key(3)
  curves = instance_curves(evaluator, lopt, lopt.init(None), key)
  assert curves.shape == (NUM_STEPS, NUM_TASKS)
  np.testing.assert_allclose(curves.mean(axis=1), evaluator.evaluate(lopt, lopt.init(None), key), rtol=1e-6)


def test_adam_against_itself_and_a_frozen_optimizer(evaluator):
  """Tuned Adam's own theta as the "learned" optimizer gives Adam's curves (speedup >= 1, every instance reached);
  SGD with a negligible learning rate never reaches Adam's final loss: speedup 0 on every instance."""
  key = jax.random.key(4)
  adam = LearnableAdam()
  lr = evaluator.tune_adam(key)["best_lr"]
  same = dict(adam.init(None), log_lr=jnp.log(jnp.float32(lr)))
  cmp = compare_with_tuned_adam(evaluator, adam, {"adam as learned": same}, key)
  r = cmp.learned["adam as learned"]
  assert cmp.adam_lr == lr
  np.testing.assert_allclose(r.curves, cmp.adam_curves, rtol=1e-6)
  assert r.reached.all() and r.speedup.value >= 1.0 and r.fraction_reached == 1.0
  assert r.final_loss == pytest.approx(cmp.adam_final_loss, rel=1e-6)

  sgd = LearnableSGD(1e-7)
  cmp = compare_with_tuned_adam(evaluator, sgd, {"frozen": sgd.init(None)}, key, statistic="iqm")
  r = cmp.learned["frozen"]
  np.testing.assert_array_equal(r.speedups, 0.0)
  assert (r.speedup.value, r.speedup.low, r.speedup.high) == (0.0, 0.0, 0.0) and r.speedup.statistic == "iqm"
  assert r.final_loss > cmp.adam_final_loss
  summary = json.loads(json.dumps(cmp.to_json()))  # JSON-able
  assert summary["learned"]["frozen"]["fraction_reached"] == 0.0 and summary["adam"]["lr"] == lr
  assert len(summary["learned"]["frozen"]["speedup_per_instance"]) == NUM_TASKS
  table = cmp.format_table()
  assert "frozen" in table and "Adam (tuned lr=" in table and "0.00 [0.00, 0.00]" in table
  assert set(cmp.mean_curves()) == {"frozen", cmp.adam_label}


def test_input_checks(evaluator):
  lopt, key = LearnableSGD(0.1), jax.random.key(0)
  theta = {"sgd": lopt.init(None)}
  with pytest.raises(ValueError, match="at least one theta"):
    compare_with_tuned_adam(evaluator, lopt, {}, key)
  with pytest.raises(ValueError, match="statistic"):
    compare_with_tuned_adam(evaluator, lopt, theta, key, statistic="mean")
  with pytest.raises(ValueError, match="differ from the evaluator"):
    compare_with_tuned_adam(evaluator, lopt, theta, key, num_tasks=8)
  with pytest.raises(ValueError, match="smoothing"):
    compare_with_tuned_adam(evaluator, lopt, theta, key, smoothing=NUM_STEPS + 1)
  small = FamilyEvaluator(evaluator.family, 4, NUM_STEPS)
  with pytest.raises(ValueError, match="at least 16 held-out instances"):
    compare_with_tuned_adam(small, lopt, theta, key)
