"""The one scoring path: the candidate contract, the time-ratio headline against known answers, the rulesets, and the
Python API, `score` and the command line giving the same numbers."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metafam import cli
from metafam.benchmark import baseline_files as bf
from metafam.benchmark import heldout, resolve_candidate, schedule_factory, score
from metafam.evaluation import scores as engine
from metafam.benchmark.candidates import CANDIDATE_SUFFIX, at_schedule
from metafam.evaluation.metrics import profile_score, time_ratio
from metafam.optimizers.base import OptaxOptimizer, schedule_free_eval_params
from metafam.tasks.quadratic import QuadraticTask

T = 400
STEPS = np.arange(0, T + 1, T // 8)


def decay(rate):
  return 2.0 * np.exp(-rate * STEPS / T)


# -- the headline: time ratios and profile scores ------------------------------------------------------------------
def test_time_ratio_known_answers():
  """Exponential decays: log-linear interpolation is exact, so a curve decaying twice as fast reaches the slow
  curve's final loss at exactly T / 2."""
  slow, fast = decay(3.0), decay(6.0)
  assert time_ratio(STEPS, slow, [fast]) == pytest.approx(2.0, rel=1e-12)
  assert time_ratio(STEPS, fast, [slow]) == 1.0  # nobody reaches the fast curve's result sooner
  assert time_ratio(STEPS, slow, []) == 1.0  # alone, a still-improving run is its own fastest
  plateau = np.maximum(decay(6.0), decay(6.0)[4])  # reaches its best at T / 2, then stays
  assert time_ratio(STEPS, plateau, []) == pytest.approx(2.0, rel=1e-12)  # half its budget was wasted
  assert time_ratio(STEPS, np.append(slow[:-1], np.nan), [fast]) == np.inf  # no result
  assert time_ratio(STEPS, np.full(STEPS.size, 2.0), [fast]) == np.inf  # never improved on the start
  np.testing.assert_allclose(profile_score(np.array([1.0, 2.0, 4.0, 9.0, np.inf, 0.5])),
                             [1.0, 2.0 / 3.0, 0.0, 0.0, 0.0, 1.0])


def test_score_task_time_ratios_are_measured_against_the_pool_and_never_capped():
  entry = {"horizon": T, "eval_steps": STEPS.tolist(),
           "baselines": {"adam": {"test_curves": [decay(3.0).tolist()] * 3}},
           "reference": {"eval_steps": np.arange(0, 4 * T + 1, T // 8).tolist(),
                         "test_curves": [(2.0 * np.exp(-3.0 * np.arange(0, 4 * T + 1, T // 8) / T)).tolist()] * 3}}
  fast = np.stack([decay(30.0)] * 3)  # far beyond what the reference reaches in 4T: the speedup is a bound
  s = engine.score_task("t", entry, fast)
  assert s.speedup_capped and s.speedup == 4.0 and s.time_ratio == 1.0 and s.seed_time_ratios == (1.0,) * 3
  slow = engine.score_task("t", entry, np.stack([decay(3.0)] * 3), pool={"fast": fast})
  assert slow.pool == ("fast",) and slow.time_ratio == pytest.approx(10.0, rel=1e-9)  # a value, not a bound
  assert slow.seed_profile_scores == (0.0,) * 3 and s.seed_profile_scores == (1.0,) * 3


def test_shipped_baselines_are_values_on_every_task():
  """The headline resolves the top: on both suites every shipped baseline's time ratio is a finite value >= 1 on
  every task (the speedup over tuned Adam saturated at its cap for tuned Muon on most test tasks)."""
  for suite in ("heldout", "test"):
    for name, e in heldout.baseline_evaluations(heldout.load_normalizers(suite=suite)).items():
      for s in e.scores:
        assert 1.0 <= s.time_ratio < np.inf and all(1.0 <= r < np.inf for r in s.seed_time_ratios), (suite, name)
      assert 0.0 < e.aggregates[engine.PROFILE_SCORE].value <= 1.0


# -- the candidate contract ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, message", [
    (optax.warmup_cosine_decay_schedule(0.0, 1.0, 10, 100), "returned ArrayImpl, not an optax.GradientTransformation "
                                                            r"\(an optax schedule\?"),
    (optax.adam(1e-3), "whole optax transformation, scored untuned at its own settings: give it a name"),
    ("prodigy", "unknown optimizer 'prodigy'; valid names: .*; or give a factory as module:function"),
    ("optax.contrib:nope", "'optax.contrib' has no attribute 'nope'"),
    ("no_such_module_x:f", "cannot import 'no_such_module_x'"),
    ("sys:maxsize", "'sys:maxsize' is an int, not a callable"),
    ("math:pi", "'math:pi' is a float, not a callable"),
    (lambda lr, *, must: optax.adam(lr), r"failed when called with learning rate 0.001 \(TypeError"),
    (lambda lr: optax.sgd(lr if lr > 0.1 else 0.0), "cannot be scheduled per step"),  # Python control flow on lr
    (3.0, "must be a factory lr -> optax.GradientTransformation"),
])
def test_refused_candidates_get_one_line_before_training(bad, message):
  with pytest.raises(ValueError, match=message) as info:
    resolve_candidate(bad)
  assert "\n" not in str(info.value)


def test_accepted_candidates_and_their_labels():
  sf = lambda lr: optax.contrib.schedule_free_adamw(lr, warmup_steps=20)
  assert resolve_candidate(sf).kind == "factory" and resolve_candidate(sf).name == "candidate"
  assert resolve_candidate(sf, "sf").name == "sf"
  assert resolve_candidate("optax.contrib:prodigy").name == "prodigy"
  assert resolve_candidate(optax.adam(1e-3), "adam-1e-3").kind == "fixed"
  assert resolve_candidate("adam", baselines=("adam", "muon")).name == "adam" + CANDIDATE_SUFFIX
  assert resolve_candidate("generalist_v2").tuned


def test_a_float_factory_and_a_schedule_factory_follow_the_same_schedule():
  """At a warmup + cosine schedule, Adam built from each step's float rate (inject_hyperparams) and Adam given the
  schedule agree update for update (float32 rounding of the same arithmetic)."""
  schedule = optax.warmup_cosine_decay_schedule(0.0, 0.1, 5, 40)
  params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)}
  txs = [at_schedule(optax.adam, schedule, 40), at_schedule(schedule_factory(optax.adam), schedule, 40)]
  states = [tx.init(params) for tx in txs]
  for step in range(12):
    grad = jax.tree.map(lambda p: jnp.sin(p * (step + 1)), params)
    out = [tx.update(grad, st, params) for tx, st in zip(txs, states)]
    states = [o[1] for o in out]
    np.testing.assert_allclose(out[0][0]["w"], out[1][0]["w"], rtol=1e-6, atol=1e-9)


def test_schedule_free_is_evaluated_at_its_averaged_point():
  task = QuadraticTask(4)
  opt = OptaxOptimizer(optax.inject_hyperparams(optax.contrib.schedule_free_adamw)(learning_rate=0.1))
  state = opt.init(task.init(jax.random.key(0)))
  for _ in range(5):
    state = opt.update(state, jax.grad(task.loss)(opt.get_params(state), None, None))
  sf_state = state.opt_state.inner_state
  expected = optax.contrib.schedule_free_eval_params(sf_state, state.params)
  np.testing.assert_array_equal(opt.eval_params(state), expected)
  assert not np.array_equal(expected, state.params)  # the averaged point differs from the trained one
  plain = OptaxOptimizer(optax.adam(0.1))
  pstate = plain.init(task.init(jax.random.key(0)))
  assert plain.eval_params(pstate) is pstate.params
  with pytest.raises(ValueError, match="2 schedule-free states"):
    schedule_free_eval_params((sf_state, sf_state), state.params)


# -- one path: the Python API, score and the command line --------------------------------------------------------
TASK = "mnist_mlp_16x16_256x256_gelu_b64"  # the cheapest dev task: 200 steps


def _factory_module(tmp_path, monkeypatch):
  (tmp_path / "my_factories.py").write_text(
      "import optax\n\ndef schedule_free(lr):\n  return optax.contrib.schedule_free_adamw(lr, warmup_steps=20)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  sys.modules.pop("my_factories", None)


@pytest.mark.slow  # three tuned runs of a factory on a dev task (about a minute)
def test_the_api_score_and_the_command_line_give_the_same_numbers(tmp_path, monkeypatch, capsys):
  """A user's factory (schedule-free AdamW with its own warmup, which died inside optax when it was handed a
  schedule) on one dev task: `evaluate_suite`, `score` and `metafam benchmark --optimizer module:function` train it
  once each and agree exactly."""
  _factory_module(tmp_path, monkeypatch)
  import my_factories
  direct = heldout.evaluate_suite(my_factories.schedule_free, tasks=[TASK], schedules=("constant",),
                                  name="schedule_free", progress=False)
  report = score("my_factories:schedule_free", suite="heldout", tasks=[TASK], schedules=("constant",),
                 progress=False)
  out = tmp_path / "out"
  code = cli.main(["metafam", "benchmark", "--suite=heldout", f"--tasks={TASK}", "--schedules=constant",
                   "--optimizer=my_factories:schedule_free", "--name=schedule_free", "--progress=false",
                   "--ruleset=external", f"--output_dir={out}"])
  assert code == 0, capsys.readouterr().err
  with open(out / "heldout.json") as f:
    from_cli = json.load(f)["tasks"][0]
  ours, theirs = direct.scores[0], report.evaluation.scores[0]
  assert report.candidate == "schedule_free" and ours.setting == theirs.setting == from_cli["setting"]
  for field in ("seed_speedups", "seed_time_ratios", "seed_loss_gains", "final_loss"):
    assert getattr(ours, field) == getattr(theirs, field), field
    assert np.allclose(getattr(ours, field), from_cli[field], rtol=0, atol=0), field
  assert direct.aggregates["profile_score"] == report.evaluation.aggregates["profile_score"]
  assert "profile score" in capsys.readouterr().out


def test_a_custom_suite_trains_the_candidate_exactly_as_a_shipped_one():
  """The same task through the shipped suite and as a custom suite (no baselines): the same keys, seeds,
  evaluation points and batches give the same curves, bit for bit."""
  tx = optax.adam(1e-3)
  shipped = heldout.evaluate_suite(tx, tasks=[TASK], name="adam-1e-3", progress=False)
  custom = score(tx, suite=[TASK], horizon=bf.suite_spec("heldout").horizons[TASK], baselines=(), name="adam-1e-3",
                 progress=False)
  np.testing.assert_array_equal(shipped.curves[TASK][1], custom.evaluation.curves[TASK][1])


@pytest.mark.slow  # trains every baseline at its single setting on a dev task
def test_self_tuning_runs_a_baseline_name_at_its_single_dev_setting(tmp_path):
  """Under the self-tuning ruleset the candidate 'adam' runs at Adam's best single dev setting, so its row is the
  single-setting Adam baseline's, and the pool holds no per-task tuned run."""
  report = score("adam", suite="heldout", ruleset="self_tuning", tasks=[TASK], progress=False,
                 cache_dir=str(tmp_path / "cache"))
  candidate, adam = report.evaluation, report.rows["adam"]
  assert candidate.name == "adam (candidate)" and report.settings["adam"] == report.settings[candidate.name]
  np.testing.assert_array_equal(candidate.curves[TASK][1], adam.curves[TASK][1])
  assert candidate.scores[0].seed_time_ratios == adam.scores[0].seed_time_ratios
  assert set(candidate.scores[0].pool) == set(report.rows)


def test_self_tuning_command_line_refuses_a_factory_without_a_rate(tmp_path, monkeypatch, capsys):
  _factory_module(tmp_path, monkeypatch)
  out = tmp_path / "out"
  for args, message in [
      (["--ruleset=self_tuning", "--optimizer=my_factories:schedule_free"], "give --learning_rate"),
      (["--ruleset=self_tuning", "--optimizer=adam", "--schedules=constant,warmup_cosine"], "one schedule"),
      (["--optimizer=adam", "--learning_rate=0.01"], "--learning_rate: the heldout suite fixes"),
      (["--optimizer=adam", "--tasks=nope"], "--tasks: ['nope'] have no shipped baselines"),
      (["--optimizer=my_factories:nope"], "--optimizer 'my_factories:nope': 'my_factories' has no attribute"),
  ]:
    code = cli.main(["metafam", "benchmark", "--suite=heldout", f"--output_dir={out}"] + args)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, (args, err)
    assert not os.path.exists(out)
