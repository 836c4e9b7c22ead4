"""A script of tests/ run as production runs it: in a child process with JAX's default config and XLA's production
flags (tests/conftest.py changes both for the suite, and with them the random draws and the rounding)."""

import os
import subprocess
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_production(script: str, *args: str, timeout: float) -> str:
  """Runs ``python tests/SCRIPT ARGS``; fails the test with the end of its output unless it exits 0, and warns with
  its `golden_hosts.UNRECORDED` line if it printed one. Returns its standard output."""
  env = dict(os.environ, XLA_FLAGS=os.environ.get("METAFAM_TEST_PRODUCTION_XLA_FLAGS", ""),
             PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
  out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", script), *args], env=env, capture_output=True,
                       text=True, timeout=timeout)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
  from golden_hosts import UNRECORDED
  for line in out.stdout.splitlines():
    if line.startswith(UNRECORDED):
      warnings.warn(f"{script}: {line}")
  return out.stdout
