"""FamilyEvaluator: held-out curves, the vmapped Adam learning-rate sweep, its devices option and program cache."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meta_setup import quadratic_family
from metafam._identity import IdentityCache
from metafam.evaluation.comparison import instance_curves
from metafam.evaluation.family_eval import FamilyEvaluator
from metafam.optimizers.learned import LearnableAdam, LearnableSGD
from metafam.taskfamilies.quadratic import QuadraticFamily

LRS = (1e-3, 1e-2, 1e-1, 3.0)
NUM_TASKS, NUM_STEPS = 4, 30


def test_evaluate_matches_plain_sgd_on_quadratics():
  """Learnable SGD with lr on 0.5 * s * ||x - t||^2 contracts the error by (1 - lr * s) per step, so the loss after
  step k is loss_0 * (1 - lr * s)^(2k) per instance; with s = 1 that is one curve for every instance."""
  family, lr = QuadraticFamily(8), 0.05  # scale 1
  curve = FamilyEvaluator(family, NUM_TASKS, NUM_STEPS).evaluate(LearnableSGD(lr), LearnableSGD(lr).init(None),
                                                               jax.random.key(0))
  assert curve.shape == (NUM_STEPS,)
  ratios = curve[1:] / curve[:-1]
  np.testing.assert_allclose(ratios, (1 - lr) ** 2, rtol=1e-4)


@pytest.fixture(scope="module")
def sweep():
  """One evaluator shared by the tests below, so its programs compile once."""
  return FamilyEvaluator(quadratic_family(), NUM_TASKS, NUM_STEPS, split="test", select_split="inner_valid",
                         adam_lrs=LRS)


def test_tune_adam_scores_equal_separate_runs_per_learning_rate(sweep):
  """The one-program sweep (lane group j = lr j, lane j * n + i on instance i) scores each lr exactly as a separate
  evaluation of Adam with that lr on the same key does; a diverging lr is never chosen."""
  key = jax.random.key(1)
  result = sweep.tune_adam(key)
  select = FamilyEvaluator(sweep.family, NUM_TASKS, NUM_STEPS, split="inner_valid")
  adam, base = LearnableAdam(), LearnableAdam().init(None)
  tail = max(1, NUM_STEPS // 10)
  for lr, score in zip(LRS, result["select_scores"]):
    curve = select.evaluate(adam, dict(base, log_lr=jnp.log(jnp.float32(lr))), key)
    want = curve[-tail:].mean()
    np.testing.assert_allclose(score, want if np.isfinite(want) else np.inf, rtol=1e-5)
  assert result["best_lr"] == LRS[int(np.argmin(result["select_scores"]))]
  best = sweep.evaluate(adam, dict(base, log_lr=jnp.log(jnp.float32(result["best_lr"]))), key)
  np.testing.assert_allclose(result["curve"], best, rtol=1e-6)


def test_two_devices_give_the_same_curves(sweep):
  """The sweep and the chosen lr's `evaluate` curve on 2 devices equal those on one."""
  key = jax.random.key(2)
  sharded = FamilyEvaluator(sweep.family, NUM_TASKS, NUM_STEPS, split="test", select_split="inner_valid",
                            adam_lrs=LRS, devices=2)
  assert sweep.mesh is None and sharded.mesh is not None
  want, got = sweep.tune_adam(key), sharded.tune_adam(key)
  assert got["best_lr"] == want["best_lr"]
  np.testing.assert_allclose(got["select_scores"], want["select_scores"], rtol=1e-5)
  np.testing.assert_allclose(got["curve"], want["curve"], rtol=1e-5)


def test_bad_arguments_are_rejected_before_any_work():
  family = quadratic_family()
  with pytest.raises(ValueError, match="num_tasks=3 lanes cannot be split evenly over 2 devices"):
    FamilyEvaluator(family, num_tasks=3, devices=2)
  with pytest.raises(ValueError, match="adam_lrs must be positive"):
    FamilyEvaluator(family, adam_lrs=(0.1, -1.0))
  with pytest.raises(ValueError, match="adam_lrs must be positive learning rates \\(distinct"):
    FamilyEvaluator(family, adam_lrs=(0.1, 0.1))


def test_cached_programs_do_not_keep_a_learned_optimizer_alive(sweep):
  """A learned optimizer evaluated once (also through `instance_curves`) is garbage-collected after ``del`` while
  the evaluator lives on; while it lives, its program is compiled once and reused."""
  lopt, key = LearnableSGD(0.05), jax.random.key(3)
  first = sweep.evaluate(lopt, lopt.init(None), key)
  np.testing.assert_allclose(instance_curves(sweep, lopt, lopt.init(None), key).mean(axis=1), first, rtol=1e-6)
  n = sweep.num_steps
  assert sweep._program(lopt, sweep.split, 1, False, n) is sweep._program(lopt, sweep.split, 1, False, n)
  ref, live = weakref.ref(lopt), len(sweep._programs)
  del lopt
  gc.collect()
  assert ref() is None and len(sweep._programs) == live - 1
  again = LearnableSGD(0.05)
  np.testing.assert_allclose(sweep.evaluate(again, again.init(None), key), first, rtol=1e-6)


def test_identity_cache_drops_dead_objects_and_holds_the_others():
  class Slotted:
    __slots__ = ("x",)

  class Plain:
    pass

  cache, built = IdentityCache(), []
  weak, strong = Plain(), Slotted()
  for obj in (weak, strong, weak):
    assert cache.get(obj, "k", lambda: built.append(1) or len(built)) == (1 if obj is weak else 2)
  ref = weakref.ref(weak)
  del weak, obj
  gc.collect()
  assert ref() is None and len(cache) == 1 and len(cache._entries) == 1  # the slotted object is held strongly
  assert cache.get(strong, "k", lambda: 99) == 2
