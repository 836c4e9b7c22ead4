"""The XLA flags the running jaxlib accepts, probed in a child process instead of assumed.

XLA aborts the whole process (``Unknown flags in XLA_FLAGS``, exit code 1, no pytest summary) at the first compiled
function when ``XLA_FLAGS`` names a flag it does not know, and XLA retires flags between releases: jaxlib 0.11.2
and 0.12.0.1 no longer know ``--xla_cpu_use_fusion_emitters``, which the suite passes to 0.10.2. So the suite asks the
running jaxlib: `probed_flags` runs a child process that jits a scalar with the candidate flags (about a second), and
only if it fails, one child per flag, concurrently. The answer is kept in the environment (`PROBE_ENV`), keyed by
the jaxlib version and the candidate flags, so the xdist workers and the tests' child processes, which inherit it,
do not probe again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE_ENV = "METAFAM_TEST_XLA_FLAGS_PROBE"
# Starting JAX's CPU backend and compiling a program is where XLA parses XLA_FLAGS (and aborts on a flag it rejects).
_PROGRAM = "import jax; jax.jit(lambda x: x + 1)(1.0).block_until_ready()"
_TIMEOUT_SECONDS = 300


def jaxlib_version() -> str:
  """The installed jaxlib's version, without starting JAX."""
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  try:
    return metadata.version("jaxlib")
  except metadata.PackageNotFoundError:
    import jaxlib  # pylint: disable=import-outside-toplevel
    return jaxlib.__version__


def _probe(flags: list[str]) -> subprocess.Popen:
  env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # nothing of the probe's is worth caching
  return subprocess.Popen([sys.executable, "-c", _PROGRAM], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)


def _accepted(procs: list[subprocess.Popen]) -> list[bool]:
  answers = []
  for proc in procs:
    try:
      answers.append(proc.wait(timeout=_TIMEOUT_SECONDS) == 0)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
      answers.append(False)
  return answers


def supported_flags(flags: str) -> tuple[list[str], list[str]]:
  """Splits the whitespace-separated ``flags`` into those the running XLA accepts and those it rejects (an unknown
  flag, or a value it cannot parse); each is tested alone, in order, only if the whole set is rejected."""
  candidates = flags.split()
  if not candidates or _accepted([_probe(candidates)])[0]:
    return candidates, []
  answers = _accepted([_probe([flag]) for flag in candidates])
  kept = [flag for flag, ok in zip(candidates, answers) if ok]
  if len(kept) > 1 and not _accepted([_probe(kept)])[0]:  # each accepted alone but not together: keep none
    kept = []
  return kept, [flag for flag in candidates if flag not in kept]


def probed_flags(flags: str) -> tuple[list[str], list[str]]:
  """`supported_flags`, probed once per jaxlib and flag string: the answer is read from and written to
  ``os.environ[PROBE_ENV]``, which the processes this one starts inherit."""
  key = {"jaxlib": jaxlib_version(), "flags": flags}
  try:
    record = json.loads(os.environ.get(PROBE_ENV, ""))
    if {name: record[name] for name in key} == key:
      return list(record["kept"]), list(record["dropped"])
  except (ValueError, KeyError, TypeError):
    pass
  kept, dropped = supported_flags(flags)
  os.environ[PROBE_ENV] = json.dumps({**key, "kept": kept, "dropped": dropped})
  return kept, dropped
