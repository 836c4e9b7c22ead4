"""Suite-wide test settings.

Compiling vmapped random initializers on CPU is several times faster with ``jax_threefry_partitionable=False``
(measured in tests/tasks/test_task_suite.py: `check_family` of the four conv/AE/LM families 86 s -> 35 s of CPU time).
No test pins random numbers, so the suite uses the faster setting; the library itself never changes JAX's config.

The suite also keeps the command line's persistent compilation cache off, and asks for two CPU devices (before JAX
starts its backend) so that lane sharding is tested on any machine; computations not placed explicitly still run on
the first device only.

Most of a test's time is XLA compiling programs that then run a few steps, and most of that compile time is LLVM
optimizing the machine code. The suite therefore compiles with LLVM's cheap settings and with XLA's older (elemental)
emitter for fused loops instead of its MLIR fusion emitters (`TEST_XLA_FLAGS`, also inherited by the command-line and
multi-process tests' child processes): the same programs, the same operations and results up to rounding, at a
fraction of the compile time. The LLVM settings took one `tests/inner/test_inner.py` case from 41 s to 17 s of CPU time;
the emitter flag then took three of the heaviest tests (zoo PES with `hyper_v2`, zoo finite difference with
`rnn_mlp_lopt`, that `test_inner.py` case) from 53 s to 32 s of CPU time. XLA aborts on a flag it does not know, and
jaxlib 0.11.2 and later no longer know the emitter flag (their CPU backend has only the fusion emitters), so the flags
are probed against the running XLA first (`xla_flags.probed_flags`: one child process of about a second, once per
run) and a rejected one is left out, named in pytest's header (its summary under ``-q``).
Programs compiled again after `jax.clear_caches()` (below) or by a second function object of the same computation,
and the child processes' programs, are read back from a persistent compilation cache private to the run (a temporary
directory shared by the workers and removed at the end): the whole default suite took 681-772 s instead of
804-849 s, with 20% less CPU time (2-core AVX-512 machine, 2026-11-28). XLA's flags are part of its keys, so a child
compiling with production flags never reads a program compiled with the cheap ones.
``METAFAM_TEST_XLA_OPTIMIZE=1`` keeps XLA's default optimization instead, to test the code exactly as it runs in
production; flags already in ``XLA_FLAGS`` are kept either way.
"""

import gc
import os
import shutil
import sys
import tempfile

import jax
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # shared helpers: influence.py, meta_setup.py
import xla_flags  # pylint: disable=wrong-import-position

TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                  "--xla_cpu_use_fusion_emitters=false")
CACHE_MIN_COMPILE_SECONDS = 0.5  # programs that compile faster are not worth a disk round trip
# What XLA_FLAGS held before this file: for a child process that must compile exactly as production does (a test that
# compares with numbers the library shipped, e.g. tests/benchmark/test_heldout.py's rerun of a baseline sweep).
os.environ.setdefault("METAFAM_TEST_PRODUCTION_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
# Only the flags the running XLA accepts (it aborts the process on an unknown one; newer ones retire flags), probed
# once per run by a child process (tests/xla_flags.py): the workers and child processes inherit the answer.
_DROPPED_XLA_FLAGS = []
if os.environ.get("METAFAM_TEST_XLA_OPTIMIZE", "") in ("", "0"):  # before JAX starts its backend, which reads them
  _kept, _DROPPED_XLA_FLAGS = xla_flags.probed_flags(TEST_XLA_FLAGS)
  _present = os.environ.get("XLA_FLAGS", "").split()  # a worker or child process inherits them already added
  os.environ["XLA_FLAGS"] = " ".join(_present + [flag for flag in _kept if flag not in _present])
jax.config.update("jax_threefry_partitionable", False)
# The CLI, called in-process by tests, would otherwise turn on JAX's persistent compilation cache in ~/.cache for the
# rest of the test process (tests stay hermetic).
os.environ["METAFAM_JAX_CACHE"] = ""
# The suite's own persistent compilation cache, one per pytest run: a fresh directory made by the first process that
# loads this file (the controller under xdist), inherited through the environment by the workers and every child
# process, removed by that process at the end (`pytest_unconfigure`). ``METAFAM_TEST_JAX_CACHE=""`` turns it off.
_OWNS_CACHE = "METAFAM_TEST_JAX_CACHE" not in os.environ
if _OWNS_CACHE:
  os.environ["METAFAM_TEST_JAX_CACHE"] = tempfile.mkdtemp(prefix="metafam-tests-jax-cache-")
if os.environ["METAFAM_TEST_JAX_CACHE"]:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["METAFAM_TEST_JAX_CACHE"]  # child processes
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(CACHE_MIN_COMPILE_SECONDS)
  jax.config.update("jax_compilation_cache_dir", os.environ["METAFAM_TEST_JAX_CACHE"])  # this process
  jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_SECONDS)
jax.config.update("jax_num_cpu_devices", 2)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module.

  Every loaded XLA CPU executable holds memory mappings, and the jit caches keep them for the whole test process:
  the full suite went past the kernel's limit of 65,530 mappings per process (13,400 after the compat and zoo tests
  alone), and the next compilation crashed with a segmentation fault. Clearing the caches between modules keeps the
  count bounded; tests within a module still share their programs.
  """
  yield
  jax.clear_caches()
  gc.collect()


@pytest.fixture
def small_full_fashion_mnist(tmp_path_factory, monkeypatch):
  """The test suite's tasks read the full Fashion-MNIST (``data_dir="full"``), which nothing ships: with this fixture
  they read small IDX files it writes (120 training and 40 test images), so every task is tested on any machine."""
  from metafam.datasets.idx import write_idx
  directory = tmp_path_factory.getbasetemp() / "fake_fashion_mnist"
  if not directory.exists():
    rng = np.random.default_rng(0)
    for part, n in (("train", 120), ("t10k", 40)):
      write_idx(str(directory / f"{part}-images-idx3-ubyte.gz"), rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
      write_idx(str(directory / f"{part}-labels-idx1-ubyte.gz"), (np.arange(n) % 10).astype(np.uint8))
  monkeypatch.setenv("METAFAM_FASHION_MNIST_DIR", str(directory))


def _dropped_xla_flags_line():
  return f"XLA flags dropped (jaxlib {xla_flags.jaxlib_version()} rejects them): {' '.join(_DROPPED_XLA_FLAGS)}"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
  """Marks ``slow`` the cases a test module lists in ``SLOW_CASES`` (``{(test function name, parameter id)}``):
  parameterized tests whose other cases already exercise the mechanism in the default suite (the module says which)."""
  del config
  for item in items:
    cases = getattr(item.module, "SLOW_CASES", ())
    callspec = getattr(item, "callspec", None)
    if callspec is not None and (item.originalname, callspec.id) in cases:
      item.add_marker(pytest.mark.slow)


def pytest_report_header(config):
  """Names the suite's XLA flags that the running XLA rejected, in the header (in the summary under ``-q``)."""
  if _DROPPED_XLA_FLAGS and config.get_verbosity() >= 0:
    return [_dropped_xla_flags_line()]
  return []


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  del exitstatus
  if _DROPPED_XLA_FLAGS and config.get_verbosity() < 0:  # -q leaves the header out
    terminalreporter.write_line(_dropped_xla_flags_line())


def pytest_unconfigure(config):
  del config
  if _OWNS_CACHE:
    shutil.rmtree(os.environ.get("METAFAM_TEST_JAX_CACHE", ""), ignore_errors=True)
