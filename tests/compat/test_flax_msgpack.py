"""flax-msgpack checkpoints (learned_optimization's format) read and written without flax.

The reference bytes are built here with the `msgpack` package directly, following flax's format (state dicts of
string-keyed maps; arrays as extension type 1 holding the msgpack of ``(shape, dtype name, C-order bytes)``, numpy
scalars as type 3, complex numbers as type 2), from known arrays, so the reader is checked against the format, not
against the writer it ships with.
"""

import os
import pickle
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

msgpack = pytest.importorskip("msgpack")

from metafam.benchmark.runner import learned_optimizer, load_theta  # noqa: E402
from metafam.compat import flax_msgpack  # noqa: E402
from metafam.compat.learned_optimization import checkpoints  # noqa: E402
from metafam.optimizers.hyper_v2 import HyperV2  # noqa: E402
from metafam.runs.checkpoint import CheckpointError  # noqa: E402


def _record(a):
  return msgpack.packb((a.shape, a.dtype.name, a.tobytes("C")), use_bin_type=True)


def _flax_default(x):
  if isinstance(x, np.ndarray):
    return msgpack.ExtType(1, _record(x))
  if isinstance(x, np.generic):
    return msgpack.ExtType(3, _record(np.asarray(x)))
  if isinstance(x, complex):
    return msgpack.ExtType(2, msgpack.packb((x.real, x.imag)))
  raise TypeError(type(x))


def flax_bytes(state_dict):
  """What ``flax.serialization.msgpack_serialize(state_dict)`` writes (arrays below the chunk size)."""
  return msgpack.packb(state_dict, default=_flax_default, strict_types=True)


KNOWN = {
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
    "bf16": np.asarray([1.5, -2.25, 3e38], dtype=ml_dtypes.bfloat16),
    "i32": np.asarray([[-3, 7]], np.int32), "i64": np.asarray(2 ** 40, np.int64).reshape(()),
    "u8": np.asarray([0, 255], np.uint8), "bool": np.asarray([True, False]),
    "empty": np.zeros((0, 4), np.float16), "c64": np.asarray([1 + 2j], np.complex64),
    "nested": {"a": {"b": np.ones(2, np.float64)}, "list": {"0": np.int8(5), "1": "text"}},
    "scalars": {"int": 3, "float": 0.25, "str": "gen", "none": None, "true": True, "npf": np.float32(1.5),
                "complex": 1.0 - 2.0j},
}


def _assert_same(got, want):
  if isinstance(want, dict):
    assert isinstance(got, dict) and set(got) == set(want)
    for k in want:
      _assert_same(got[k], want[k])
  elif isinstance(want, (np.ndarray, np.generic)):
    assert got.dtype == want.dtype and np.shape(got) == np.shape(want)
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()  # bit-exact
  else:
    assert type(got) is type(want) and got == want


def test_reads_flax_bytes_of_known_arrays_exactly():
  _assert_same(flax_msgpack.decode(flax_bytes(KNOWN)), KNOWN)


def test_writer_produces_flax_bytes_and_round_trips(tmp_path):
  class Pair(NamedTuple):
    hidden: jax.Array
    cell: jax.Array

  tree = {"theta": {"w": jnp.asarray(KNOWN["f32"]), "b": jnp.asarray(KNOWN["bf16"])},
          "state": Pair(jnp.ones((1, 2)), jnp.zeros((1, 2))), "seq": [jnp.arange(3), (np.int32(4), 2.5)],
          "gen_id": "run", "step": 7}
  state_dict = {"theta": {"w": KNOWN["f32"], "b": KNOWN["bf16"]},
                "state": {"hidden": np.ones((1, 2), np.float32), "cell": np.zeros((1, 2), np.float32)},
                "seq": {"0": np.arange(3, dtype=np.int32), "1": {"0": np.int32(4), "1": 2.5}},
                "gen_id": "run", "step": 7}
  assert flax_msgpack.encode(tree) == flax_bytes(state_dict)  # byte for byte what flax writes
  path = str(tmp_path / "theta.state")
  flax_msgpack.save(path, tree)
  assert flax_msgpack.looks_like_msgpack(path)
  like = jax.tree.map(lambda x: x if isinstance(x, str) else jnp.zeros_like(x), tree)
  back = flax_msgpack.load(path, like=like)
  assert back["gen_id"] == "run" and back["step"] == 7
  assert isinstance(back["state"], Pair) and isinstance(back["seq"], list) and isinstance(back["seq"][1], tuple)
  for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
    assert np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_chunked_arrays_are_reassembled(monkeypatch):
  big = np.arange(10, dtype=np.float32).reshape(2, 5)
  chunked = {"__msgpack_chunked_array__": True, "shape": {"0": 2, "1": 5},
             "chunks": {"0": big.reshape(-1)[:4], "1": big.reshape(-1)[4:8], "2": big.reshape(-1)[8:]}}
  np.testing.assert_array_equal(flax_msgpack.decode(flax_bytes({"w": chunked}))["w"], big)
  monkeypatch.setattr(flax_msgpack, "MAX_CHUNK_BYTES", 16)  # 4 float32 per chunk
  stored = msgpack.unpackb(flax_msgpack.encode({"w": big}), raw=False, ext_hook=lambda c, d: d)
  assert stored["w"]["__msgpack_chunked_array__"] is True and len(stored["w"]["chunks"]) == 3
  np.testing.assert_array_equal(flax_msgpack.decode(flax_msgpack.encode({"w": big}))["w"], big)


def test_compat_load_state_reads_lo_parameter_checkpoints(tmp_path):
  """LO's ``save_state(path, ParameterCheckpoint(theta, gen_id, step))`` and VeLO's ``(theta, "", 0)`` files."""
  theta = {"w": np.full((2, 2), 0.5, np.float32), "b": np.asarray([1.0, -1.0], np.float32)}
  path = str(tmp_path / "params")
  with open(path, "wb") as f:
    f.write(flax_bytes({"params": theta, "gen_id": "abc", "step": 12}))
  like = checkpoints.ParameterCheckpoint({"w": jnp.zeros((2, 2)), "b": jnp.zeros(2)}, "", 0)
  back = checkpoints.load_state(path, like)
  assert back.gen_id == "abc" and back.step == 12
  np.testing.assert_array_equal(back.params["w"], theta["w"])
  with open(path, "wb") as f:
    f.write(flax_bytes({"0": theta, "1": "", "2": 0}))
  restored, gen_id, step = checkpoints.load_state(path, (like.params, "", 0))
  np.testing.assert_array_equal(restored["b"], theta["b"]) and (gen_id, step) == ("", 0)
  np.testing.assert_array_equal(load_theta(path)["w"], theta["w"])
  with pytest.raises(CheckpointError, match="entry /0/w has shape \\(2, 2\\), the template \\(3,\\)"):
    checkpoints.load_state(path, ({"w": jnp.zeros(3), "b": jnp.zeros(2)}, "", 0))
  with pytest.raises(CheckpointError, match="no entry /0/v"):
    checkpoints.load_state(path, ({"v": jnp.zeros(3)}, "", 0))


def test_compat_save_state_writes_either_format(tmp_path):
  tree = {"w": jnp.arange(3.0), "n": jnp.asarray(4, jnp.int32)}
  for fmt in ("npz", "flax"):
    path = str(tmp_path / f"state.{fmt}")
    checkpoints.save_state(path, tree, format=fmt)
    assert flax_msgpack.looks_like_msgpack(path) == (fmt == "flax")
    back = checkpoints.load_state(path, jax.tree.map(jnp.zeros_like, tree))
    np.testing.assert_array_equal(back["w"], [0.0, 1.0, 2.0]) and int(back["n"]) == 4
  with pytest.raises(ValueError, match="format must be 'npz'.*got 'pickle'"):
    checkpoints.save_state(str(tmp_path / "x"), tree, format="pickle")


def test_hyper_v2_theta_from_an_lo_file_drives_the_optimizer(tmp_path):
  lopt = HyperV2(lstm_hidden_size=4, param_inits=2)
  theta = lopt.init(jax.random.key(0))
  path = str(tmp_path / "theta.state")
  with open(path, "wb") as f:  # the layout LO's HyperV2 theta has, lstm_init_state being haiku's LSTMState
    f.write(flax_bytes({"params": jax.tree.map(np.asarray, theta), "gen_id": "", "step": 0}))
  opt = learned_optimizer(lopt, path)
  for got, want in zip(jax.tree.leaves(opt.theta), jax.tree.leaves(theta)):
    np.testing.assert_array_equal(got, want)


def _ext(code, payload):
  return msgpack.packb({"w": msgpack.ExtType(code, payload)})


@pytest.mark.parametrize("data, message", [
    (b"\x93\x01\x02", "not a flax-msgpack checkpoint|readable"),
    (os.urandom(0) + b"\xc1", "not a flax-msgpack checkpoint"),
    (flax_bytes({"w": np.ones(3, np.float32)})[:-5], "not a flax-msgpack checkpoint"),
    (flax_bytes({"w": 1}) + b"\x00", "not a flax-msgpack checkpoint"),
    (_ext(9, b"x"), "unknown msgpack extension type 9"),
    (_ext(1, msgpack.packb(((2,), "object", b"12345678"), use_bin_type=True)), "dtype 'object'"),
    (_ext(1, msgpack.packb(((2,), "<U1", b"12345678"), use_bin_type=True)), "dtype '<U1'"),
    (_ext(1, msgpack.packb(((3,), "float32", b"12345678"), use_bin_type=True)), "needs 12 bytes.*holds 8"),
    (_ext(1, msgpack.packb(((-1,), "float32", b""), use_bin_type=True)), "malformed array shape"),
    (_ext(1, msgpack.packb("float32", use_bin_type=True)), "malformed array record"),
])
def test_garbage_and_hostile_inputs_give_clear_errors(data, message):
  with pytest.raises(CheckpointError, match=message):
    flax_msgpack.decode(data)


def test_pickles_are_never_taken_for_msgpack(tmp_path):
  path = str(tmp_path / "theta.bin")
  with open(path, "wb") as f:
    pickle.dump({"w": np.ones(2)}, f, protocol=4)  # starts with 0x80, an empty fixmap byte
  assert not flax_msgpack.looks_like_msgpack(path)
  with pytest.raises(CheckpointError, match="pickle"):
    load_theta(path)


def test_non_finite_values_load_as_stored_but_not_as_theta(tmp_path):
  path = str(tmp_path / "params")
  with open(path, "wb") as f:
    f.write(flax_bytes({"params": {"w": np.asarray([1.0, np.nan], np.float32)}, "gen_id": "", "step": 0}))
  back = checkpoints.load_state(path, checkpoints.ParameterCheckpoint({"w": jnp.zeros(2)}, "", 0))
  assert np.isnan(back.params["w"][1])
  with pytest.raises(CheckpointError, match=r"\['w'\] holds 1 NaN"):
    load_theta(path)


def test_missing_msgpack_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "msgpack", None)
  with pytest.raises(ImportError, match=r"pip install 'metafam\[msgpack\]'"):
    flax_msgpack.decode(b"\x80")


def test_numbered_checkpoints_in_a_directory(tmp_path):
  d = str(tmp_path / "ckpts")
  assert checkpoints.last_checkpoint_idx(d, "theta_") is None and not checkpoints.has_checkpoint(d, "theta_")
  like = {"w": jnp.zeros(2)}
  assert checkpoints.restore_checkpoint(d, like, "theta_") is like  # nothing saved: the template back, as flax does
  for step in range(4):
    checkpoints.save_checkpoint(d, "theta_", {"w": jnp.full(2, float(step))}, step, keep=2,
                                format="flax" if step % 2 else "npz")
  assert sorted(os.listdir(d)) == ["theta_2", "theta_3"] and checkpoints.last_checkpoint_idx(d, "theta_") == 3
  np.testing.assert_array_equal(checkpoints.restore_checkpoint(d, like, "theta_")["w"], [3.0, 3.0])
  saved = checkpoints.periodically_save_checkpoint(d, 10, {"theta_": lambda: {"w": jnp.ones(2)}}, time_interval=None,
                                                   step_interval=5)
  assert saved == {"theta_": os.path.join(d, "theta_4")}
  assert checkpoints.periodically_save_checkpoint(d, 11, {"theta_": like}, time_interval=None, step_interval=5) is None
  assert checkpoints.periodically_save_checkpoint(d, 11, {"theta_": like}, time_interval=3600) is None  # too recent
