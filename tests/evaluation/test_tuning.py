"""metafam.evaluation.tuning: the one grid, procedure (`tune`) and selection rule, used by FamilyEvaluator.tune_adam,
the benchmark's sweeps and the suites' shipped baselines."""

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
  assert not {"default_learning_rates", "check_learning_rates", "select_best"} & set(vars(sweep))  # defined once
  with pytest.raises(ValueError, match="distinct finite positive"):
    tuning.check_learning_rates([0.1, 0.1])
  assert FamilyEvaluator(quadratic_family(), 4, 10, adam_lrs=(0.1, 0.01)).adam_lrs == (0.01, 0.1)  # ascending


# -- the procedure (tune) on an engine with a closed form ------------------------------------------------------------
CURVATURE = 2.0
SEEDS = np.array([1.0, -3.0])  # starting points x_0 of the two seeds
T = 20
EVAL = np.arange(T + 1)


def gd_trainer(calls=None, nan_at=None):
  """Gradient descent on f(x) = CURVATURE / 2 * x^2, exactly: x_t = (1 - lr * CURVATURE)^t x_0. inner_valid is
  f(x_t) at t = 0..T per seed; schedule "halved" runs at lr / 2. ``nan_at``: that rate's loss at t = 1 is NaN."""
  def train(lrs, schedules):
    if calls is not None:
      calls.append((np.array(lrs), tuple(schedules)))
    out = {}
    for s in schedules:
      factor = 1.0 - np.asarray(lrs)[:, None, None] * (0.5 if s == "halved" else 1.0) * CURVATURE
      with np.errstate(over="ignore", invalid="ignore"):
        loss = 0.5 * CURVATURE * (SEEDS[None, :, None] * factor ** EVAL) ** 2  # [L, S, E]
      if nan_at is not None:
        loss[list(lrs).index(nan_at), 0, 1] = np.nan
      out[s] = tuning.Lanes({"inner_valid": loss, "test": loss + 1.0})
    return out
  return train


def tail_score(lr):
  """The score of rate ``lr`` computed directly: the mean over seeds and t = 18, 19, 20 (the last 10% of 20 steps
  and the step itself: t >= 0.9 * 20) of f(x_t)."""
  with np.errstate(over="ignore"):
    return np.mean([0.5 * CURVATURE * (x0 * (1.0 - np.float64(lr) * CURVATURE) ** t) ** 2
                    for x0 in SEEDS for t in (18, 19, 20)])


def test_tune_picks_the_grid_point_with_the_lowest_inner_valid_loss_and_never_a_non_finite_one():
  grid = [0.05, 0.2, 0.3, 0.45, 0.75, 1e10]  # |1 - 2 lr|: 0.9, 0.6, 0.4, 0.1, 0.5; 1e10: inf from step 18 on
  tuned = tuning.tune(gd_trainer(), grid, EVAL)
  want = [tail_score(lr) for lr in grid]
  assert not np.isfinite(want[-1]) and int(np.nanargmin(want[:-1])) == 3  # 0.45: |1 - 0.9| = 0.1, the fastest
  np.testing.assert_allclose(tuned.scores["constant"][:-1], want[:-1], rtol=1e-12)
  assert np.isinf(tuned.scores["constant"][-1]) and tuned.diverged["constant"].tolist() == [False] * 5 + [True]
  assert tuned.learning_rate == 0.45 and tuned.schedule == "constant" and not tuned.at_edge
  # An early non-finite loss disqualifies the best rate, however good its tail: the next best wins.
  hurt = tuning.tune(gd_trainer(nan_at=0.45), grid, EVAL)
  assert hurt.diverged["constant"][3] and hurt.learning_rate == 0.3 == grid[int(np.argsort(want)[1])]
  # Every rate diverged: nothing is chosen.
  assert tuning.tune(gd_trainer(), [1e10, 1e11], EVAL).best_index == -1
  assert np.isnan(tuning.tune(gd_trainer(), [1e10, 1e11], EVAL).learning_rate)
  with pytest.raises(ValueError, match="distinct finite positive"):
    tuning.tune(gd_trainer(), [0.1, np.inf], EVAL)
  with pytest.raises(ValueError, match="distinct finite positive"):
    tuning.tune(gd_trainer(), [0.1, np.nan], EVAL)


def test_tune_extends_the_grid_past_an_edge_until_the_choice_is_interior():
  """The exact minimizer 0.5 (x_1 = 0) is the top of a ratio-3 grid: two rates above it (1.5, 4.5) are trained, in
  one call with only the new rates, and 0.5 stays the choice, now interior."""
  grid = 0.5 / 3.0 ** np.arange(4, -1, -1)
  calls = []
  tuned = tuning.tune(gd_trainer(calls), grid, EVAL, max_extensions=3)
  assert len(calls) == 2
  np.testing.assert_allclose(calls[1][0], [1.5, 4.5], rtol=1e-12)
  np.testing.assert_allclose(tuned.learning_rates, 0.5 / 3.0 ** np.arange(4, -3, -1), rtol=1e-12)
  assert tuned.learning_rate == pytest.approx(0.5) and not tuned.at_edge and tuned.scores["constant"][4] == 0.0
  lanes = tuned.lanes["constant"]  # the merged lanes are in grid order: row i is rate i's run
  alone = gd_trainer()(tuned.learning_rates[5:6], ["constant"])["constant"]
  np.testing.assert_array_equal(lanes.eval_losses["inner_valid"][5], alone.eval_losses["inner_valid"][0])
  once = tuning.tune(gd_trainer(), grid, EVAL)  # max_extensions=0: the grid as given
  assert once.best_index == 4 and once.at_edge and len(once.learning_rates) == 5


def test_tune_keeps_the_schedule_with_the_lower_score_ties_to_the_first_listed():
  grid = [0.1, 0.5, 1.0]  # constant 0.5 and halved 1.0 both reach x = 0 in one step: exact ties at score 0
  tuned = tuning.tune(gd_trainer(), grid, EVAL, schedules=("constant", "halved"))
  assert tuned.schedule == "constant" and tuned.learning_rate == 0.5
  assert tuned.best == {"constant": 1, "halved": 2}
  flipped = tuning.tune(gd_trainer(), grid, EVAL, schedules=("halved", "constant"))
  assert flipped.schedule == "halved" and flipped.learning_rate == 1.0
  only_small = tuning.tune(gd_trainer(), [0.1, 0.2, 0.3], EVAL, schedules=("halved", "constant"))
  assert only_small.schedule == "constant" and only_small.learning_rate == 0.3  # halved is slower on this grid
  with pytest.raises(ValueError, match="max_extensions must be an int >= 0"):
    tuning.tune(gd_trainer(), grid, EVAL, max_extensions=-1)


def test_every_tuned_baseline_goes_through_tune(monkeypatch):
  """FamilyEvaluator.tune_adam (the main job's comparison) and tune_baseline (every suite's baselines, shipped or
  custom, and tuned candidates) both call `tuning.tune`."""
  from metafam.benchmark import baselines
  calls = []
  real = tuning.tune

  def spy(*args, **kwargs):
    calls.append(kwargs.get("max_extensions", 0))
    return real(*args, **kwargs)
  monkeypatch.setattr(tuning, "tune", spy)
  FamilyEvaluator(quadratic_family(), 4, 10, adam_lrs=(1e-2, 1e-1)).tune_adam(jax.random.key(0))
  baselines.tune_baseline(QuadraticTask(4), "sgd", 8, factory=optax.sgd, learning_rates=(0.1, 0.3),
                          schedules=("constant",), num_seeds=2, max_extensions=0)
  assert calls == [0, 0]


def test_tune_adam_and_tune_baseline_share_select_best(monkeypatch):
  calls = []
  real = tuning.select_best

  def spy(*args, **kwargs):
    calls.append(np.shape(args[1]))
    return real(*args, **kwargs)
  monkeypatch.setattr(tuning, "select_best", spy)
  result = FamilyEvaluator(quadratic_family(), 4, 10, adam_lrs=(1e-2, 1e-1)).tune_adam(jax.random.key(0))
  assert calls == [(2, 4, 10)]  # [rates, instances, every step]
  assert result["best_lr"] in (1e-2, 1e-1)
  from metafam.benchmark import baselines
  baselines.tune_baseline(QuadraticTask(4), "sgd", 16, factory=optax.sgd, learning_rates=(1e-2, 1e-1),
                          schedules=("constant",), num_seeds=2, max_extensions=0)
  assert calls[1] == (2, 2, 9)  # [rates, seeds, eval points 0, 2, ..., 16]


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
