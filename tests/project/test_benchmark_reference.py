"""The harness that runs the reference library next to metafam (benchmarks/reference_lo.py): its own pieces only.

The reference library itself is not installed in CI; these check what the harness adds around it.
"""

import dataclasses
import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "benchmarks"))
import reference_lo  # noqa: E402


def test_wrong_source_directory_is_a_clear_error(tmp_path):
  with pytest.raises(SystemExit, match=r"--reference_src .*learned_optimization/__init__.py"):
    reference_lo.load(str(tmp_path))


def test_flax_dataclass_stand_in_is_a_pytree_with_replace():
  @reference_lo._flax_dataclass
  class State:
    params: jnp.ndarray
    step: jnp.ndarray
    name: str = dataclasses.field(default="s", metadata={"pytree_node": False})

  s = State(jnp.ones(3), jnp.asarray(2))
  doubled = jax.jit(lambda s: jax.tree.map(lambda x: 2 * x, s))(s)
  assert doubled.params.tolist() == [2.0, 2.0, 2.0] and int(doubled.step) == 4 and doubled.name == "s"
  assert len(jax.tree.leaves(s)) == 2  # the static field is not a leaf
  moved = s.replace(step=jnp.asarray(5))
  assert int(moved.step) == 5 and int(s.step) == 2  # frozen: replace returns a new instance
  with pytest.raises(dataclasses.FrozenInstanceError):
    s.step = 3


def test_stub_modules_fail_loudly_when_called():
  mod = reference_lo._stub_module("_metafam_test_stub.checkpoints")
  try:
    with pytest.raises(NotImplementedError, match="_metafam_test_stub.checkpoints.restore_checkpoint"):
      mod.restore_checkpoint("/nowhere")
  finally:
    del sys.modules["_metafam_test_stub.checkpoints"]



# What learned_optimization imports from flax (and through flax, TensorFlow and tensorboard), stand-ins or real.
_LO_IMPORTS = """
import sys
sys.path.insert(0, {benchmarks!r})
import reference_lo
reference_lo._install_shims()
import flax
import flax.struct
from flax import jax_utils, serialization
from flax.metrics import tensorboard
from flax.training import checkpoints, prefetch_iterator
import tensorflow.compat.v2 as tf
import tensorflow_datasets as tfds
print("real flax" if hasattr(flax, "__version__") else "stand-in flax")
if not hasattr(sys.modules["tensorflow"], "__version__"):  # the TensorFlow stand-in: summary writing is a stub
  try:
    tensorboard.SummaryWriter("/nonexistent")
  except NotImplementedError:
    print("summary writer stubbed")
if {lo_src!r}:
  reference_lo.load({lo_src!r})
  print("learned_optimization imported")
"""


def _run_lo_imports(lo_src=""):
  """Runs `_LO_IMPORTS` in a child process (the shims change its sys.modules for good); returns its output."""
  benchmarks = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
  proc = subprocess.run([sys.executable, "-c", _LO_IMPORTS.format(benchmarks=benchmarks, lo_src=lo_src)],
                        capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  return proc.stdout


def _installed(*names):
  return all(importlib.util.find_spec(name) is not None for name in names)


@pytest.mark.skipif(not _installed("flax", "tensorboard"),
                    reason="needs the real flax and tensorboard installed (not dependencies of this project)")
def test_lo_imports_with_the_real_flax_and_tensorboard_installed():
  # The real flax.metrics.tensorboard imports TensorFlow and tensorboard, whose hparams plugin calls
  # tf.make_tensor_proto at import time: with the TensorFlow stand-in that failed (on a GPU machine with both
  # installed), so there it is a stub. learned_optimization itself is imported when METAFAM_LO_SRC names its source.
  lo_src = os.environ.get("METAFAM_LO_SRC", "") if _installed("gin") else ""
  out = _run_lo_imports(lo_src)
  assert out.startswith("real flax")
  assert ("summary writer stubbed" in out) == (not _installed("tensorflow"))
  assert ("learned_optimization imported" in out) == bool(lo_src)


def test_lo_imports_with_the_stand_ins():
  if _installed("flax"):
    pytest.skip("the real flax is installed: the test above covers it")
  out = _run_lo_imports()
  assert out.startswith("stand-in flax") and ("summary writer stubbed" in out) == (not _installed("tensorflow"))
