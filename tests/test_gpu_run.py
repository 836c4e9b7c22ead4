"""benchmarks/gpu_run.sh, the run prepared for a lent GPU, on CPU at smoke size: every step runs and writes its
file, so the script cannot rot between the rare sessions that have a GPU.

Its benchmark steps are also the smoke runs of those benchmarks' documented GPU commands, so their tables are checked
here rather than run a second time in tests/test_benchmark_scripts.py: `inner_training.py` with one device and the
host-driven baselines skipped, `outer_training.py` with its default noise kinds, `step_cost.py` with a learned
optimizer at initialization. The optional meta_train step runs too, on a tiny recipe."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from test_benchmark_scripts import _rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash, timeout")
def test_gpu_run_smoke_on_cpu(tmp_path):
  out = tmp_path / "out"
  recipe = tmp_path / "tiny.json"
  recipe.write_text(json.dumps({
      "name": "tiny", "optimizer": "muon_residual_lopt", "step_mult": 0.05, "estimator": "nres", "num_pairs": 1,
      "unroll_length": 2, "trajectory_lengths": [4, 6], "sigma": 0.05, "meta_learning_rate": 0.01,
      "meta_lr_decay_steps": 0, "clip_grad_norm": 1.0, "num_steps": 2,
      "families": [{"kind": "quadratic", "kwargs": {"dim": 3}}]}))
  env = dict(os.environ, OUT=str(out), JAX_PLATFORMS="cpu", METAFAM_GPU_RUN_SMOKE="1", METAFAM_GPU_RUN_WORKERS="0",
             METAFAM_GPU_RUN_TESTS="tests/test_registries.py", METAFAM_LO_SRC=str(tmp_path / "no_lo"),
             METAFAM_GPU_RUN_LIMITS="240 120 120 120 240", PYTHON=sys.executable, METAFAM_GPU_RUN_RECIPE=str(recipe),
             METAFAM_GPU_RUN_STEPS="tests inner_training outer_training step_cost meta_train")
  proc = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_run.sh")], capture_output=True, text=True,
                        env=env, cwd=ROOT, timeout=600)
  log = (out / "gpu_run.log").read_text() if (out / "gpu_run.log").exists() else ""
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + log[-4000:]
  assert sorted(os.listdir(out)) == ["gpu_run.log", "inner_training.md", "meta_train_metrics.jsonl",
                                     "meta_train_theta.npz", "outer_training.md", "step_cost.md", "tests.md"]
  tests = (out / "tests.md").read_text()
  assert " passed" in tests and "failed" not in tests  # pytest's summary line, kept
  for name in ("tests", "inner_training", "outer_training", "step_cost"):
    text = (out / f"{name}.md").read_text()
    assert "JAX " in text and " UTC" in text and "CPU" in text, name  # device, JAX version, date
    assert f"== {name}: exit 0" in log
  assert "learned_optimization not carried" in log
  assert proc.stdout.count("== ") >= 8  # each step's start and end is printed
  _check_inner_training((out / "inner_training.md").read_text())
  _check_outer_training(_rows(out / "outer_training.md"))
  _check_step_cost(_rows(out / "step_cost.md"))
  _check_meta_train(out)


def _check_meta_train(out):
  from metafam.benchmark.runner import load_theta
  from metafam.optimizers.muon_lopt import MuonResidualLOpt
  import jax
  steps = [json.loads(line)["step"] for line in (out / "meta_train_metrics.jsonl").read_text().splitlines()]
  assert steps == [1, 2]
  theta = load_theta(str(out / "meta_train_theta.npz"))  # theta alone, float32, MuonResidualLOpt's structure
  assert jax.tree.structure(theta) == jax.tree.structure(MuonResidualLOpt().init(jax.random.key(0)))


def _check_inner_training(text):
  header = [line for line in text.splitlines() if line.startswith("| optimizer")][0]
  columns = [c.strip() for c in header.split("| mf/min time |")[0].split("|")[3:]]  # the timed implementations
  assert columns[:2] == ["metafam", "minimal"] and "naive" not in columns and "ref-style" not in columns


def _check_outer_training(rows):
  # PES with each default noise kind (the list default argparse once left unconverted): full, rank 1, rank 4.
  assert len(rows) == 3 and any("rank 1" in r for r in rows) and any("rank 4" in r for r in rows)
  assert not any("nan" in r for r in rows)


def _check_step_cost(rows):
  assert len(rows) == 2 * 4  # (MLP, CNN) x (adam, muon, generalist_v1, muon_residual_lopt (init))
  adam = [r for r in rows if "| adam |" in r]
  assert all("| 1.00x | " in r for r in adam)  # Adam against itself
  # State bytes per parameter byte: Adam keeps two moments of every parameter, exactly 2; the Muon-initialized
  # learned optimizer keeps Muon's moments (one per matrix entry, two elsewhere), so its ratio is Muon's.
  assert all(r.rstrip().endswith("| 2.00 |") for r in adam)
  state = lambda opt, model: float([r for r in rows if f"| {opt} |" in r and model in r][0].split("|")[-2])
  for model in ("MLP", "CNN"):  # (optax's Muon also keeps its Newton-Schulz coefficients and a count per part)
    assert state("muon", model) - 0.02 <= state("muon_residual_lopt (init)", model) <= state("muon", model)
