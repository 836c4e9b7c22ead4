"""The harness that runs the reference library next to metafam (benchmarks/reference_lo.py): its own pieces only.

The reference library itself is not installed in CI; these check what the harness adds around it.
"""

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
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
