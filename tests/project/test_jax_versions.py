"""Every JAX the package allows: the suite's XLA flags are probed against the running XLA (tests/xla_flags.py, used by
tests/conftest.py), and the subset of the suite that `.ci/run` runs on the newest JAX (tests/newest_jax_subset.txt)."""

import json
import os
import re

import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUBSET = "tests/newest_jax_subset.txt"

REAL = "--xla_backend_optimization_level=0"  # known to every XLA the package allows
BOGUS = "--xla_metafam_no_such_flag=true"


def test_the_probe_drops_an_unknown_flag_and_keeps_a_known_one():
  assert xla_flags.supported_flags(f"{REAL} {BOGUS}") == ([REAL], [BOGUS])
  assert xla_flags.supported_flags("") == ([], [])


def test_the_probe_is_made_once_per_jaxlib_and_flags(monkeypatch):
  calls = []

  def fake(flags):
    calls.append(flags)
    return flags.split()[:1], flags.split()[1:]

  monkeypatch.setattr(xla_flags, "supported_flags", fake)
  monkeypatch.delenv(xla_flags.PROBE_ENV, raising=False)
  assert xla_flags.probed_flags(f"{REAL} {BOGUS}") == ([REAL], [BOGUS])
  assert xla_flags.probed_flags(f"{REAL} {BOGUS}") == ([REAL], [BOGUS])  # read back from the environment
  assert calls == [f"{REAL} {BOGUS}"]
  assert xla_flags.probed_flags(REAL) == ([REAL], [])  # other flags: probed
  record = json.loads(os.environ[xla_flags.PROBE_ENV])
  monkeypatch.setenv(xla_flags.PROBE_ENV, json.dumps({**record, "jaxlib": "0.0.0"}))  # another jaxlib: probed
  xla_flags.probed_flags(REAL)
  monkeypatch.setenv(xla_flags.PROBE_ENV, "not json")
  xla_flags.probed_flags(REAL)
  assert calls == [f"{REAL} {BOGUS}", REAL, REAL, REAL]


def test_the_suite_runs_with_the_flags_the_probe_kept():
  if os.environ.get("METAFAM_TEST_XLA_OPTIMIZE", "") not in ("", "0"):
    return  # no flags added, nothing probed
  record = json.loads(os.environ[xla_flags.PROBE_ENV])  # this run's answer (tests/conftest.py)
  assert record["jaxlib"] == xla_flags.jaxlib_version()
  assert sorted(record["kept"] + record["dropped"]) == sorted(record["flags"].split())
  present = os.environ["XLA_FLAGS"].split()
  assert all(flag in present for flag in record["kept"])
  assert not any(flag in present for flag in record["dropped"])


def test_the_newest_jax_subset_lists_test_files_and_ci_runs_it():
  with open(os.path.join(ROOT, SUBSET), encoding="utf-8") as f:
    lines = f.read().splitlines()
  # pytest reads `@FILE` one argument a line: no comments, no blank lines.
  assert lines and len(set(lines)) == len(lines)
  for line in lines:
    assert re.fullmatch(r"tests/(\w+/)*test_\w+\.py", line) and os.path.isfile(os.path.join(ROOT, line)), line
  assert "tests/project/test_jax_versions.py" in lines
  with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
    ci = f.read()
  assert f"python -m pytest -q @{SUBSET}" in ci  # the README command's options
  for page in ("README.md", "docs/contributing.md", "docs/installation.md", "pyproject.toml"):
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
      assert SUBSET in f.read(), page
