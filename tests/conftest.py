"""Suite-wide test settings.

Compiling vmapped random initializers on CPU is several times faster with ``jax_threefry_partitionable=False``
(measured in tests/test_task_suite.py: `check_family` of the four conv/AE/LM families 86 s -> 35 s of CPU time).
No test pins random numbers, so the suite uses the faster setting; the library itself never changes JAX's config.

The suite also keeps the command line's persistent compilation cache off, and asks for two CPU devices (before JAX starts its backend) so that lane sharding is tested on any
machine; computations not placed explicitly still run on the first device only.
"""

import gc
import os
import sys

import jax
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # shared helpers: influence.py, meta_setup.py
jax.config.update("jax_threefry_partitionable", False)
# The CLI, called in-process by tests, would otherwise turn on JAX's persistent compilation cache in ~/.cache for the
# rest of the test process (tests stay hermetic; serializing some multi-device programs into it crashed XLA).
os.environ["METAFAM_JAX_CACHE"] = ""
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
