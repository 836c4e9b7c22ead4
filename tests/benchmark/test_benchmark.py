"""metafam.benchmark: suites, the tuning sweep, speedup and aggregate metrics, custom suites scored end to end."""

import csv
import json
import os
import sys

import jax
import numpy as np
import optax
import pytest

from metafam.benchmark import (SUITES, aggregate, format_table, get_suite, iqm, learned_optimizer, median,
                               resolve_tasks, running_min, score, select_best, speedup_over_baseline)
from metafam.benchmark import baseline_files as bf
from metafam.benchmark import baselines as bl
from metafam.evaluation import train_and_evaluate_vectorized
from metafam.optimizers.learned import LearnableAdam, LearnableSGD
from metafam.runs import checkpoint
from metafam.outer_trainers.meta_trainer import MetaTrainState
from metafam.tasks.quadratic import QuadraticTask
from metafam.tasks.registry import TASKS

LRS = np.logspace(-4, -1, 7)  # 1e-4, 3.2e-4, ..., 1e-1


# -- suites -------------------------------------------------------------------------------------------------------
def test_suites_name_registered_tasks():
  assert {"tiny", "small", "full"} <= set(SUITES)
  for name, tasks in SUITES.items():
    assert tasks and all(t in TASKS for t in tasks), name
  assert get_suite("tiny") == ["quadratic_10", "fmnist_mlp_8x8_32"]
  assert set(get_suite("full")) == set(TASKS)
  with pytest.raises(KeyError, match="tiny"):
    get_suite("nope")
  quad = QuadraticTask(3)
  assert [n for n, _ in resolve_tasks(["quadratic_10", quad])] == ["quadratic_10", quad.name]
  with pytest.raises(ValueError, match="unique"):
    resolve_tasks([quad, quad])


def test_the_heldout_and_test_suites_come_from_one_table_each_and_the_shipped_baselines_hold_them():
  """`metafam.tasks.registry.HELDOUT_SUITE` and `TEST_SUITE` are the one list of each suite's tasks (with their
  horizons, in generation order): the registry's tasks, the suite, its horizons and its `SuiteSpec` are read from
  them, and the shipped baselines file covers exactly those tasks at those horizons."""
  import json
  from metafam.benchmark import baseline_files as bf
  from metafam.benchmark.suites import HORIZONS, TEST_HORIZONS
  from metafam.tasks.registry import HELDOUT_SUITE, HELDOUT_TASKS, TEST_SUITE, TEST_TASKS
  for suite, table, horizons, builders in (("heldout", HELDOUT_SUITE, HORIZONS, HELDOUT_TASKS),
                                           ("test", TEST_SUITE, TEST_HORIZONS, TEST_TASKS)):
    names = list(table)
    assert SUITES[suite] == list(horizons) == list(builders) == list(bf.SUITE_SPECS[suite].horizons) == names
    assert horizons == {name: task.horizon for name, task in table.items()} == dict(bf.SUITE_SPECS[suite].horizons)
    assert all(TASKS[name] is builders[name] is table[name].build for name in names)
    with open(bf.SUITE_SPECS[suite].data_file, encoding="utf-8") as f:
      data = json.load(f)
    assert sorted(list(data["tasks"]) + list(data["pending"])) == sorted(names), suite
    assert {name: entry["horizon"] for name, entry in data["tasks"].items()} == {
        name: horizons[name] for name in data["tasks"]}, suite


# -- the sweep ----------------------------------------------------------------------------------------------------
def test_sgd_sweep_on_quadratic_picks_the_analytic_best_rate():
  """GD on ``0.5 * c * ||x||^2`` scales the loss by ``(1 - lr * c)^2`` per step, so after any number of steps the
  best rate of the grid is the one minimizing ``|1 - lr * c|`` and rates with ``|1 - lr * c| > 1`` diverge.

  With c = 60 the factors are 0.994, 0.981, 0.94, 0.81, 0.4, 0.90, 5.0: the best rate (1e-2) is inside the grid, the
  next one (3.2e-2) is stable but worse than 3.2e-3, and 1e-1 overflows to inf within 100 steps.
  """
  scale, steps = 60.0, 96
  task = QuadraticTask(10, scale=scale)
  result = bl.tune_baseline(task, "sgd", steps, learning_rates=LRS, schedules=("constant",), max_extensions=0,
                            num_seeds=2)
  factor = np.abs(1.0 - LRS * scale)
  scores = np.asarray(result.scores["constant"])
  np.testing.assert_array_equal(np.isinf(scores), factor > 1)
  assert result.learning_rate == pytest.approx(LRS[4]) == pytest.approx(1e-2) and not result.at_edge
  assert scores[3] < scores[5]
  assert np.asarray(result.test_curves).shape == (2, bl.EVALS_PER_RUN + 1)


def test_select_best_never_selects_a_diverged_rate():
  steps = np.array([0, 5, 10])
  losses = np.array([
      [[3.0, 2.0, 1.0], [3.0, 2.0, 1.2]],           # finite: score 1.1
      [[3.0, 1.0, np.nan], [3.0, 1.0, 0.1]],        # NaN at the end (np.argmin would pick it)
      [[3.0, np.inf, 0.01], [3.0, 0.5, 0.01]],      # inf on the way, tiny at the end
      [[3.0, 0.5, 0.5], [3.0, 0.5, 0.5]],           # finite losses but a NaN training loss
      [[3.0, 2.5, 0.9], [3.0, 2.5, 1.3]],           # finite: score 1.1, ties with rate 0
  ])
  train = np.ones((5, 2, 10))
  train[3, 1, 7] = np.nan
  scores, diverged, best = select_best(steps, losses, train, tail_fraction=0.1)
  np.testing.assert_array_equal(diverged, [False, True, True, True, False])
  assert best == 0  # exact tie with rate 4 goes to the smaller rate
  np.testing.assert_allclose(scores[[0, 4]], [1.1, 1.1])
  assert np.all(np.isinf(scores[1:4]))
  # The tail window: over the last half of the steps, rate 4 (1.8) loses to rate 0 (1.55).
  _, _, best = select_best(steps, losses[[4, 0]], select_at=10, tail_fraction=0.5)
  assert best == 1
  _, diverged, best = select_best(steps, losses[1:4], train[1:4])
  assert diverged.all() and best == -1


# -- speedup ------------------------------------------------------------------------------------------------------
def _exp(steps, tau):
  return np.exp(-np.asarray(steps, np.float64) / tau)


def test_speedup_on_curves_with_known_answers():
  t_opt, t_adam = np.arange(0, 501, 10), np.arange(0, 1001, 10)
  # The optimizer reaches exp(-10) at step 500, Adam at 1000: twice as fast.
  s = speedup_over_baseline(t_opt, _exp(t_opt, 50), t_adam, _exp(t_adam, 100))
  assert s.reached and s.value == pytest.approx(2.0, rel=1e-9) and s.baseline_steps_needed == pytest.approx(1000)
  # Off-grid crossing: Adam evaluated every 30 steps reaches exp(-500 / 40) at step 1250, between 1230 and 1260.
  t_coarse = np.arange(0, 1501, 30)
  s = speedup_over_baseline(t_opt, _exp(t_opt, 40), t_coarse, _exp(t_coarse, 100))
  assert s.reached and s.value == pytest.approx(2.5, rel=1e-6)
  # Linear interpolation where log-linear is impossible (losses below zero): 1 - t / 800 hits -0.0525 at 842.
  s = speedup_over_baseline(t_opt, np.full(t_opt.shape, -0.0525), t_adam, 1.0 - t_adam / 800.0)
  assert s.reached and s.value == pytest.approx(842 / 500, rel=1e-9)
  # Equal curves: 1.0; a slower optimizer: 0.5.
  assert speedup_over_baseline(t_opt, _exp(t_opt, 100), t_opt, _exp(t_opt, 100)).value == pytest.approx(1.0)
  assert speedup_over_baseline(t_opt, _exp(t_opt, 200), t_opt, _exp(t_opt, 100)).value == pytest.approx(0.5)
  # Never reached: capped at the baseline's run length over the optimizer's, and flagged.
  s = speedup_over_baseline(t_opt, _exp(t_opt, 50), t_opt, _exp(t_opt, 100))
  assert not s.reached and s.value == 1.0 and np.isnan(s.baseline_steps_needed)
  s = speedup_over_baseline(t_opt, _exp(t_opt, 20), t_adam, _exp(t_adam, 100))
  assert not s.reached and s.value == 2.0


def test_speedup_smooths_by_running_minimum_and_ignores_non_finite_values():
  t = np.arange(0, 101, 10)
  noisy = _exp(t, 50) * np.where(np.arange(t.size) % 2, 1.5, 1.0)  # bumps up every other point
  np.testing.assert_array_equal(running_min([3.0, np.nan, 2.0, 4.0, np.inf, 1.0]), [3, 3, 2, 2, 2, 1])
  s = speedup_over_baseline(t, _exp(t, 50), t, noisy)
  assert s.value == pytest.approx(1.0)  # the last point (100, not bumped) is where the running minimum gets there
  diverged = _exp(t, 50).copy()
  diverged[6:] = np.nan  # best-so-far exp(-50 / 50) at step 50, which the same-speed baseline reaches at 50
  assert speedup_over_baseline(t, diverged, t, _exp(t, 50)).value == pytest.approx(0.5)



def test_paired_speedups_compare_the_means_and_each_seed_with_the_same_seed():
  """Seed s of the optimizer decays at scale 50 * (s + 1), the baseline's seed s at 100 * (s + 1): each seed is
  twice as fast as the same baseline seed (exactly 2, log-linear curves), whichever axis holds the seeds; the means
  are compared as one curve each (`speedup_over_baseline` of the seed-mean curves)."""
  from metafam.evaluation.metrics import paired_speedups
  t_opt, t_adam = np.arange(0, 501, 10), np.arange(0, 1501, 10)
  opt = np.stack([_exp(t_opt, 50.0 * (s + 1)) for s in range(3)])      # [S, E]
  adam = np.stack([_exp(t_adam, 100.0 * (s + 1)) for s in range(3)])
  mean, seeds = paired_speedups(t_opt, opt, t_adam, adam)
  assert [s.value for s in seeds] == pytest.approx([2.0] * 3, rel=1e-9) and all(s.reached for s in seeds)
  want = speedup_over_baseline(t_opt, opt.mean(axis=0), t_adam, adam.mean(axis=0))
  assert mean == want and 1.0 < mean.value < 4.0
  mean_t, seeds_t = paired_speedups(t_opt, opt.T, t_adam, adam.T, axis=1)
  assert mean_t == mean and seeds_t == seeds
  assert paired_speedups(t_opt, opt, t_adam, adam[:2], per_seed=False)[1] == ()
  with pytest.raises(ValueError, match="pair seed s with the baseline's seed s: got 3 and 2 seeds"):
    paired_speedups(t_opt, opt, t_adam, adam[:2])

# -- aggregates ---------------------------------------------------------------------------------------------------
def test_iqm_median_and_bootstrap_intervals():
  assert iqm(np.arange(1, 9)) == pytest.approx(4.5)          # middle four of 1..8
  assert iqm([0, 0, 1, 2, 3, 4, 100, 100]) == pytest.approx(2.5)  # outliers cut
  assert iqm([1.0, 5.0, 9.0]) == pytest.approx(5.0)           # fewer than 4 values: the plain mean
  assert median([4.0, 1.0, 3.0, 100.0]) == pytest.approx(3.5)
  rng = np.random.default_rng(0)
  few, many = rng.normal(1.0, 0.5, 8), rng.normal(1.0, 0.5, 200)
  for stat in ("median", "iqm"):
    a, b = aggregate(few, stat, seed=1), aggregate(many, stat, seed=1)
    assert a.low <= a.value <= a.high and b.low <= b.value <= b.high
    assert (b.high - b.low) < 0.5 * (a.high - a.low)
    assert aggregate(few, stat, seed=1) == a  # seeded: reproducible
  agg = aggregate([2.0, np.nan, np.inf, 4.0], "median")
  assert (agg.value, agg.num_tasks, agg.num_excluded) == (3.0, 2, 2)
  one = aggregate([1.5], "iqm")
  assert one.value == one.low == one.high == 1.5
  assert np.isnan(aggregate([np.nan], "iqm").value)


# -- reports ------------------------------------------------------------------------------------------------------
def test_format_table_aligns_columns():
  text = format_table(["task", "loss", "flag"], [["a", 1.5, True], ["longer", 10.25, False]])
  assert text.splitlines() == ["task       loss  flag",
                               "------  -------  ----",
                               "a        1.5000  yes",
                               "longer  10.2500  no"]


def test_learned_optimizer_checks_theta(tmp_path):
  theta = LearnableSGD(0.1).init(jax.random.key(0))
  path = str(tmp_path / "theta.npz")
  checkpoint.save(path, theta, {})
  opt = learned_optimizer(LearnableSGD(), path)
  assert float(np.exp(opt.theta["log_lr"])) == pytest.approx(0.1)
  with pytest.raises(ValueError, match="does not fit"):
    learned_optimizer(LearnableAdam(), path)
  # A meta-training checkpoint: theta is taken from the MetaTrainState.
  state = MetaTrainState(theta=LearnableAdam(3e-3).init(jax.random.key(0)), opt_state=(), worker_states=(),
                         key_data=jax.random.key_data(jax.random.key(1)), step=np.int32(7))
  checkpoint.save(path, state, {"step": 7})
  opt = learned_optimizer(LearnableAdam(), path)
  assert float(LearnableAdam.hyperparameters(opt.theta)["lr"]) == pytest.approx(3e-3, rel=1e-5)


# -- a custom suite end to end: baselines made by the shipped procedure, then the candidate --------------------------
STEPS, SEEDS = 48, 2


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("ckpt") / "lsgd.npz")
  checkpoint.save(path, LearnableSGD(0.1).init(jax.random.key(0)), {"note": "bare theta"})
  cache = str(tmp_path_factory.mktemp("cache"))
  return score((LearnableSGD(), path), suite="tiny", horizon=STEPS, num_seeds=SEEDS, name="lsgd", progress=False,
               cache_dir=cache), cache


def test_score_on_the_tiny_suite(tiny_report):
  r, cache = tiny_report
  assert r.suite == bf.CUSTOM and list(r.rows) == ["adam", "lsgd"] and r.candidate == "lsgd"
  for name, e in r.rows.items():
    assert [s.task for s in e.scores] == ["quadratic_10", "fmnist_mlp_8x8_32"]
    for s in e.scores:
      steps, curves = e.curves[s.task]
      np.testing.assert_array_equal(steps, bl.eval_steps(STEPS))
      assert curves.shape == (SEEDS, bl.EVALS_PER_RUN + 1) and np.all(np.isfinite(curves))
      assert all(1.0 <= v < np.inf for v in s.seed_time_ratios) and s.pool == ("adam", "lsgd")
      assert all(0.0 <= v <= bl.REFERENCE_FACTOR for v in s.seed_speedups)
  adam = r.rows["adam"]
  for s in adam.scores:  # tuned Adam learns on both tasks, every seed
    curves = adam.curves[s.task][1]
    assert np.all(curves[:, -1] < 0.9 * curves[:, 0])
  # Normalized losses: an image classifier starts near chance (log 10 -> 1.0).
  mlp0 = adam.curves["fmnist_mlp_8x8_32"][1][:, 0]
  assert np.all((mlp0 > 0.8) & (mlp0 < 1.3))
  # The baselines' shards were kept: a second report reads them instead of training.
  assert sorted(os.listdir(os.path.join(cache, "baselines", "quadratic_10"))) == ["adam.json", "adam_reference.json"]
  agg = r.evaluation.aggregates["profile_score"]
  assert agg.num_tasks == 2 and agg.low <= agg.value <= agg.high and 0.0 <= agg.value <= 1.0
  assert "Over 2 tasks" in r.format()


def test_custom_report_files(tiny_report, tmp_path, monkeypatch):
  r, _ = tiny_report
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
  monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
  paths = r.write(str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == ["custom.json", "custom_tasks.csv"] == sorted(map(os.path.basename, paths))
  with open(tmp_path / "custom_tasks.csv") as f:
    rows = list(csv.DictReader(f))
  assert [row["task"] for row in rows] == ["quadratic_10", "fmnist_mlp_8x8_32"]
  assert all(float(row["time ratio"]) >= 1.0 for row in rows)
  with open(tmp_path / "custom.json") as f:
    doc = json.load(f)
  assert doc["candidate"] == "lsgd" and set(doc["summary"]) == {"lsgd", "adam"}


def test_custom_report_figures_with_matplotlib(tiny_report, tmp_path):
  pytest.importorskip("matplotlib")
  r, _ = tiny_report
  pngs = [p for p in r.write(str(tmp_path)) if p.endswith(".png")]
  assert sorted(map(os.path.basename, pngs)) == ["custom_curves.png", "profile.png"]
  for p in pngs:
    with open(p, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_custom_suites_refuse_bad_arguments_before_training():
  with pytest.raises(ValueError, match="horizon: a suite without shipped baselines needs the run length"):
    score(optax.adam, suite="tiny")
  with pytest.raises(ValueError, match="horizon must be a multiple of 8"):
    score(optax.adam, suite="tiny", horizon=50)
  with pytest.raises(ValueError, match=r"baselines \['adamax'\] have no rate grid"):
    score(optax.adam, suite="tiny", horizon=48, baselines=("adamax",))
  with pytest.raises(ValueError, match="self-tuning ruleset's single settings are chosen on the dev suite"):
    score(optax.adam, suite="tiny", horizon=48, ruleset="self_tuning")
  with pytest.raises(ValueError, match="the heldout suite fixes its horizons"):
    score(optax.adam, suite="heldout", horizon=48)
