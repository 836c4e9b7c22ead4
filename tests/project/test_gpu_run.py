"""benchmarks/gpu_run.sh, the run prepared for a lent GPU, on CPU at smoke size: every step runs and writes its
file, so the script cannot rot between the rare sessions that have a GPU.

Its benchmark steps are also the smoke runs of those benchmarks' documented GPU commands, so their tables are checked
here rather than run a second time in tests/project/test_benchmark_scripts.py: `inner_training.py` with one device, both
reset strategies and the host-driven baselines skipped, `profile_inner.py` (the per-kernel profile of both unrolls),
`outer_training.py` with full and rank-1 noise, `step_cost.py` with a learned optimizer at initialization. The optional
meta_train step runs too, on a tiny recipe; the optional outer_reference step (learned_optimization in the same run) is
asked for without learned_optimization's source, and must say so and count as failed; it runs for real, slowly, when
``METAFAM_LO_SRC`` names that source (a slow test)."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from test_benchmark_scripts import _rows
from test_scripts import LO_SRC, needs_lo_src

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash, timeout")


def _run(tmp_path, steps, limits, **env):
  out = tmp_path / "out"
  env = {**os.environ, "OUT": str(out), "JAX_PLATFORMS": "cpu", "METAFAM_GPU_RUN_SMOKE": "1",
         "METAFAM_GPU_RUN_WORKERS": "0", "METAFAM_GPU_RUN_TESTS": "tests/test_registries.py",
         "METAFAM_LO_SRC": str(tmp_path / "no_lo"), "METAFAM_GPU_RUN_LIMITS": limits, "PYTHON": sys.executable,
         "METAFAM_GPU_RUN_STEPS": steps, **env}
  proc = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_run.sh")], capture_output=True, text=True,
                        env=env, cwd=ROOT, timeout=900)
  log = (out / "gpu_run.log").read_text() if (out / "gpu_run.log").exists() else ""
  return proc, out, log


def test_default_limits_sum_to_8_minutes():
  with open(os.path.join(ROOT, "benchmarks", "gpu_run.sh")) as f:
    text = f.read()
  limits = dict(zip(["tests", "inner_training", "profile", "outer_training", "step_cost", "outer_reference",
                     "meta_train"], map(int, re.search(r'METAFAM_GPU_RUN_LIMITS:-([\d ]+)}', text).group(1).split())))
  default = re.search(r'METAFAM_GPU_RUN_STEPS:-([\w ]+)}', text).group(1).split()
  install = int(re.search(r"step install (\d+)", text).group(1))
  assert default == ["tests", "inner_training", "profile", "outer_training", "step_cost"]
  assert install + sum(limits[name] for name in default) <= 480


@pytest.mark.slow  # its steps' scripts and flags: tests/project/test_benchmark_scripts.py, the limits above
@needs_bash
def test_gpu_run_smoke_on_cpu(tmp_path):
  recipe = tmp_path / "tiny.json"
  recipe.write_text(json.dumps({
      "name": "tiny", "optimizer": "muon_residual_lopt", "step_mult": 0.05, "estimator": "nres", "num_tasks": 1,
      "unroll_length": 2, "trajectory_lengths": [4, 6], "sigma": 0.05, "meta_learning_rate": 0.01,
      "meta_lr_decay_steps": 0, "clip_grad_norm": 1.0, "num_steps": 2,
      "families": [{"kind": "quadratic", "kwargs": {"dim": 3}}]}))
  proc, out, log = _run(tmp_path, "tests inner_training profile outer_training step_cost outer_reference meta_train",
                        "240 120 120 120 120 60 240", METAFAM_GPU_RUN_RECIPE=str(recipe))
  # outer_reference, asked for without learned_optimization's source, is the one failed step.
  assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:] + log[-4000:]
  assert "gpu_run: 1 step(s) failed" in log and "== outer_reference: learned_optimization not carried" in log
  files = sorted(os.listdir(out))
  assert files == ["gpu_run.log", "inner_training.md", "meta_train_metrics.jsonl", "meta_train_theta.npz",
                   "outer_training.md", "profile.md", "step_cost.md", "tests.md"]
  assert len(files) <= 8  # what comes back from the device
  tests = (out / "tests.md").read_text()
  assert " passed" in tests and "failed" not in tests  # pytest's summary line, kept
  for name in ("tests", "inner_training", "profile", "outer_training", "step_cost"):
    text = (out / f"{name}.md").read_text()
    assert "JAX " in text and " UTC" in text and "CPU" in text, name  # device, JAX version, date
    assert f"== {name}: exit 0" in log
  assert proc.stdout.count("== ") >= 10  # each step's start and end is printed
  _check_inner_training((out / "inner_training.md").read_text())
  _check_profile((out / "profile.md").read_text())
  _check_outer_training(_rows(out / "outer_training.md"))
  _check_step_cost(_rows(out / "step_cost.md"))
  _check_meta_train(out)


@pytest.mark.slow
@needs_bash
@needs_lo_src
def test_gpu_run_outer_reference_smoke_on_cpu(tmp_path):
  # learned_optimization's estimators next to metafam's: minutes of compiling at smoke size on 2 cores.
  proc, out, log = _run(tmp_path, "outer_reference", "1 1 1 1 1 900", METAFAM_LO_SRC=LO_SRC)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + log[-4000:]
  assert sorted(os.listdir(out)) == ["gpu_run.log", "outer_reference.md"]
  text = (out / "outer_reference.md").read_text()
  assert "learned_optimization (LO)" in text and "| PES, 2 pairs | outer_valid |" in text


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
  # --other_reset: on a CPU, where TruncatedStep resets with a conditional by default, the other column is "select"
  assert columns[:3] == ["metafam", "mf select", "minimal"] and "naive" not in columns and "ref-style" not in columns
  rows = [line for line in text.splitlines() if line.startswith("| mlp_lopt |") or line.startswith("| adam |")]
  assert [r.split("|")[1:3] for r in rows] == [[" mlp_lopt ", " 2 "], [" adam ", " 2 "]]  # --smoke: 2 lanes each


def _check_profile(text):
  # Per optimizer: the summary of both programs, then each program's top kernels, all read from a real trace.
  for name in ("mlp_lopt", "adam"):
    summary = text.split(f"## Inner unroll profile: {name}, 2 lanes")[1].split("## ")[0]
    rows = {r.split("|")[1].strip(): r for r in summary.splitlines() if r.startswith("| m")}
    assert sorted(rows) == ["metafam", "minimal"] and all("XLA:CPU kernel events" in r for r in rows.values())
    for program in ("metafam", "minimal"):
      top = text.split(f"## {name}, 2 lanes, {program}: top ")[1].split("## ")[0]
      kernels = [r for r in top.splitlines() if r.startswith("| `")]
      assert 5 <= len(kernels) <= 15 and all(r.rstrip().endswith("% |") for r in kernels)
  assert "no kernel events" not in text


def _check_outer_training(rows):
  # PES with the noise kinds the GPU run asks for: full and rank 1.
  assert len(rows) == 2 and any("| full |" in r for r in rows) and any("rank 1" in r for r in rows)
  assert not any("nan" in r for r in rows)


def _check_step_cost(rows):
  import metafam.pretrained
  # (MLP, CNN) x (adam, muon, every shipped pretrained optimizer, muon_residual_lopt (init))
  assert len(rows) == 2 * (3 + len(metafam.pretrained.list()))
  adam = [r for r in rows if "| adam |" in r]
  assert all("| 1.00x | " in r for r in adam)  # Adam against itself
  # State bytes per parameter byte: Adam keeps two moments of every parameter, exactly 2; the Muon-initialized
  # learned optimizer keeps Muon's moments (one per matrix entry, two elsewhere), so its ratio is Muon's.
  assert all(r.rstrip().endswith("| 2.00 |") for r in adam)
  state = lambda opt, model: float([r for r in rows if f"| {opt} |" in r and model in r][0].split("|")[-2])
  for model in ("MLP", "CNN"):  # (optax's Muon also keeps its Newton-Schulz coefficients and a count per part)
    assert state("muon", model) - 0.02 <= state("muon_residual_lopt (init)", model) <= state("muon", model)
  # generalist_v2 is that optimizer with conv kernels as matrices: one moment per kernel entry rather than Adam's two.
  assert state("generalist_v2", "MLP") == state("muon_residual_lopt (init)", "MLP")
  assert state("generalist_v2", "CNN") < state("muon_residual_lopt (init)", "CNN")
