"""benchmarks/gpu_run.sh, the run prepared for a lent GPU, on CPU at smoke size: every step runs and writes its
file, so the script cannot rot between the rare sessions that have a GPU."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash, timeout")
def test_gpu_run_smoke_on_cpu(tmp_path):
  out = tmp_path / "out"
  env = dict(os.environ, OUT=str(out), JAX_PLATFORMS="cpu", METAFAM_GPU_RUN_SMOKE="1", METAFAM_GPU_RUN_WORKERS="0",
             METAFAM_GPU_RUN_TESTS="tests/test_registries.py", METAFAM_LO_SRC=str(tmp_path / "no_lo"),
             METAFAM_GPU_RUN_LIMITS="240 120 120 120", PYTHON=sys.executable)
  proc = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_run.sh")], capture_output=True, text=True,
                        env=env, cwd=ROOT, timeout=600)
  log = (out / "gpu_run.log").read_text() if (out / "gpu_run.log").exists() else ""
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:] + log[-4000:]
  assert sorted(os.listdir(out)) == ["gpu_run.log", "inner_training.md", "outer_training.md", "step_cost.md",
                                     "tests.md"]
  tests = (out / "tests.md").read_text()
  assert " passed" in tests and "failed" not in tests  # pytest's summary line, kept
  for name in ("tests", "inner_training", "outer_training", "step_cost"):
    text = (out / f"{name}.md").read_text()
    assert "JAX " in text and " UTC" in text and "CPU" in text, name  # device, JAX version, date
    assert f"== {name}: exit 0" in log
  assert "learned_optimization not carried" in log
  assert proc.stdout.count("== ") >= 8  # each step's start and end is printed
