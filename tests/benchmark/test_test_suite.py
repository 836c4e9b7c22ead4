"""The test suite (`metafam.benchmark.suites.TEST_HORIZONS`): its definition, its data, its baselines pipeline, and
the rule that it runs only when asked for by name."""

import dataclasses
import json
import os

import numpy as np
import optax
import pytest

from metafam.benchmark import baseline_files as bf
from metafam.benchmark import baselines as bl
from metafam.benchmark import heldout
from metafam.benchmark import report
from metafam.benchmark.suites import HORIZONS, TEST_HORIZONS
from metafam.datasets import images
from metafam.io import write_json
from metafam.tasks.registry import get_task

CONVEX = {"fmnist60k_logreg_28x28_b128"}


def _documented_params():
  import inspect
  import re
  from metafam.tasks import registry
  return {n: int(c.replace(",", "")) for n, c in
          re.findall(r'^\s*"(\w+)":[^#\n]*#.*?([\d,]+) params', inspect.getsource(registry), re.M)}


def test_the_suite_is_at_the_sizes_people_train():
  assert len(TEST_HORIZONS) >= 12 and not set(TEST_HORIZONS) & set(HORIZONS)  # nothing shared with dev
  assert all(1000 <= t <= 5000 and t % bl.EVALS_PER_RUN == 0 for t in TEST_HORIZONS.values())
  counts = _documented_params()
  for name in TEST_HORIZONS:
    assert (counts[name] < 9e4) == (name in CONVEX) and counts[name] < 1e6, (name, counts[name])  # ~1e5 to 1e6
  kinds = {name.split("_")[1] for name in TEST_HORIZONS}
  assert {"mlp", "conv", "ae", "vae", "logreg", "char"} <= kinds
  assert any("lstm" in n for n in TEST_HORIZONS) and any("transformer" in n for n in TEST_HORIZONS)


def test_missing_full_data_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setenv(images.FASHION_MNIST_ENV, str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="nowhere.*METAFAM_FASHION_MNIST_DIR"):
    get_task("fmnist60k_mlp_28x28_256x256_b128")
  monkeypatch.delenv(images.FASHION_MNIST_ENV)
  monkeypatch.setattr(images, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "no_debian"))
  with pytest.raises(FileNotFoundError, match=r"set \$METAFAM_FASHION_MNIST_DIR.*dataset-fashion-mnist"):
    images.fashion_mnist_datasets(batch_size=8, image_size=28, data_dir="full")


def test_eval_batches_cover_the_stated_examples(tmp_path, monkeypatch):
  from metafam.datasets.idx import write_idx
  for part, n in (("train", 60), ("t10k", 20)):
    write_idx(str(tmp_path / f"{part}-images-idx3-ubyte.gz"), np.zeros((n, 28, 28), np.uint8))
    write_idx(str(tmp_path / f"{part}-labels-idx1-ubyte.gz"), np.zeros(n, np.uint8))
  monkeypatch.setenv(images.FASHION_MNIST_ENV, str(tmp_path))
  spec = bf.suite_spec("test")
  assert spec.eval_batches(get_task("fmnist60k_mlp_28x28_256x256_b128")) == bf.TEST_EVAL_EXAMPLES // 128
  assert spec.eval_batches(get_task("fmnist60k_mlp_28x28_384x96_b32")) == bf.TEST_EVAL_EXAMPLES // 32
  assert spec.eval_batches(get_task("shakespeare_char_lstm_128_t32_b16")) == bf.TEST_EVAL_EXAMPLES // 16
  assert bf.suite_spec("heldout").eval_batches(get_task("fmnist_mlp_16x16_64_b32")) == bl.EVAL_BATCHES
  assert spec.optimizers[0] == bl.REFERENCE and {"adam", "adamw", "nadamw", "muon"} <= set(spec.optimizers)


def test_test_suite_runs_only_when_confirmed():
  with pytest.raises(ValueError, match="confirm_test=True"):
    heldout.evaluate_suite(optax.adam, suite="test")
  with pytest.raises(ValueError, match="confirm_test=True"):
    heldout.evaluate_suite(optax.adam, suite="test", confirm_test="yes")
  with pytest.raises(ValueError, match="holds the 'heldout' suite's baselines, not 'test'"):
    heldout.evaluate_suite(optax.adam, suite="test", confirm_test=True, data={"suite": "heldout", "tasks": {}})
  with pytest.raises(KeyError, match="unknown suite with shipped baselines 'dev'"):
    heldout.evaluate_suite(optax.adam, suite="dev")
  with pytest.raises(ValueError, match="confirm_test only applies to suite='test'"):
    heldout.evaluate_suite(optax.adam, suite="heldout", confirm_test=True)


def test_normalizer_file_of_another_suite_or_missing_is_refused(tmp_path):
  with pytest.raises(heldout.NormalizerFileError, match="--suite test --shard_dir test_shards"):
    heldout.load_normalizers(str(tmp_path / "missing.json"), suite="test")
  with pytest.raises(heldout.NormalizerFileError, match="holds the 'heldout' suite, not 'test'"):
    heldout.load_normalizers(bf.DATA_FILE, suite="test")


# -- the pipeline end to end on a stand-in suite of one data-free task ----------------------------------------------
@pytest.fixture
def tiny_suite(monkeypatch):
  spec = bf.SuiteSpec("test", {"quadratic_10": 16}, ("adam", "muon"), "unused.json", "regenerate it", eval_examples=64)
  monkeypatch.setitem(bf.SUITE_SPECS, "test", spec)
  return spec


def test_generate_collect_and_score_a_suite(tiny_suite, tmp_path):
  shards = str(tmp_path / "shards")
  written = bf.generate(shards, suite="test", progress=False)
  assert sorted(os.path.relpath(p, shards) for p in written) == sorted(
      os.path.join("quadratic_10", f"{o}.json") for o in ("adam", "muon", "adam_reference"))
  assert bf.generate(shards, suite="test", progress=False) == []  # resumable: nothing left to do
  path = str(tmp_path / "test_baselines.json")
  data = bf.collect(shards, path, suite="test")
  assert data["suite"] == "test" and data["pending"] == [] and data["procedure"]["eval_examples"] == 64
  assert data["tasks"]["quadratic_10"]["eval_batches"] == 1 and set(data["procedure"]["grids_low"]) == {"adam", "muon"}
  loaded = heldout.load_normalizers(path, suite="test")
  evaluations = heldout.baseline_evaluations(loaded)
  assert set(evaluations) == {"adam", "muon"} and all(e.suite == "test" for e in evaluations.values())
  assert all(np.isfinite(e.scores[0].seed_speedups).all() and not e.scores[0].diverged for e in evaluations.values())
  result = dataclasses.replace(evaluations["muon"], name="candidate", evaluated_at="2026-11-27T00:00:00+00:00")
  text = report.format_suite(result, evaluations)
  assert text.startswith("suite: test, evaluated 2026-11-27T00:00:00+00:00")
  assert "P(candidate > baseline)" in text and "IQM difference" in text
  out = str(tmp_path / "report")
  paths = report.write_suite_report(result, out, evaluations)
  assert os.path.join(out, "test.json") in paths and os.path.join(out, "test_tasks.csv") in paths
  with open(os.path.join(out, "test.json")) as f:
    record = json.load(f)
  assert record["suite"] == "test" and record["evaluated_at"] == "2026-11-27T00:00:00+00:00"
  vs_self = [row for row in record["paired"] if row["baseline"] == "muon"]
  # Compared with its own stored curves: every (seed, seed') pair of equal speedups ties, so P = 0.5, IQM diff 0.
  assert vs_self and vs_self[0]["P(candidate > baseline) [95% CI]"].startswith("0.50")
  assert vs_self[0]["IQM difference [95% CI]"] == "+0.00 [+0.00, +0.00]"
  assert vs_self[0]["P(lower loss) [95% CI]"].startswith("0.50")
  assert vs_self[0]["IQM loss-gain difference [95% CI]"] == "+0.00 [+0.00, +0.00]"


def test_generate_splits_a_task_between_processes(tiny_suite, tmp_path, monkeypatch):
  shards = str(tmp_path / "shards")
  written = bf.generate(shards, suite="test", progress=False, shards=["muon"])  # one process takes Muon only
  assert [os.path.relpath(p, shards) for p in written] == [os.path.join("quadratic_10", "muon.json")]
  tune, tuned = bl.tune_baseline, []

  def tune_and_race(task, opt, *args, **kwargs):  # while adam is tuned, another process writes the reference
    tuned.append(opt)
    record = tune(task, opt, *args, **kwargs)
    write_json(bf.shard_path(shards, "quadratic_10", "adam_reference"), {"written by": "another process"})
    return record
  monkeypatch.setattr(bl, "tune_baseline", tune_and_race)
  written = bf.generate(shards, suite="test", progress=False)  # the rest: adam, then adam_reference
  assert tuned == ["adam"] and [os.path.relpath(p, shards) for p in written] == [os.path.join("quadratic_10",
                                                                                               "adam.json")]
  with open(bf.shard_path(shards, "quadratic_10", "adam_reference")) as f:
    assert json.load(f) == {"written by": "another process"}  # found at its turn, not computed again


def test_shipped_test_baselines_cover_the_suite():
  data = heldout.load_normalizers(suite="test")
  assert data["suite"] == "test" and data["procedure"]["eval_examples"] == bf.TEST_EVAL_EXAMPLES
  assert sorted(list(data["tasks"]) + list(data["pending"])) == sorted(TEST_HORIZONS)
  for name, entry in data["tasks"].items():
    assert entry["horizon"] == TEST_HORIZONS[name] and set(entry["baselines"]) == set(bf.SUITE_SPECS["test"].optimizers)
    for opt, b in entry["baselines"].items():
      assert not b["at_edge"] and np.isfinite(b["learning_rate"]), (name, opt)  # the tuned rate is interior
      assert np.all(np.isfinite(b["test_curves"])), (name, opt)
    assert entry["reference"]["learning_rate"] == bl.constant_rate(bl.TunedBaseline.from_json(entry["baselines"]["adam"]))


# -- the command line ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--suite=test", "--optimizer=adam"], "--suite test is the test split.*add --confirm_test"),
    (["--suite=heldout", "--optimizer=adam", "--confirm_test"], "--confirm_test only applies to --suite test"),
    (["--suite=test", "--confirm_test", "--optimizer=adam", "--seeds=2"], "--seeds: the test suite fixes"),
    (["--suite=test", "--confirm_test"], "--suite test needs --optimizer"),
])
def test_test_suite_cli_bad_input_is_one_line_and_exit_code_2(args, message, capsys, tmp_path):
  import re
  from metafam import cli
  code = cli.main(["metafam", "benchmark", f"--output_dir={tmp_path / 'x'}"] + args)
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("metafam: error: ") and len(err.strip().splitlines()) == 1, err
  assert re.search(message, err), err
  assert not os.path.exists(tmp_path / "x")


# One shipped test-suite task for the end-to-end run (the whole suite is 12 tasks and about 45 minutes on 2 cores;
# every task's code path is built and trained in the default tests above).
CLI_TASK = "fmnist60k_mlp_28x28_128x128x128_b64"


@pytest.mark.slow
def test_tuned_adam_on_the_test_suite_from_the_command_line(tmp_path, monkeypatch):
  """End to end on a shipped task: Adam handed in as a candidate (rate tuned on the grid, constant schedule)
  retraces its own tuned constant-rate run, i.e. the speedup reference, so its speedup is 1 on every seed; the result
  file records the suite and the time."""
  from metafam import cli
  try:
    get_task(CLI_TASK)
  except FileNotFoundError as e:
    pytest.skip(f"the full Fashion-MNIST is not installed: {e}")
  shipped = heldout.load_normalizers

  def one_task(*args, **kwargs):  # the shipped baselines, restricted to CLI_TASK
    data = shipped(*args, **kwargs)
    return dict(data, tasks={CLI_TASK: data["tasks"][CLI_TASK]}) if data.get("suite") == "test" else data
  monkeypatch.setattr(heldout, "load_normalizers", one_task)
  out = tmp_path / "test_run"
  assert cli.main(["metafam", "benchmark", "--suite=test", "--confirm_test", "--optimizer=adam",
                   "--schedules=constant", f"--output_dir={out}", "--progress=false"]) == 0
  with open(out / "test.json") as f:
    record = json.load(f)
  assert record["suite"] == "test" and record["evaluated_at"].endswith("+00:00")
  assert record["candidate"] == "adam (candidate)"  # named like the shipped baseline: both rows are kept
  iqm = record["summary"]["adam (candidate)"]["iqm"]
  assert iqm["low"] <= 1.0 <= iqm["high"], iqm
