"""The main job's held-out comparison with tuned Adam: the suites' scores (`metafam.evaluation.scores`) with the
instances as seeds, on curves with known answers and on a trained family."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.evaluation.comparison import compare_with_tuned_adam, instance_curves, score_comparison, smooth_curves
from metafam.evaluation.family_eval import FamilyEvaluator
from metafam.evaluation.metrics import running_min
from metafam.evaluation.scores import REFERENCE_FACTOR
from metafam.optimizers.learned import LearnableAdam, LearnableSGD
from metafam.taskfamilies.quadratic import QuadraticFamily

T = 200


def exp_curves(rates, speed=1.0, num_steps=T):
  """``[num_steps, len(rates)]``: ``exp(-rate * speed * t)`` for t = 1..num_steps (log-linear, so interpolation is
  exact)."""
  t = np.arange(1, num_steps + 1, dtype=np.float64)[:, None]
  return np.exp(-np.asarray(rates)[None, :] * speed * t)


def compare_curves(rates, curves, smoothing=1, **kw):
  """Adam ``exp(-rate t)`` on each instance, run to T and (its reference) to 4T, against ``curves``."""
  return score_comparison("synthetic", exp_curves(rates), exp_curves(rates, num_steps=REFERENCE_FACTOR * T), curves,
                          adam_lr=1e-2, smoothing=smoothing, **kw)


def per_instance(cmp, name, field="seed_speedups"):
  return np.asarray(getattr(cmp.scores[name].scores[0], field))


def test_known_speedups_are_exact_and_the_cap_is_counted():
  """c(k t) against Adam's c(t): its loss at T is Adam's at kT, so the speedup is exactly k (log-linear curves make
  the interpolation exact) up to the reference's 4T; c(5t) is beyond it: at the cap 4 on every instance."""
  rates = np.linspace(0.005, 0.02, 16)
  cmp = compare_curves(rates, {f"x{k}": exp_curves(rates, k) for k in (0.5, 2.0, 2.5, 5.0)})
  for k in (0.5, 2.0, 2.5):
    np.testing.assert_allclose(per_instance(cmp, f"x{k}"), k, rtol=1e-9)
    assert cmp.speedup(f"x{k}").value == pytest.approx(k, rel=1e-9) and cmp.at_cap(f"x{k}") == 0
  np.testing.assert_array_equal(per_instance(cmp, "x5.0"), float(REFERENCE_FACTOR))
  assert cmp.at_cap("x5.0") == 16 and cmp.scores["x5.0"].scores[0].speedup_capped
  # Tuned Adam against its own reference (the same curve to T): 1.
  np.testing.assert_allclose(per_instance(cmp, cmp.adam_label), 1.0)


def test_time_ratios_are_measured_against_everyone_in_the_table():
  """The pool is tuned Adam and every theta: the fastest (c(5t)) has ratio 1 everywhere; c(2t) reaches its own
  result at T, which c(5t) reached at 2T/5 (ratio 2.5); Adam's result, c(5t) reaches at T/5 (ratio 5, profile 0)."""
  rates = np.linspace(0.005, 0.02, 8)
  cmp = compare_curves(rates, {"x2": exp_curves(rates, 2.0), "x5": exp_curves(rates, 5.0)})
  np.testing.assert_allclose(per_instance(cmp, "x5", "seed_time_ratios"), 1.0)
  np.testing.assert_allclose(per_instance(cmp, "x2", "seed_time_ratios"), 2.5, rtol=1e-9)
  np.testing.assert_allclose(per_instance(cmp, cmp.adam_label, "seed_time_ratios"), 5.0, rtol=1e-9)
  assert cmp.scores["x5"].aggregates["profile_score"].value == pytest.approx(1.0)
  assert cmp.scores["x2"].aggregates["profile_score"].value == pytest.approx((4 - 2.5) / 3)
  assert cmp.scores[cmp.adam_label].aggregates["profile_score"].value == pytest.approx(0.0)


def test_a_diverged_instance_scores_zero_and_the_rest_still_count():
  rates = np.full(4, 0.02)
  learned = exp_curves(rates, 2.0)
  learned[150:, 0] = np.inf  # diverged at step 151
  cmp = compare_curves(rates, {"learned": learned})
  np.testing.assert_allclose(per_instance(cmp, "learned"), [0.0, 2.0, 2.0, 2.0], rtol=1e-9)
  assert cmp.scores["learned"].scores[0].diverged and np.isnan(cmp.final_loss("learned"))


def test_median_interval_contains_the_known_speedup():
  """Per-instance speedups scattered around 2 (noisy curves, then smoothed): the median's bootstrap interval over
  instances holds the true median, and the point estimate is close to it."""
  rng = np.random.default_rng(0)
  rates = rng.uniform(0.002, 0.006, 32)
  speeds = 2.0 * np.exp(rng.normal(0.0, 0.1, 32))  # per-instance true speedups, median about 2
  noise = lambda n: rng.normal(0.0, 0.002, (n, 32))
  adam, reference = 0.3 + exp_curves(rates), 0.3 + exp_curves(rates, num_steps=4 * T)
  cmp = score_comparison("noisy", adam + noise(T), reference + noise(4 * T),
                         {"learned": 0.3 + exp_curves(rates * speeds) + noise(T)}, adam_lr=1e-2, smoothing=10)
  agg = cmp.speedup("learned")
  assert agg.statistic == "median" and agg.low <= np.median(speeds) <= agg.high
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


def test_score_comparison_checks_shapes():
  rates = np.full(3, 0.01)
  with pytest.raises(ValueError, match="num_steps, num_tasks"):
    compare_curves(rates, {"a": np.ones((T, 2))})
  with pytest.raises(ValueError, match="reference"):
    score_comparison("f", exp_curves(rates), exp_curves(rates), {"a": exp_curves(rates)}, adam_lr=1e-2)


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
  """Tuned Adam's own theta as the "learned" optimizer scores exactly as tuned Adam does: on each instance, the step
  at which its smoothed running minimum first reaches its value at T, over T (the reference's first T steps are the
  same run). SGD with a negligible learning rate ends where it started, which Adam passes after one step: speedup
  exactly 1/T on every instance, and time ratio T (profile score 0)."""
  key = jax.random.key(4)
  adam = LearnableAdam()
  lr = evaluator.tune_adam(key)["best_lr"]
  same = dict(adam.init(None), log_lr=jnp.log(jnp.float32(lr)))
  sgd = LearnableSGD(1e-7)
  cmp = compare_with_tuned_adam(evaluator, adam, {"adam as learned": same}, key)
  assert cmp.adam_lr == lr and list(cmp.scores) == ["adam as learned", cmp.adam_label]
  np.testing.assert_allclose(cmp.curves["adam as learned"], cmp.adam_curves, rtol=1e-6)
  smooth = running_min(smooth_curves(cmp.adam_curves, cmp.smoothing))
  first = np.argmax(smooth <= smooth[-1], axis=0) + 1
  np.testing.assert_allclose(per_instance(cmp, "adam as learned"), first / NUM_STEPS)
  np.testing.assert_allclose(per_instance(cmp, cmp.adam_label), first / NUM_STEPS)

  cmp = compare_with_tuned_adam(evaluator, sgd, {"frozen": sgd.init(None)}, key, statistic="iqm")
  np.testing.assert_allclose(per_instance(cmp, "frozen"), 1.0 / NUM_STEPS)
  np.testing.assert_allclose(per_instance(cmp, "frozen", "seed_time_ratios"), NUM_STEPS)
  assert cmp.speedup("frozen").statistic == "iqm" and cmp.final_loss("frozen") > cmp.adam_final_loss
  summary = json.loads(json.dumps(cmp.to_json()))  # JSON-able
  frozen = summary["learned"]["frozen"]
  assert summary["adam"]["lr"] == lr and summary["reference_steps"] == REFERENCE_FACTOR * NUM_STEPS
  assert len(frozen["speedup_per_instance"]) == NUM_TASKS and frozen["at_cap"] == 0
  assert frozen["profile_score"]["value"] == 0.0 and frozen["speedup"]["value"] == pytest.approx(1 / NUM_STEPS)
  table = cmp.format_table()
  assert "frozen" in table and "Adam (tuned lr=" in table and "0.03 [0.03, 0.03]" in table
  assert list(cmp.mean_curves()) == ["frozen", cmp.adam_label] and list(cmp.learned) == ["frozen"]


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
