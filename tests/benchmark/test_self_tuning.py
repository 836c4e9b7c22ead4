"""The self-tuning score (`metafam.benchmark.self_tuning`): the best single setting (`single_rate`) on synthetic
sweeps with known answers, its input checks, on the shipped dev data, and the curves at a setting on a tiny real
suite."""

import math

import numpy as np
import pytest

from metafam.benchmark import baseline_files as bf
from metafam.benchmark import baselines as bl
from metafam.benchmark import heldout
from metafam.benchmark import self_tuning as st
from metafam.benchmark import single_rate as sr

RATES = (1e-3, 1e-2, 1e-1)


def sweep_data(scores, rates=None, optimizer="adam", suite=None):
  """A baselines dict of one optimizer: ``scores[task]`` is a list of scores (constant only) or ``{schedule:
  list}``; ``rates[task]`` its swept rates (default `RATES`); the tuned setting is each task's lowest score."""
  tasks = {}
  for task, s in scores.items():
    s = s if isinstance(s, dict) else {"constant": s}
    lrs = list((rates or {}).get(task, RATES))
    best = min(((v, sched, lrs[i]) for sched, vs in s.items() for i, v in enumerate(vs) if v is not None),
               key=lambda x: x[0])
    tasks[task] = {"baselines": {optimizer: {"learning_rates": lrs, "scores": s, "schedule": best[1],
                                             "learning_rate": best[2]}}}
  data = {"tasks": tasks}
  if suite:
    data["suite"] = suite
  return data


# -- the rule on synthetic sweeps ---------------------------------------------------------------------------------
def test_hand_computation_geometric_mean():
  # regrets (score / the task's best): rate 1e-3 -> (1, 4): geometric mean 2 (arithmetic 2.5); 1e-2 -> (2.2, 2.2):
  # 2.2 (2.2); 1e-1 -> (10, 1): sqrt(10). The geometric mean picks 1e-3 where the arithmetic mean would pick 1e-2.
  data = sweep_data({"a": [1.0, 2.2, 10.0], "b": [4.0, 2.2, 1.0]})
  c = sr.best_single_rate(data, "adam")
  assert (c.schedule, c.learning_rate) == ("constant", 1e-3)
  assert c.regret == pytest.approx(2.0)
  assert c.task_regrets == pytest.approx({"a": 1.0, "b": 4.0})
  assert [(s, r) for s, r, _ in c.candidates] == [("constant", r) for r in RATES]
  assert [m for _, _, m in c.candidates] == pytest.approx([2.0, 2.2, math.sqrt(10)])


def test_scale_of_a_task_does_not_change_the_choice():
  rng = np.random.default_rng(0)
  scores = {f"t{i}": list(rng.uniform(0.5, 2.0, size=3)) for i in range(5)}
  base = sr.best_single_rate(sweep_data(scores), "adam")
  scaled = sr.best_single_rate(sweep_data({t: [v * 10.0 ** i for v in s] for i, (t, s) in enumerate(scores.items())}),
                               "adam")
  assert (scaled.schedule, scaled.learning_rate) == (base.schedule, base.learning_rate)
  assert scaled.regret == pytest.approx(base.regret)


def test_a_setting_best_on_every_task_is_chosen_with_regret_one():
  data = sweep_data({t: {"constant": [3.0 + i, 2.0 + i, 5.0 + i], "warmup_cosine": [2.5 + i, 1.0 + i, 4.0 + i]}
                     for i, t in enumerate(["a", "b", "c"])})
  c = sr.best_single_rate(data, "adam")
  assert (c.schedule, c.learning_rate) == ("warmup_cosine", 1e-2)
  assert c.regret == pytest.approx(1.0)
  assert c.retrained() == [] and c.within_steps(0) == ["a", "b", "c"]


def test_ties_go_to_constant_then_the_smaller_rate():
  data = sweep_data({"a": [1.0, 1.0, 2.0], "b": [2.0, 2.0, 1.0]})
  assert sr.best_single_rate(data, "adam").learning_rate == 1e-3
  # the same regrets on permuted tasks are a tie too (1e-3: regrets 1, 1.5, 3; 1e-2: 1.5, 3, 1)
  data = sweep_data({"a": [1.0, 1.5, 9.0], "b": [1.5, 3.0, 1.0], "c": [3.0, 1.0, 9.0]})
  assert sr.best_single_rate(data, "adam", rates=[1e-3, 1e-2]).learning_rate == 1e-3
  assert sr.best_single_rate(data, "adam", rates=[1e-2, 1e-3]).learning_rate == 1e-3
  data = sweep_data({"a": {"constant": [2.0, 1.0, 3.0], "warmup_cosine": [1.0, 3.0, 3.0]}})
  c = sr.best_single_rate(data, "adam")
  assert (c.schedule, c.learning_rate) == ("constant", 1e-2)


def test_a_setting_that_diverged_on_one_task_is_never_chosen():
  data = sweep_data({"a": [1.0, 1.5, None], "b": [1.2, 1.4, 1.0], "c": [5.0, 1.3, 1.0]})
  c = sr.best_single_rate(data, "adam")
  assert c.learning_rate == 1e-2
  assert math.isinf(c.candidates[2][2])
  nowhere = sweep_data({"a": [None, 1.0, None], "b": [1.0, None, None]})  # no rate trains both tasks
  with pytest.raises(ValueError, match="no setting of 'adam' .* trained every task"):
    sr.best_single_rate(nowhere, "adam")


def test_rates_swept_on_every_task_and_a_missing_rate():
  rates = {"b": (1e-3, 1e-2, 1e-1, 10 ** -0.5, 1.0)}  # b's grid was extended at its top
  data = sweep_data({"a": [2.0, 1.0, 3.0], "b": [5.0, 4.0, 3.0, 2.0, 1.0]}, rates)
  c = sr.best_single_rate(data, "adam")
  assert [r for _, r, _ in c.candidates] == list(RATES)
  assert sr.best_single_rate(data, "adam", rates=[1e-2, 1e-1]).learning_rate == 1e-2
  with pytest.raises(ValueError, match=r"rates: \[1\.0\] not in the sweep of 'adam' on task 'a'"):
    sr.best_single_rate(data, "adam", rates=[1e-2, 1.0])
  # a rate an ulp away (another machine's grid) is the same rate
  assert sr.best_single_rate(data, "adam", rates=[0.010000000000000002]).learning_rate == 1e-2


def test_within_steps_counts_half_decades():
  data = sweep_data({"a": [1.0, 2.0, 3.0], "b": [2.0, 1.1, 3.0], "c": [3.0, 9.0, 1.0]},
                    {"c": (1e-3, 10 ** -1.5, 1e-1)})
  c = sr.best_single_rate(data, "adam", rates=[1e-3, 1e-1])
  assert c.learning_rate == 1e-3  # regrets (1, 2 / 1.1, 3) against (3, 3 / 1.1, 1)
  assert c.tuned == {"a": ("constant", 1e-3), "b": ("constant", 1e-2), "c": ("constant", 1e-1)}
  assert c.within_steps(1) == ["a"] and c.within_steps(2) == ["a", "b"] and c.within_steps(4) == ["a", "b", "c"]
  assert c.retrained() == ["b", "c"]
  with pytest.raises(ValueError, match="steps"):
    c.within_steps(-1)


@pytest.mark.parametrize("call, match", [
    (lambda d: sr.best_single_rate(d, "lion"), "optimizer 'lion' is not a baseline of task 'a'"),
    (lambda d: sr.best_single_rate(d, "adam", tasks=["a", "z"]), "tasks must be distinct tasks"),
    (lambda d: sr.best_single_rate(d, "adam", tasks="a"), "tasks must be a sequence"),
    (lambda d: sr.best_single_rate(d, "adam", schedules=["warmup_cosine"]), "schedules must be a non-empty subset"),
    (lambda d: sr.best_single_rate(d, "adam", rates=[]), "rates must be a non-empty"),
    (lambda d: sr.best_single_rate(d, "adam", rates=[-1e-2]), "rates must be a non-empty"),
    (lambda d: sr.best_single_rate({"tasks": {}}, "adam"), "data must be a suite's baselines dict"),
    (lambda d: sr.best_single_rate(sweep_data({"a": [1.0, 2.0, 3.0]}, suite="test"), "adam"),
     "data: the single rate is chosen on the development suite"),
    (lambda d: sr.best_single_rate(sweep_data({"a": [0.0, 2.0, 3.0]}), "adam"), "data: the best score"),
    (lambda d: sr.best_single_rate(sweep_data({"a": [1.0, 2.0]}), "adam"), "data: .* one score per swept rate"),
])
def test_bad_input_is_a_value_error_naming_the_argument(call, match):
  data = sweep_data({"a": [1.0, 2.0, 3.0], "b": [2.0, 1.0, 3.0]})
  with pytest.raises(ValueError, match=match):
    call(data)


def test_a_task_where_everything_diverged_is_an_error():
  data = sweep_data({"a": [1.0, 2.0, 3.0]})
  data["tasks"]["b"] = {"baselines": {"adam": {"learning_rates": list(RATES), "scores": {"constant": [None] * 3},
                                               "schedule": "constant", "learning_rate": float("nan")}}}
  with pytest.raises(ValueError, match="every setting of 'adam' diverged on task 'b'"):
    sr.best_single_rate(data, "adam")


# -- the shipped development data ---------------------------------------------------------------------------------
def test_shipped_dev_choices():
  data = heldout.load_normalizers()
  choices = {o: sr.best_single_rate(data, o) for o in bf.suite_spec("heldout").optimizers}
  for o, c in choices.items():
    assert c.regret >= 1.0 and np.isfinite(c.regret), o
    assert c.regret == min(m for _, _, m in c.candidates), o
    assert any(math.isclose(c.learning_rate, r) for r in bl.grid(o)), o
    assert len(c.tuned) == len(data["tasks"])
  assert choices["adam"].learning_rate == pytest.approx(1e-2)  # the docs' table (docs/guide/evaluation.md)
  rows = sr.choice_rows(choices)
  assert [r[0] for r in rows] == list(choices) and rows[0][4] == "17 / 17"
  with pytest.raises(ValueError, match="data: the single rate is chosen on the development suite"):
    sr.best_single_rate(heldout.load_normalizers(suite="test"), "adam")


def test_baseline_curves_json_round_trip():
  c = st.BaselineCurves("heldout", "a", "adam", "constant", 1e-2, (0, 8), ((1.0, float("nan")), (0.5, 0.25)),
                        False, 1.5)
  back = st.BaselineCurves.from_json(c.to_json())
  assert back.to_json() == c.to_json() and np.isnan(back.curves[0, 1]) and c.to_json()["test_curves"][0][1] is None


# -- a tiny real suite: one data-free task, Adam tuned by the suite's procedure --------------------------------------
TASK, HORIZON = "quadratic_10", 16


@pytest.fixture(scope="module")
def tiny_suite():
  from metafam.tasks.registry import get_task
  task = get_task(TASK)
  tuned = bl.tune_baseline(task, "adam", HORIZON, task_name=TASK, learning_rates=RATES, max_extensions=0)
  reference = bl.reference_run(task, bl.constant_rate(tuned), HORIZON, task_name=TASK)
  entry = {"horizon": HORIZON, "eval_steps": list(tuned.eval_steps), "baselines": {"adam": tuned.to_json()},
           "reference": reference}
  return {"suite": "heldout", "tasks": {TASK: entry}, "pending": []}


def test_curves_at_a_setting_are_the_sweeps_lane(tiny_suite, tmp_path):
  b = tiny_suite["tasks"][TASK]["baselines"]["adam"]
  shipped = st.baseline_curves(TASK, "adam", b["learning_rate"], b["schedule"], data=tiny_suite)
  assert shipped.shipped and shipped.wall_time == 0.0
  np.testing.assert_array_equal(shipped.curves, np.asarray(b["test_curves"]))
  trained = st.baseline_curves(TASK, "adam", b["learning_rate"], b["schedule"], data=tiny_suite, reuse_shipped=False)
  assert not trained.shipped
  np.testing.assert_allclose(trained.curves, shipped.curves, rtol=1e-5)  # one lane alone, the sweep's rounding aside
  other = "warmup_cosine" if b["schedule"] == "constant" else "constant"
  first = st.baseline_curves(TASK, "adam", b["learning_rate"], other, data=tiny_suite, cache_dir=tmp_path)
  again = st.baseline_curves(TASK, "adam", b["learning_rate"], other, data=tiny_suite, cache_dir=tmp_path)
  assert again == first and (tmp_path / "adam" / f"{TASK}.json").exists()
  with pytest.raises(ValueError, match="written by another evaluation"):
    st.baseline_curves(TASK, "adam", 1e-3 if b["learning_rate"] != 1e-3 else 1e-1, other, data=tiny_suite,
                       cache_dir=tmp_path)
  for kwargs, match in [(dict(task="nope"), "task 'nope' has no baselines"), (dict(optimizer="x"), "optimizer"),
                        (dict(schedule="cosine"), "schedule"), (dict(learning_rate=0.0), "learning_rate")]:
    args = {**dict(task=TASK, optimizer="adam", learning_rate=1e-2, schedule="constant"), **kwargs}
    with pytest.raises(ValueError, match=match):
      st.baseline_curves(args.pop("task"), args.pop("optimizer"), args.pop("learning_rate"), args.pop("schedule"),
                         data=tiny_suite)

  # scored like a candidate, and the self-tuning comparison of a fixed candidate against it
  base = st.score_curves("adam", {TASK: first}, tiny_suite, exclude=("adam",))
  assert base.scores[0].setting == {"learning_rate": b["learning_rate"], "schedule": other, "shipped": False}
  candidate = st.score_curves("candidate", {TASK: shipped.curves}, tiny_suite)
  assert candidate.scores[0].setting is None and candidate.suite == "heldout"
  rows = st.self_tuning_rows(candidate, {"adam": base})
  assert len(rows) == 1 and rows[0][0] == "adam" and rows[0][1] == f"{other} {b['learning_rate']:.3g}"
  assert len(rows[0]) == len(st.SELF_TUNING_HEADERS)
  tuned_candidate = st.score_curves("tuned", {TASK: shipped}, tiny_suite)
  with pytest.raises(ValueError, match="was tuned per task"):
    st.self_tuning_rows(tuned_candidate, {"adam": base})
  with pytest.raises(ValueError, match="curves must be a non-empty mapping"):
    st.score_curves("x", {}, tiny_suite)
