"""Every benchmark script runs at smoke size with the flags its documented commands pass (tests/project/test_scripts.py
checks that list against README.md and docs/). The numbers of a smoke run mean nothing; what is checked is that each
code path runs and its tables have the rows the arguments ask for. The learned_optimization comparisons run when
``METAFAM_LO_SRC`` names its unpacked 0.0.1 source distribution."""

import os

import pytest
from test_scripts import HEAVY_TASK, LO_SRC, needs_lo_src, run_script, run_subprocess


def _rows(markdown_path):
  """The data rows of every table in a Markdown file written by ``--markdown``."""
  with open(markdown_path) as f:
    lines = [line for line in f if line.startswith("| ")]
  return [line for line in lines if not line.startswith("| estimator") and not line.startswith("| optimizer")
          and not line.startswith("| model") and not line.startswith("| estimate only")]


@pytest.mark.slow  # the script: test_outer_training; sharded FullES: tests/inner/test_sharding.py
def test_outer_training_full_es_on_two_devices(monkeypatch, capsys):
  # PES with the default noise kinds on one device is gpu_run.sh's outer_training step (tests/project/test_gpu_run.py).
  # FullES on one and two devices (the default --devices 2).
  code, out = run_script("benchmarks/outer_training.py", ["--smoke", "--estimators", "full_es", "--perturbations",
                                                          "full"], monkeypatch, capsys)
  assert code == 0 and out.count("   full_es ") == 2
  code, _ = run_script("benchmarks/outer_training.py", ["--perturbations", "low_rank:0"], monkeypatch, capsys)
  assert code == 2  # a bad value is an argparse error, before any work


def test_outer_training_host_bound_proxy(monkeypatch, capsys):
  code, out = run_script("benchmarks/outer_training.py", ["--tiny", "--steps", 2, "--estimators", "pes",
                                                          "--perturbations", "full", "--devices", 1],
                         monkeypatch, capsys)
  assert code == 0 and out.count("       pes ") == 1 and "ImageMLPFamily_8x8_4" in out


def test_lowered_cost_finds_no_loop_or_conditional_in_the_accelerator_step(tmp_path, monkeypatch, capsys):
  """The per-step program metafam runs on an accelerator (lowered for CUDA without one): no lane-block loop and no
  conditional inside the step, unlike the CPU's choices; and the train part's FLOPs are the minimal program's up to
  the non-finite checks and the per-step outputs."""
  md = tmp_path / "cost.md"
  code, out = run_script("benchmarks/lowered_cost.py", ["--smoke", "--optimizers", "mlp_lopt", "--markdown", md],
                         monkeypatch, capsys)
  assert code == 0
  rows = {cells[3]: cells for cells in ([c.strip() for c in row.split("|")] for row in _rows(md))}
  assert set(rows) == {"minimal", "metafam", "metafam, train part (no reset)", "metafam (CPU choices)"}
  loops, conds = -2, -1  # the last two columns (the row ends with "|")
  assert rows["metafam"][loops - 1] == "0" and rows["metafam"][conds - 1] == "0"
  assert rows["metafam (CPU choices)"][conds - 1] == "1"
  assert 1.0 <= float(rows["metafam, train part (no reset)"][8]) < 1.1  # FLOPs / minimal


@needs_lo_src
def test_outer_training_against_the_reference_library(tmp_path, monkeypatch, capsys):
  md = tmp_path / "outer.md"
  code, out = run_script("benchmarks/outer_training.py", ["--smoke", "--reference_src", LO_SRC, "--devices", 1,
                                                          "--perturbations", "full", "low_rank:1", "--markdown", md],
                         monkeypatch, capsys)
  assert code == 0 and "Estimate only" in open(md).read()
  # PES and FullES, each for both meta-losses; a column pair per (devices, noise).
  assert out.count("outer_valid") >= 3 and "FullES, 2 pairs" in out


@pytest.mark.slow  # the benchmark script end to end (about 25 s); its engine is tested in tests/inner/test_inner.py
def test_inner_training(tmp_path, monkeypatch, capsys):
  # One device with the host-driven baselines skipped is gpu_run.sh's inner_training step
  # (tests/project/test_gpu_run.py).
  md = tmp_path / "inner.md"
  code, out = run_script("benchmarks/inner_training.py", ["--smoke", "--markdown", md], monkeypatch, capsys)
  assert code == 0 and len(_rows(md)) == 2  # mlp_lopt and adam, one lane count
  header = out.split("inner optimizer")[1].split("\n")[1].split("|")[0]
  assert all(c in header for c in ("metafam", "minimal", "mf x2", "ref-style", "naive"))  # every column


@needs_lo_src
def test_inner_training_against_the_reference_library(monkeypatch, capsys):
  code, out = run_script("benchmarks/inner_training.py", ["--smoke", "--reference_src", LO_SRC], monkeypatch, capsys)
  assert code == 0 and "best/LO" in out


@pytest.mark.slow  # low-rank PES: tests/optimizers/test_low_rank.py
def test_low_rank_estimates(monkeypatch, capsys):
  code, out = run_script("benchmarks/low_rank_estimates.py", ["--smoke", "--tables", 1, 2, 3], monkeypatch, capsys)
  assert code == 0
  assert "1. PES" in out and "2. FullES" in out and "3. XLA memory" in out


# Newton-Schulz steps: tests/optimizers/test_newton_schulz.py; the script's lanes: test_inner_training's
@pytest.mark.slow
def test_step_cost_of_muon_with_fewer_newton_schulz_iterations(tmp_path, monkeypatch, capsys):
  code, _ = run_script("benchmarks/step_cost.py", ["--smoke", "--muon_ns_steps", 2, "--markdown", tmp_path / "c.md"],
                       monkeypatch, capsys)
  rows = {line.split("|")[3].strip(): line.split("|")[-2].strip() for line in _rows(tmp_path / "c.md")}
  assert code == 0 and {"muon", "muon, 2 NS steps"} <= set(rows)
  assert rows["muon, 2 NS steps"] == rows["muon"]  # the same state: only the iteration count differs
  code, _ = run_script("benchmarks/step_cost.py", ["--muon_ns_steps", 0], monkeypatch, capsys)
  assert code == 2


@pytest.mark.slow  # the script: test_step_cost_of_muon_with_fewer_newton_schulz_iterations; blocks: tests/inner/test_lane_chunk.py
def test_step_cost_with_many_members_in_blocks(tmp_path, monkeypatch, capsys):
  """The many-models path (gpu_run.sh's step_cost step, tests/project/test_gpu_run.py, covers the single-model one):
  every optimizer vmapped and again in blocks of 1, ratios against the vmapped Adam and Muon."""
  code, _ = run_script("benchmarks/step_cost.py", ["--smoke", "--members", 3, "--lane_chunk", 1, "--markdown",
                                                   tmp_path / "cost.md"], monkeypatch, capsys)
  columns = ["model", "params", "optimizer", "update ms", "step ms", "update / Adam", "update / Muon", "step / Adam",
             "step / Muon", "state"]
  rows = {r["optimizer"]: r for r in (dict(zip(columns, (c.strip() for c in line.strip().strip("|").split("|"))))
                                      for line in _rows(tmp_path / "cost.md"))}
  import metafam.pretrained
  names = ["adam", "muon", *metafam.pretrained.list()]  # every shipped pretrained optimizer, both ways
  assert code == 0 and set(rows) == {*names, *(f"{name}, blocks of 1" for name in names)}
  assert all(r["model"] == "MLP 784-16-16-10, 2 at once" and r["params"] == "13,002" for r in rows.values())
  assert rows["adam"]["update / Adam"] == "1.00x" and rows["muon"]["update / Muon"] == "1.00x"
  assert rows["muon, blocks of 1"]["state"] == rows["muon"]["state"] and rows["adam"]["state"] == "2.00"


@pytest.mark.slow  # the estimate it profiles: tests/test_conformance.py (row ESTIMATORS)
def test_profile_estimate(monkeypatch, capsys):
  # As a child process: the per-kernel trace flag must be set before JAX starts.
  # --top large enough to list every kind of kernel: which kinds lead a smoke-size profile depends on the load.
  out = run_subprocess("benchmarks/profile_estimate.py", ["--smoke", "--pairs", 2, "--top", 1000])
  assert "kernel time per inner step" in out and "matrix products" in out
  code, out = run_script("benchmarks/profile_estimate.py", ["--smoke", "--shared_theta", "--calls", 1, "--estimator",
                                                            "full_es", "--perturbation", "low_rank", "--rank", 1],
                         monkeypatch, capsys)
  assert code == 0 and "one theta for all lanes" in out


@pytest.mark.slow  # the estimators and meta-step it times: tests/test_conformance.py (row ESTIMATORS)
def test_meta_training(monkeypatch, capsys):
  code, out = run_script("benchmarks/meta_training.py",
                         ["--budgets", "0.001", "--lopts", "mlp_lopt", "--estimators", "pes", "--pairs", 1,
                          "--unroll", 2, "--trajectory", 4, "--eval_tasks", 16, "--eval_steps", 4, "--quadratic_steps",
                          2], monkeypatch, capsys)
  assert code == 0 and "quadratic anchor" in out and "held-out speedup" in out


@pytest.mark.slow  # two processes: tests/test_distributed.py
def test_distributed(monkeypatch, capsys):
  code, out = run_script("benchmarks/distributed.py", ["--layouts", "2x1", "--steps", 1, "--warmup", 1,
                                                       "--num_tasks", 2, "--unroll", 2], monkeypatch, capsys)
  assert code == 0 and "2x1" in out


def test_heldout_baselines_collects_shards(tmp_path, monkeypatch, capsys):
  data = tmp_path / "baselines.json"
  code, out = run_script("benchmarks/heldout_baselines.py", ["--shard_dir", tmp_path / "shards", "--collect_only",
                                                             "--out", data], monkeypatch, capsys)
  assert code == 0 and out.startswith("0 tasks complete") and data.exists()


def test_heldout_baselines_rejects_bad_shards(tmp_path, monkeypatch, capsys):
  from metafam.benchmark import baseline_files
  task = "fmnist60k_logreg_28x28_b128"
  for shards, message in (("sgd", "not shards of the test suite"), ("adam_reference", "needs the adam shard")):
    with pytest.raises(ValueError, match=message):
      baseline_files.generate(str(tmp_path / "shards"), [task], progress=False, suite="test", shards=shards.split(","))
    code, _ = run_script("benchmarks/heldout_baselines.py", ["--suite", "test", "--shard_dir", tmp_path / "shards",
                                                             "--tasks", task, "--shards", shards], monkeypatch, capsys)
    assert code == 2
  assert not (tmp_path / "shards").exists()  # rejected before any work


@pytest.mark.slow
def test_heldout_baselines_generates_one_task(tmp_path, monkeypatch, capsys):
  data = tmp_path / "baselines.json"
  code, out = run_script("benchmarks/heldout_baselines.py", ["--shard_dir", tmp_path / "shards", "--tasks",
                                                             HEAVY_TASK, "--out", data], monkeypatch, capsys)
  assert code == 0 and out.startswith("1 tasks complete")


def test_conv_in_loop(tmp_path, monkeypatch, capsys):
  md = tmp_path / "conv.md"
  code, out = run_script("benchmarks/conv_in_loop.py", ["--smoke", "--lanes", 1, 3, "--steps", 2, "--rounds", 1,
                                                       "--markdown", md], monkeypatch, capsys)
  assert code == 0 and len(_rows(md)) == 2 and "agree to 1e-3" in out  # one row per lane count; the curves checked
  code, _ = run_script("benchmarks/conv_in_loop.py", ["--lanes", 0], monkeypatch, capsys)
  assert code == 2  # a bad value is an argparse error, before any work
