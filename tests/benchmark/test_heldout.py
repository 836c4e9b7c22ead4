"""The heldout suite: known-answer metrics, the shipped normalizer file, the tasks, the command line."""

import json
import os
import subprocess
import sys
import types

import jax
import numpy as np
import optax
import pytest

from metafam import cli
from metafam.benchmark import baseline_files as bf
from metafam.benchmark import baselines as bl
from metafam.benchmark import heldout
from metafam.benchmark import report
from metafam.evaluation import scores as engine
from metafam.benchmark.suites import HORIZONS
from metafam.evaluation.metrics import optimality_gap, performance_profile, stratified_aggregate
from metafam.tasks.registry import HELDOUT_TASKS, get_task

HELDOUT_BASELINES = bf.SUITE_SPECS["heldout"].optimizers

T = 400
STEPS = np.arange(0, T + 1, T // 8)
REF_STEPS = np.arange(0, 4 * T + 1, T // 8)


def decay(steps, rate=3.0 / T):
  return 2.0 * np.exp(-rate * np.asarray(steps, np.float64))


def entry(reference_seeds=None, adam_final=None, others=None):
  """A normalizer-file entry whose reference is an exponential decay (log-linear interpolation is exact for it)."""
  ref = np.stack([decay(REF_STEPS)] * 3) if reference_seeds is None else reference_seeds
  adam = ref[:, :STEPS.size]
  base = {o: {"test_curves": (adam if o == "adam" else adam * 1.5).tolist(), "learning_rate": 1e-3,
              "schedule": "constant"} for o in HELDOUT_BASELINES}
  for o, final in (others or {}).items():
    c = np.array(adam)
    c[:, -1] = final
    base[o]["test_curves"] = c.tolist()
  return {"horizon": T, "eval_steps": STEPS.tolist(), "baselines": base,
          "reference": {"eval_steps": REF_STEPS.tolist(), "test_curves": ref.tolist()}}


# -- per-task metrics --------------------------------------------------------------------------------------------
def test_candidate_equal_to_tuned_adam_scores_one():
  e = entry()
  score = engine.score_task("t", e, np.asarray(e["baselines"]["adam"]["test_curves"]))
  assert score.speedup == 1.0 and score.seed_speedups == (1.0, 1.0, 1.0)
  assert score.loss_ratio == 1.0 and not score.speedup_capped and not score.diverged
  # ties with adam do not count against it; the others are 1.5x
  assert score.rank == 1 and score.num_ranked == len(HELDOUT_BASELINES) + 1


@pytest.mark.parametrize("k", [0.5, 1.5, 2.0, 3.0, 3.7])
def test_curve_shifted_by_factor_k_scores_k(k):
  curves = np.stack([decay(k * STEPS)] * 3)  # reaches at T what the reference reaches at k T
  score = engine.score_task("t", entry(), curves)
  np.testing.assert_allclose(score.speedup, k, rtol=1e-9)
  np.testing.assert_allclose(score.seed_speedups, k, rtol=1e-9)
  np.testing.assert_allclose(score.loss_ratio, decay(k * T) / decay(T), rtol=1e-12)


def test_speedups_beyond_the_reference_run_are_capped_and_flagged():
  score = engine.score_task("t", entry(), np.stack([decay(5.0 * STEPS)] * 3))
  assert score.speedup == 4.0 and score.speedup_capped


def test_a_diverged_seed_scores_zero_and_ranks_last():
  curves = np.stack([decay(2.0 * STEPS)] * 3)
  curves[1, -1] = np.nan
  score = engine.score_task("t", entry(), curves)
  assert score.diverged and score.seed_speedups[1] == 0.0 and score.seed_speedups[0] == pytest.approx(2.0)
  assert np.isnan(score.final_loss) and score.rank == len(HELDOUT_BASELINES) + 1 and not any(score.beats.values())


def test_rank_and_beats_count_lower_final_losses():
  finals = {"lion": 0.01, "muon": 0.02}  # better than the candidate's final loss
  curves = np.stack([decay(1.2 * STEPS)] * 3)
  score = engine.score_task("t", entry(others=finals), curves)
  assert score.rank == 3
  assert not score.beats["lion"] and not score.beats["muon"] and score.beats["adam"] and score.beats["sgd_nesterov"]
  assert engine.score_task("t", entry(others=finals), curves, exclude=("lion",)).rank == 2


def test_loss_gains_are_tuned_adams_final_loss_over_each_seeds_best():
  curves = np.stack([decay(2.0 * STEPS)] * 3)
  curves[0, -1] = curves[0, -3] * 1.1  # rises at the end: its gain uses the best loss by T, not the last one
  curves[2, -1] = np.inf  # diverged
  score = engine.score_task("t", entry(), curves)
  adam_final = decay(T)  # tuned Adam's seed-mean final loss (all its seeds are decay(STEPS))
  np.testing.assert_allclose(score.seed_loss_gains[:2], [adam_final / curves[0, -2], adam_final / decay(2.0 * T)],
                             rtol=1e-12)
  assert score.seed_loss_gains[2] == 0.0
  assert engine.score_task("t", entry(), np.asarray(entry()["baselines"]["adam"]["test_curves"])).seed_loss_gains \
      == (1.0, 1.0, 1.0)


def test_optimizers_tied_at_the_speedup_cap_are_ranked_by_their_loss_gains():
  # Both reach losses the 4T reference never reaches: their speedups tie at the cap, their loss gains do not.
  e = entry()
  scores = {k: (engine.score_task("t", e, np.stack([decay(k * STEPS)] * 3)),) for k in (5.0, 6.0)}
  evaluations = {k: engine.suite_evaluation(f"x{k:g}", s, {}, (), 0.0, "heldout") for k, s in scores.items()}
  assert evaluations[5.0].seed_speedups().tolist() == evaluations[6.0].seed_speedups().tolist() == [[4.0]] * 3
  np.testing.assert_allclose(evaluations[6.0].seed_loss_gains(), decay(T) / decay(6.0 * T), rtol=1e-12)
  [row] = report.paired_rows(evaluations[6.0], {"x5": evaluations[5.0]})
  row = dict(zip(report.PAIRED_HEADERS, row))
  assert row["P(candidate > baseline) [95% CI]"] == "0.50 [0.50, 0.50]"
  assert row["P(lower loss) [95% CI]"] == "1.00 [1.00, 1.00]"
  gain_difference = decay(T) / decay(6.0 * T) - decay(T) / decay(5.0 * T)
  assert row["IQM loss-gain difference [95% CI]"].startswith(f"{gain_difference:+.2f}")
  assert evaluations[6.0].aggregates[engine.LOSS_GAIN_IQM].value == pytest.approx(decay(T) / decay(6.0 * T))


def test_score_task_refuses_curves_off_the_eval_points():
  with pytest.raises(ValueError, match=r"curves must be \[seeds, 9\]"):
    engine.score_task("t", entry(), np.ones((3, 5)))


def test_a_factory_that_takes_num_steps_is_given_the_horizon():
  """A rule that depends on the run's length (a learned schedule) learns the task's horizon through ``num_steps``;
  a plain optax factory is called with the rate alone, as before."""
  seen = []

  def with_horizon(learning_rate, num_steps):
    seen.append(num_steps)
    return optax.sgd(learning_rate)

  tx = bl.scheduled(with_horizon, 64)(0.1, 0.0)
  tx.update({"w": np.ones(2, np.float32)}, tx.init({"w": np.zeros(2, np.float32)}))
  assert seen and set(seen) == {64}
  tx = bl.scheduled(optax.sgd, 64)(0.1, 1.0)  # warmup + cosine: the rate at step 0 is 0
  updates, _ = tx.update({"w": np.ones(2, np.float32)}, tx.init({"w": np.zeros(2, np.float32)}))
  np.testing.assert_array_equal(np.asarray(updates["w"]), 0.0)


# -- aggregates: IQM and the stratified bootstrap against hand-computed values --------------------------------------
def test_iqm_and_optimality_gap_hand_computed():
  scores = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])  # 8 pooled values: the middle 4 are 3..6
  assert stratified_aggregate(scores, "iqm", num_resamples=10).value == 4.5
  assert stratified_aggregate(scores, "median", num_resamples=10).value == 4.5  # median of task means 3,4,5,6
  assert optimality_gap(np.array([0.5, 2.0, 1.0, 0.0])) == pytest.approx(1 - (0.5 + 1 + 1 + 0) / 4)
  np.testing.assert_array_equal(performance_profile([0.5, 1.0, 2.0, np.nan], [0.5, 1.0, 3.0]), [0.75, 0.5, 0.0])


def test_stratified_bootstrap_interval_hand_computed():
  # One task, runs {1, 3}: a resample's IQM (= mean of 2) is 1, 2 or 3 with probabilities 1/4, 1/2, 1/4, so the
  # 2.5% and 97.5% quantiles over 2000 resamples are 1 and 3 (each end holds ~500 resamples, far from 2.5%).
  a = stratified_aggregate([[1.0], [3.0]], "iqm")
  assert (a.value, a.low, a.high, a.num_tasks) == (2.0, 1.0, 3.0, 1)
  # Strata: each task resamples only its own runs, so equal runs within each task give a zero-width interval
  # (a bootstrap over pooled scores would mix 0s and 10s).
  b = stratified_aggregate([[0.0, 10.0], [0.0, 10.0]], "iqm")
  assert (b.value, b.low, b.high) == (5.0, 5.0, 5.0)
  c = stratified_aggregate([[1.0, np.nan], [2.0, 3.0]], "mean")
  assert (c.value, c.num_tasks, c.num_excluded) == (1.5, 1, 1)
  with pytest.raises(ValueError, match="statistic must be one of"):
    stratified_aggregate([[1.0]], "max")


# -- the suite ---------------------------------------------------------------------------------------------------
def test_suite_has_at_least_sixteen_registered_tasks_with_horizons():
  assert len(HORIZONS) >= 16 and {1000, 2000} <= set(HORIZONS.values())
  assert all(h % bl.EVALS_PER_RUN == 0 for h in HORIZONS.values())
  batches = {int(n.rsplit("_b", 1)[1]) for n in HORIZONS}
  assert min(batches) == 32 and max(batches) == 256


def _vmap_and_determinism(name):
  task = get_task(name)
  keys = jax.random.split(jax.random.key(3), 2)
  params = jax.vmap(task.init)(keys)
  single = task.init(keys[1])
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[1], b), params, single)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), single, task.init(keys[1]))  # same seed, same init
  data = task.datasets.device_data("train")
  batch = data.sample(keys[0])
  jax.tree.map(np.testing.assert_array_equal, batch, data.sample(keys[0]))
  losses = jax.vmap(task.loss, in_axes=(0, None, None))(params, keys[0], batch)
  np.testing.assert_allclose(losses[1], task.loss(single, keys[0], batch), rtol=2e-5)  # float32 reassociation
  assert np.all(np.isfinite(losses))


def test_a_heldout_task_is_vmappable_and_deterministic_per_seed():
  _vmap_and_determinism("mnist_mlp_16x16_64_b32")  # the others: the slow test below


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HELDOUT_TASKS))
def test_every_heldout_task_is_vmappable_and_deterministic_per_seed(name):
  _vmap_and_determinism(name)


# -- the shipped normalizer file ---------------------------------------------------------------------------------
def test_normalizer_file_is_versioned_and_every_choice_is_interior_and_finite():
  data = heldout.load_normalizers()
  assert data["format_version"] == bf.FORMAT_VERSION and data["command"] == bf.COMMAND
  assert {"metafam", "jax", "optax"} <= set(data["versions"])
  assert sorted(list(data["tasks"]) + data["pending"]) == sorted(HORIZONS)
  for task, e in data["tasks"].items():
    assert e["horizon"] == HORIZONS[task] and e["eval_steps"] == bl.eval_steps(HORIZONS[task]).tolist()
    assert e["reference"]["eval_steps"][-1] == bl.REFERENCE_FACTOR * HORIZONS[task]
    for opt, b in e["baselines"].items():
      lrs = np.asarray(b["learning_rates"])
      assert lrs.size >= 7 and set(b["scores"]) == set(bl.SCHEDULES), (task, opt)
      i = int(np.argmin(np.abs(lrs - b["learning_rate"])))
      assert lrs[i] == b["learning_rate"] and 0 < i < lrs.size - 1 and not b["at_edge"], (task, opt, lrs)
      kept = np.asarray([np.inf if v is None else v for v in b["scores"][b["schedule"]]])
      assert np.isfinite(kept[i]) and kept[i] == kept.min(), (task, opt)  # the best rate, never a diverged one
      other = [np.inf if v is None else v for v in b["scores"][[s for s in bl.SCHEDULES if s != b["schedule"]][0]]]
      assert kept[i] <= min(other), (task, opt)  # the better schedule was kept
      assert np.all(np.isfinite(b["test_curves"]))


def test_normalizer_file_refuses_other_versions(tmp_path):
  path = tmp_path / "n.json"
  path.write_text(json.dumps({"format_version": 99, "tasks": {}}))
  with pytest.raises(heldout.NormalizerFileError, match="format version 99; this metafam reads version 1"):
    heldout.load_normalizers(str(path))
  path.write_text("not json")
  with pytest.raises(heldout.NormalizerFileError, match="cannot be read as JSON"):
    heldout.load_normalizers(str(path))


def _in_a_production_process(code):
  """JSON printed by ``python -c code`` in a child process that compiles as the baselines' generator did: XLA's
  default flags (this suite compiles with cheaper ones whose rounding differs; conftest.py) and JAX's default
  random-bit generation (this suite changes it; the shipped file records the default)."""
  assert heldout.load_normalizers()["versions"]["jax_threefry_partitionable"] == "True"
  env = dict(os.environ, XLA_FLAGS=os.environ["METAFAM_TEST_PRODUCTION_XLA_FLAGS"])
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout)


def _same_cpu_kind_as_the_generator():
  """Whether this CPU has AVX-512, as the x86-64 machines that generated the shipped heldout baselines had. XLA
  compiles for the host's instruction set, so on another one (e.g. an AVX2-only CPU) the float32 roundings differ,
  and a thousand training steps at a large rate amplify them: measured on an AVX2 AMD EPYC, the 1000-step Adam sweep
  of mnist_mlp_16x16_64_b32 reproduced the scores of the four smallest rates to 1e-6 relative but not the large ones
  (4-28% apart, as chaotic runs are)."""
  try:
    with open("/proc/cpuinfo") as f:
      return " avx512f" in f.read()
  except OSError:
    return False


@pytest.mark.slow
def test_normalizer_file_matches_a_rerun_of_one_task_sweep_exactly():
  data = heldout.load_normalizers()
  task_name = "mnist_mlp_16x16_64_b32"  # the cheapest complete task (one 42-lane program of 1000 steps)
  shipped = data["tasks"][task_name]["baselines"]["adam"]
  rerun = _in_a_production_process(
      "import json, sys; from metafam.benchmark import baselines as bl; from metafam.benchmark.suites import "
      "HORIZONS; from metafam.tasks import get_task; "
      f"json.dump(bl.tune_baseline(get_task({task_name!r}), 'adam', HORIZONS[{task_name!r}]).to_json(), sys.stdout)")
  # The grid's rates are float64 powers of 10, and numpy's vectorized power may round the last bit differently
  # across builds (the shipped 10^-1.5 is one float64 ulp from today's): 1e-15 relative, far below the float32 in
  # which the optimizer applies them, so the training and everything it produced must still match exactly.
  for field in ("learning_rate", "learning_rates"):
    np.testing.assert_allclose(rerun[field], shipped[field], rtol=1e-15, atol=0, err_msg=field)
  for field in ("schedule", "eval_steps", "at_edge"):
    assert rerun[field] == shipped[field], field
  if _same_cpu_kind_as_the_generator():
    for field in ("scores", "test_curves"):
      assert rerun[field] == shipped[field], field
  else:  # the same choice, and the non-chaotic part of the sweep (rates below the chosen one) to rounding
    best = shipped["learning_rates"].index(shipped["learning_rate"])
    for schedule, scores in shipped["scores"].items():
      np.testing.assert_allclose(rerun["scores"][schedule][:best], scores[:best], rtol=1e-5, err_msg=schedule)


# -- the command line --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--optimizer=nope"], "unknown optimizer 'nope'; valid names: .*schedule_free_adamw"),
    (["--optimizer=adam", "--learning_rate=0.1"], "--learning_rate: the heldout suite fixes"),
    (["--optimizer=adam", "--inner_steps=8", "--seeds=2"], "--inner_steps, --seeds: the heldout suite fixes"),
    (["--optimizer=mlp_lopt"], "--optimizer=mlp_lopt is a learned optimizer: give its meta-parameters"),
    ([], "--suite heldout needs --optimizer"),
])
def test_heldout_cli_bad_input_is_one_line_and_exit_code_2(args, message, capsys, tmp_path):
  import re
  code = cli.main(["metafam", "benchmark", "--suite=heldout", f"--output_dir={tmp_path / 'x'}"] + args)
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("metafam: error: ") and len(err.strip().splitlines()) == 1, err
  assert re.search(message, err), err
  assert not os.path.exists(tmp_path / "x")


# -- evaluate_suite ------------------------------------------------------------------------------------------------
def test_evaluate_suite_refuses_bad_candidates_and_tasks_before_training():
  from metafam.optimizers.learned import LearnableAdam
  data = {"tasks": {"t": entry()}, "pending": []}
  with pytest.raises(ValueError, match=r"tasks \['nope'\] have no shipped baselines; available: \['t'\]"):
    heldout.evaluate_suite(optax.adam, tasks=["nope"], data=data)
  with pytest.raises(ValueError, match="LearnedOptimizer without meta-parameters"):
    heldout.evaluate_suite(LearnableAdam(), data=data)
  with pytest.raises(ValueError, match="unknown optimizer 'adamax'; valid names: .*ademamix"):
    heldout.evaluate_suite("adamax", data=data)
  with pytest.raises(ValueError, match="candidate must be a factory lr -> optax.GradientTransformation"):
    heldout.evaluate_suite(3.0, data=data)
  for bad in (0, 2.5, "fast"):
    with pytest.raises((ValueError, TypeError), match="lane_chunk"):
      heldout.evaluate_suite(optax.adam, data=data, lane_chunk=bad)


def test_evaluate_suite_cache_resumes_an_interrupted_evaluation_and_refuses_another_candidates_files(
    tmp_path, monkeypatch):
  """Training is replaced by known curves (counted): a cached task is read instead of trained, NaN included, and
  scores exactly as when it was trained; a file of another candidate or setting is refused and left as it was."""
  from metafam.benchmark import sweep
  from metafam.optimizers.learned import LearnableAdam
  from metafam.tasks import registry
  data = {"tasks": {"t1": entry(), "t2": entry()}, "pending": []}
  raw = {"t1": np.asarray(data["tasks"]["t1"]["baselines"]["adam"]["test_curves"]) * 0.5,
         "t2": np.asarray(data["tasks"]["t2"]["baselines"]["adam"]["test_curves"]) * 2.0}
  raw["t2"][1, -1] = np.nan  # one diverged seed
  trained = []

  def fake_train_lanes(task, opt, theta, **kwargs):
    trained.append(task)
    return None, {"test": [raw[task]]}

  monkeypatch.setattr(registry, "get_task", lambda name: name)
  monkeypatch.setattr(sweep, "train_lanes", fake_train_lanes)
  monkeypatch.setattr(heldout, "normalize", lambda task, losses: np.asarray(losses, np.float64))
  lopt = LearnableAdam()
  theta = lopt.init(jax.random.key(0))
  cache = tmp_path / "cache"
  run = lambda th=theta, **kw: heldout.evaluate_suite((lopt, th), data=data, progress=False, cache_dir=cache, **kw)

  first = run()
  assert trained == ["t1", "t2"] and sorted(os.listdir(cache)) == ["t1.json", "t2.json"]
  again = run()
  assert trained == ["t1", "t2"]  # nothing retrained
  same = lambda a, b: repr(a.scores) == repr(b.scores)  # exact floats; NaN (a diverged task's loss) equals NaN
  assert same(again, first) and again.wall_time == first.wall_time
  assert again.evaluated_at == first.evaluated_at  # when the tasks were trained, not when they were read back
  for t in ("t1", "t2"):
    np.testing.assert_array_equal(again.curves[t][1], raw[t])  # NaN where it was NaN
  assert first.scores[1].diverged and not first.scores[0].diverged
  os.remove(cache / "t2.json")  # an evaluation interrupted during its second task
  resumed = run()
  assert trained == ["t1", "t2", "t2"] and same(resumed, first)
  with open(cache / "t2.json") as f:
    assert resumed.evaluated_at == json.load(f)["trained_at"] >= first.evaluated_at  # its last task's finish

  # The tuned grid of another CPU's libm (an ulp apart) still reads the cache; a grid that differs does not.
  grid = bl.grid(bl.REFERENCE)
  tuned = lambda rates: heldout.evaluate_suite("adam", data=data, progress=False, cache_dir=tmp_path / "tuned",
                                               learning_rates=rates)
  monkeypatch.setattr(bl, "tune_baseline", lambda *a, **k: (trained.append("tuned"), types.SimpleNamespace(
      test_curves=raw["t1"], learning_rate=1e-3, schedule="constant", at_edge=False))[1])
  tuned(grid)
  assert trained[-2:] == ["tuned", "tuned"]
  tuned(np.nextafter(grid, 1.0))
  assert trained.count("tuned") == 2  # read back
  with pytest.raises(ValueError, match=r"differs in \['learning_rates'\]"):
    tuned(grid * (1 + 1e-9))
  del trained[-2:]

  before = (cache / "t1.json").read_bytes()
  other = jax.tree.map(lambda a: a + 1.0, theta)
  with pytest.raises(ValueError, match=r"t1.json was written by another evaluation \(it differs in \['theta'\]\)"):
    run(other)
  with pytest.raises(ValueError, match=r"differs in \['extra'\]"):
    run(cache_identity={"checkpoint": "run/checkpoint.npz"})
  assert (cache / "t1.json").read_bytes() == before and trained == ["t1", "t2", "t2"]
  (cache / "t1.json").write_text("{not json")
  with pytest.raises(ValueError, match="t1.json is not a cached task of evaluate_suite"):
    run()
  with pytest.raises(ValueError, match="exists and is not a directory"):
    heldout.evaluate_suite((lopt, theta), data=data, progress=False, cache_dir=cache / "t2.json")


def test_a_cached_evaluation_is_read_back_without_training_and_pairs_with_a_new_candidate(tmp_path, monkeypatch):
  """`load_cached_evaluation` returns exactly what `evaluate_suite` returned (scores, curves, time), trains nothing,
  and refuses a directory missing a task, another suite's files, or files of two candidates without a name."""
  from metafam.benchmark import sweep
  from metafam.tasks import registry
  data = {"tasks": {"t1": entry(), "t2": entry()}, "pending": []}
  factor = {"a": 0.5, "b": 2.0}
  trained = []

  def fake_train_lanes(task, opt, theta, name, **kwargs):
    trained.append(task)
    return None, {"test": [np.asarray(data["tasks"][task]["baselines"]["adam"]["test_curves"]) * factor[name]]}

  monkeypatch.setattr(registry, "get_task", lambda name: name)
  monkeypatch.setattr(sweep, "train_lanes", fake_train_lanes)
  monkeypatch.setattr(heldout, "normalize", lambda task, losses: np.asarray(losses, np.float64))
  evaluate = lambda label, cache: heldout.evaluate_suite(optax.sgd(0.1), data=data, name=label, progress=False,
                                                         cache_dir=cache)
  a, b = evaluate("a", tmp_path / "a"), evaluate("b", tmp_path / "b")
  assert len(trained) == 4
  read = heldout.load_cached_evaluation(tmp_path / "a", data=data)
  assert len(trained) == 4 and read.name == "a"
  assert repr(read.scores) == repr(a.scores) and read.wall_time == a.wall_time
  assert read.evaluated_at == a.evaluated_at and read.aggregates == a.aggregates
  # Twice as fast on every seed of every task: read back, a beats b on every (seed, task) pair.
  row = report.paired_rows(read, {"b": heldout.load_cached_evaluation(tmp_path / "b", data=data)})[0]
  assert row[0] == "b" and row[1].startswith("1.00") and row[-1] == 2
  assert heldout.load_cached_evaluation(tmp_path / "a", data=data, tasks=["t2"]).name == "a"

  with pytest.raises(ValueError, match=r"no cached 'heldout' run of \['t3'\]"):
    heldout.load_cached_evaluation(tmp_path / "a", data={"tasks": {**data["tasks"], "t3": entry()}})
  with pytest.raises(ValueError, match="data holds the 'heldout' suite's baselines, not 'test'"):
    heldout.load_cached_evaluation(tmp_path / "a", data=data, suite="test")
  with pytest.raises(ValueError, match=r"differs in \['suite'\]"):
    heldout.load_cached_evaluation(tmp_path / "a", data={**data, "suite": "test"}, suite="test")
  with pytest.raises(ValueError, match="is not a directory"):
    heldout.load_cached_evaluation(tmp_path / "nowhere", data=data)
  os.replace(tmp_path / "b" / "t2.json", tmp_path / "a" / "t2.json")
  with pytest.raises(ValueError, match=r"several candidates \(\['a', 'b'\]\); give name"):
    heldout.load_cached_evaluation(tmp_path / "a", data=data)
  assert heldout.load_cached_evaluation(tmp_path / "a", data=data, name="mixed").name == "mixed"


@pytest.mark.slow
@pytest.mark.skipif(not _same_cpu_kind_as_the_generator(),
                    reason="bit-identical only on the instruction set that generated the shipped curves (AVX-512)")
def test_adam_at_the_reference_rate_reproduces_the_reference_run():
  """End to end: the candidate trains on the suite's seeds and keys, so Adam at the reference's constant rate
  retraces the shipped reference curve (same initializations, same batches) and scores as the reference itself."""
  data = heldout.load_normalizers()
  task = "mnist_mlp_16x16_64_b32"
  e = data["tasks"][task]
  # The reference's own optimizer: Adam with its rate held by inject_hyperparams (a fixed-rate optax.adam computes the
  # same update with other roundings, and 1000 chaotic steps amplify them), in a child process that compiles as the
  # generator did.
  steps, curves = (np.asarray(a) for a in _in_a_production_process(
      "import json, sys, optax; from metafam.benchmark import heldout; "
      f"adam = optax.inject_hyperparams(optax.adam)(learning_rate={e['reference']['learning_rate']!r}); "
      f"r = heldout.evaluate_suite(adam, tasks=[{task!r}], name='adam-reference-rate', progress=False); "
      f"json.dump([r.curves[{task!r}][0].tolist(), r.curves[{task!r}][1].tolist()], sys.stdout)"))
  reference = np.asarray(e["reference"]["test_curves"])[:, :len(steps)]
  np.testing.assert_array_equal(curves, reference)
  assert engine.score_task(task, e, curves) == engine.score_task(task, e, reference)


@pytest.mark.slow
def test_tuning_extends_the_grid_until_the_best_rate_is_interior():
  """SGD on 0.5 * ||x||^2: rate 1 reaches the minimum in one step (score exactly 0); it is the top of the grid
  1e-3 .. 1, so the tuner must add two rates above it (half a decade apart) to show it is the best."""
  from metafam.tasks.quadratic import QuadraticTask
  grid = 1e-3 * 10 ** (0.5 * np.arange(7))
  result = bl.tune_baseline(QuadraticTask(4), "sgd", 8, factory=optax.sgd, learning_rates=grid)
  np.testing.assert_allclose(result.learning_rates, 1e-3 * 10 ** (0.5 * np.arange(9)), rtol=1e-12)
  assert result.learning_rate == pytest.approx(1.0) and not result.at_edge
  assert result.scores["constant"][6] == 0.0 and result.schedule == "constant"  # ties go to the constant schedule
  assert np.isinf(result.scores["constant"][-1]) or result.scores["constant"][-1] > 1.0  # rate 10 blows up
