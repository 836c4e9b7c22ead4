"""Checkpoints (metafam-checkpoint-v2, .npz): no load path executes code, every state kind round-trips exactly,
broken files and wrong templates are refused by name, pickles are refused unread, umask permissions."""

import builtins
import io
import json
import os
import pickle

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from meta_setup import build_trainer, quadratic_family
from metafam import cli
from metafam.benchmark import learned_optimizer, load_theta, score
from metafam.inner import ConstantSchedule
from metafam.io import atomic_write, write_json
from metafam.optimizers import SGD, HandDesigned, LearnableAdam, LearnableSGD, LearnedOptimizer, MLPLOpt
from metafam import optimizers as optimizers_module
from metafam.outer_trainers import MetaTrainState, MetaTrainer, make_estimator
from metafam.runs import checkpoint, train
from metafam.runs.checkpoint import CheckpointError
from metafam.runs import run_dir
from metafam.runs.run_dir import CHECKPOINT_NAME
from metafam.tasks.quadratic import QuadraticTask


@pytest.fixture(autouse=True)
def _no_persistent_cache(monkeypatch):
  monkeypatch.setenv("METAFAM_JAX_CACHE", "")


def same(a, b):
  """Exact equality of two pytrees: structure, dtypes and bits (typed keys through their key data)."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and np.shape(x) == np.shape(y), (x, y)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    x, y = np.asarray(x), np.asarray(y)
    np.testing.assert_array_equal(x.view(f"u{x.dtype.itemsize}") if x.dtype.kind == "V" else x,
                                  y.view(f"u{y.dtype.itemsize}") if y.dtype.kind == "V" else y)


# -- nothing a file holds is executed -------------------------------------------------------------------------------
class Evil:
  """Unpickling this creates ``marker`` (standing in for any code an attacker would run)."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return builtins.open, (self.marker, "w")


@pytest.fixture
def evil(tmp_path):
  """``(write(path, protocol=4), marker)``: writes a malicious pickle to ``path``."""
  marker = str(tmp_path / "PWNED")

  def write(path, protocol=4):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      f.write(pickle.dumps({"format": "metafam-checkpoint-v1", "metadata": {}, "tree": Evil(marker)},
                           protocol=protocol))
    return path

  yield write, marker
  assert not os.path.exists(marker), "a checkpoint loader unpickled the file"


def assert_pickle_refusal(message):
  assert "is a pickle, not a metafam-checkpoint-v2 checkpoint" in message and "arbitrary code" in message, message
  assert "\n" not in message


LOADERS = {
    "checkpoint.load": lambda p: checkpoint.load(p),
    "checkpoint.load(like=)": lambda p: checkpoint.load(p, like={"log_lr": np.float32(0)}),
    "checkpoint.read_header": checkpoint.read_header,
    "load_theta": load_theta,
    "learned_optimizer": lambda p: learned_optimizer(LearnableSGD(), p),
    "score": lambda p: score((LearnableSGD(), p), suite=[QuadraticTask(2)], horizon=8, baselines=(),
                             progress=False),
    "run_dir.restore": lambda p: run_dir.restore(build_trainer(), p, None, {}),
}


@pytest.mark.parametrize("name", ["evil.pkl", "evil.npz", "checkpoint"])
@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_every_library_load_path_refuses_a_malicious_pickle_without_unpickling(tmp_path, evil, loader, name):
  write, _ = evil
  path = write(str(tmp_path / name))
  with pytest.raises(CheckpointError) as e:
    LOADERS[loader](path)
  assert_pickle_refusal(str(e.value))


def test_old_protocol_pickles_are_refused_by_name_or_as_not_npz(tmp_path, evil):
  write, _ = evil
  with pytest.raises(CheckpointError, match="is a pickle"):
    checkpoint.load(write(str(tmp_path / "old.pkl"), protocol=0))
  with pytest.raises(CheckpointError, match="corrupted or not a metafam checkpoint"):
    load_theta(write(str(tmp_path / "old.npz"), protocol=0))


def test_meta_train_resume_refuses_a_pickle_in_the_output_dir(tmp_path, evil):
  write, _ = evil
  out = str(tmp_path / "run")
  path = write(os.path.join(out, CHECKPOINT_NAME))
  before = open(path, "rb").read()
  with pytest.raises(CheckpointError) as e:
    train(build_trainer(), 2, output_dir=out, progress=False)
  assert_pickle_refusal(str(e.value))
  # Nothing started over, and the refused run took its directory lock (metafam.io.LOCK_NAME) back out.
  assert os.listdir(out) == [CHECKPOINT_NAME] and open(path, "rb").read() == before


@pytest.mark.parametrize("command", ["evaluate", "benchmark", "meta-train"])
def test_cli_refuses_a_malicious_pickle_with_exit_code_2(tmp_path, evil, capsys, command):
  write, _ = evil
  out = str(tmp_path / "out")
  if command == "meta-train":
    write(os.path.join(out, CHECKPOINT_NAME))
    args = ["--family=quadratic_family_10", "--optimizer=learnable_sgd", "--num_steps=2", "--progress=false"]
  else:
    args = ["--optimizer=learnable_sgd", f"--checkpoint={write(str(tmp_path / 'evil.npz'))}",
            "--task=quadratic_10", "--inner_steps=8", "--progress=false"]
  code = cli.main(["metafam", command, f"--output_dir={out}"] + args)
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("metafam: error: ") and len(err.strip().splitlines()) == 1, err
  assert_pickle_refusal(err.strip())


def test_an_npz_with_object_arrays_is_refused_without_unpickling(tmp_path, evil):
  _, marker = evil
  header = {"format": checkpoint.FORMAT, "metadata": {}, "structure": {"kind": "leaf", "index": 0},
            "leaves": [{"dtype": "float32", "shape": [1]}]}
  for members in ({"leaf_0": np.array([Evil(marker)], dtype=object)},
                  {"metafam_header": np.array([Evil(marker)], dtype=object)}):
    path = str(tmp_path / "crafted.npz")
    np.savez(path, **{"metafam_header": np.frombuffer(json.dumps(header).encode(), np.uint8), **members})
    for load in (checkpoint.load, load_theta):
      with pytest.raises(CheckpointError, match="pickled object data"):
        load(path)


# -- round trips ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def estimator_trainer():
  """A trainer whose state holds PES, NRES and TBPTT worker states (LaneState, OptimizerState, optax states)."""
  family, lopt = quadratic_family(), LearnableSGD(0.01)
  estimators = [make_estimator("pes", family, lopt, num_tasks=2, unroll_length=4, schedule=ConstantSchedule(8)),
                make_estimator("nres", family, lopt, num_tasks=2, unroll_length=4, schedule=ConstantSchedule(8)),
                make_estimator("tbptt", family, lopt, num_tasks=2, unroll_length=4, schedule=ConstantSchedule(8))]
  return MetaTrainer(lopt, estimators, optax.adam(0.1))


IDENTITY = {"kinds": ("pes", "nres", "tbptt"), "n": 3}


def test_meta_train_state_round_trips_exactly(tmp_path, estimator_trainer):
  trainer = estimator_trainer
  state = trainer.init(jax.random.key(3))
  path = str(tmp_path / "state.npz")
  identity = run_dir.run_identity(trainer, IDENTITY)
  run_dir.save(trainer, state, path, identity)
  restored = run_dir.restore(trainer, path, trainer.init(jax.random.key(4)), identity)  # the tuple is stored as a list
  assert isinstance(restored, MetaTrainState)
  same(state, restored)
  header = checkpoint.read_header(path)
  assert header.root_class == "MetaTrainState" and header.metadata == {
      "step": 0, "config": {"kinds": ["pes", "nres", "tbptt"], "n": 3, "estimators": ["PES", "NoiseReuseES",
                                                                                        "TruncatedBPTT"],
                            "learned_opt": "LearnableSGD"}}
  plain, metadata = checkpoint.load(path)  # no template: plain containers for inspection
  assert metadata == header.metadata
  assert set(plain) == {"theta", "opt_state", "worker_states", "key_data", "step"}
  assert set(plain["worker_states"][0]) == {"lanes", "accumulator", "eps", "age"}
  assert set(plain["opt_state"][0]) == {"count", "mu", "nu"} and plain["opt_state"][1] == {}
  np.testing.assert_array_equal(plain["worker_states"][2]["length"], state.worker_states[2].length)


def learned_optimizers():
  found = [getattr(optimizers_module, n) for n in optimizers_module.__all__]
  classes = [c for c in found if isinstance(c, type) and issubclass(c, LearnedOptimizer) and c is not LearnedOptimizer]
  assert {LearnableSGD, LearnableAdam, MLPLOpt, HandDesigned} <= set(classes)
  return [c(SGD(0.1)) if c is HandDesigned else c() for c in classes]


@pytest.mark.parametrize("lopt", learned_optimizers(), ids=lambda l: type(l).__name__)
def test_theta_of_every_learned_optimizer_round_trips(tmp_path, lopt):
  theta = jax.tree.map(lambda x: x + jax.random.normal(jax.random.key(1), x.shape, x.dtype),
                       lopt.init(jax.random.key(0)))
  state = MetaTrainState(theta=theta, opt_state=optax.adam(1e-3).init(theta), worker_states=(),
                         key_data=jax.random.key_data(jax.random.key(1)), step=jnp.int32(5))
  for tree in (theta, state):  # a bare theta and a meta-training checkpoint
    path = str(tmp_path / f"{type(tree).__name__}.npz")
    checkpoint.save(path, tree, {"step": 5})
    same(jax.tree.map(np.asarray, theta), load_theta(path))
    same(tree, checkpoint.load(path, like=tree)[0])
    opt = learned_optimizer(lopt, path)
    if hasattr(opt, "theta"):
      same(theta, opt.theta)


def test_every_dtype_keys_and_empty_nodes_round_trip(tmp_path):
  rng = np.random.default_rng(0)
  tree = {
      "bf16": jnp.asarray(rng.normal(size=(3, 2)), jnp.bfloat16), "f16": np.float16([1.5, -0.0, np.inf]),
      "f8": np.asarray(rng.normal(size=4), ml_dtypes.float8_e4m3fn), "i4": np.asarray([-8, 7, 0], ml_dtypes.int4),
      "f32": jnp.asarray([np.nan, 1e-30], jnp.float32), "f64": np.float64(np.pi), "c64": np.complex64(1 - 2j),
      "i32": jnp.arange(3, dtype=jnp.int32), "u32": np.uint32([2 ** 32 - 1]), "u8": np.zeros((2, 0), np.uint8),
      "i64": np.int64(-2 ** 40), "bool": jnp.asarray([True, False]),
      "key": jax.random.key(7), "keys": jax.random.split(jax.random.key(8, impl="rbg"), (2, 3)),
      "empty": ({}, (), [], None), "nested": [(None, {"z": np.int8(-1)}), {"a": ()}],
      "ints": {3: np.int32(3), -1: np.float32(-1)},
      "adam": optax.ScaleByAdamState(count=jnp.int32(2), mu={"w": jnp.ones(2)}, nu={"w": jnp.zeros(2)}),
  }
  path = str(tmp_path / "dtypes.npz")
  checkpoint.save(path, tree, {"what": ["dtypes"], "nan": float("nan")})
  restored, metadata = checkpoint.load(path, like=tree)
  same(tree, restored)
  assert isinstance(restored["adam"], optax.ScaleByAdamState) and metadata["what"] == ["dtypes"]
  assert str(restored["keys"].dtype) == "key<rbg>" and np.isnan(metadata["nan"])
  plain, _ = checkpoint.load(path)  # the namedtuple becomes a dict; everything else is as saved
  assert plain["empty"] == ({}, (), [], None) and set(plain["adam"]) == {"count", "mu", "nu"}
  assert list(plain["ints"]) == [-1, 3]
  same({k: v for k, v in tree.items() if k != "adam"}, {k: v for k, v in plain.items() if k != "adam"})
  like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)  # templates need no data
  same(tree, checkpoint.load(path, like=like)[0])
  checkpoint.save(path, jnp.bfloat16(2.5), {})  # a bare leaf
  leaf, _ = checkpoint.load(path)
  assert leaf.dtype == jnp.bfloat16 and leaf.shape == () and float(leaf) == 2.5


def test_unsupported_leaves_and_metadata_are_refused_on_save(tmp_path):
  with pytest.raises(CheckpointError, match=r"leaf \['s'\]: dtype <U3"):
    checkpoint.save(str(tmp_path / "x.npz"), {"s": "abc"}, {})
  with pytest.raises(TypeError, match="JSON-serializable"):
    checkpoint.save(str(tmp_path / "x.npz"), {}, {"f": object()})
  assert not os.listdir(tmp_path)


# -- broken files and wrong templates -------------------------------------------------------------------------------
def test_corrupted_truncated_and_foreign_files_are_refused(tmp_path):
  pattern = np.arange(4096, dtype=np.uint32)
  path = str(tmp_path / "c.npz")
  checkpoint.save(path, {"w": pattern}, {})
  data = open(path, "rb").read()
  cases = {"truncated": data[: len(data) // 2], "empty": b"", "garbage": b"hello world",
           "bit flip": data.replace(pattern[1000:1001].tobytes() + pattern[1001:1002].tobytes(),
                                    b"\xff\xff\xff\xff" + pattern[1001:1002].tobytes())}
  assert cases["bit flip"] != data
  for what, content in cases.items():
    with open(path, "wb") as f:
      f.write(content)
    with pytest.raises(CheckpointError, match="corrupted") as e:
      checkpoint.load(path)
    assert "\n" not in str(e.value), what
  buf = io.BytesIO()
  np.savez(buf, w=pattern)  # a plain npz: no header
  open(path, "wb").write(buf.getvalue())
  with pytest.raises(CheckpointError, match="no metafam_header member"):
    checkpoint.load(path)
  np.savez(path, metafam_header=np.frombuffer(b'{"format": "other-v9"}', np.uint8))
  with pytest.raises(CheckpointError, match="is not a metafam-checkpoint-v2 checkpoint"):
    checkpoint.load(path)
  with pytest.raises(CheckpointError, match="no checkpoint at"):
    checkpoint.load(str(tmp_path / "missing.npz"))


def test_a_header_that_disagrees_with_its_arrays_is_refused(tmp_path):
  path = str(tmp_path / "h.npz")
  header = {"format": checkpoint.FORMAT, "metadata": {}, "structure": {"kind": "leaf", "index": 0},
            "leaves": [{"dtype": "float32", "shape": [2]}]}
  for leaf, message in [(np.zeros(3, np.float32), "does not match the header"),
                        (np.zeros(2, np.float64), "does not match the header")]:
    np.savez(path, metafam_header=np.frombuffer(json.dumps(header).encode(), np.uint8), leaf_0=leaf)
    with pytest.raises(CheckpointError, match=message):
      checkpoint.load(path)
  header["leaves"][0]["dtype"] = "object"
  np.savez(path, metafam_header=np.frombuffer(json.dumps(header).encode(), np.uint8), leaf_0=np.zeros(2))
  with pytest.raises(CheckpointError, match="unknown dtype 'object'"):
    checkpoint.load(path)


def test_a_wrong_template_is_refused_naming_the_leaf(tmp_path):
  tree = {"a": {"w": np.zeros((2, 3), np.float32)}, "b": (np.int32(1), None),
          "s": MetaTrainState(theta={}, opt_state=(), worker_states=(), key_data=np.zeros(2, np.uint32), step=1)}
  path = str(tmp_path / "t.npz")
  checkpoint.save(path, tree, {})
  cases = [
      ({**tree, "a": {"w": np.zeros((3, 2), np.float32)}}, r"leaf \['a'\]\['w'\] is float32\[2, 3\], expected "
                                                            r"float32\[3, 2\]"),
      ({**tree, "a": {"w": np.zeros((2, 3), jnp.bfloat16)}}, r"leaf \['a'\]\['w'\] is float32\[2, 3\], expected "
                                                              r"bfloat16\[2, 3\]"),
      ({**tree, "a": {"v": np.zeros((2, 3), np.float32)}}, r"at \['a'\] the checkpoint holds a dict with keys "
                                                            r"\['w'\], expected a dict with keys \['v'\]"),
      ({**tree, "b": [np.int32(1), None]}, r"at \['b'\] the checkpoint holds a tuple of 2, expected a list of 2"),
      ({**tree, "b": (np.int32(1), np.int32(2))}, r"at \['b'\]\[1\] the checkpoint holds None, expected an array"),
      ({**tree, "s": (1, 2)}, r"at \['s'\] the checkpoint holds a MetaTrainState with fields"),
      ({**tree, "s": MetaTrainState(theta={"x": 1.0}, opt_state=(), worker_states=(), key_data=1, step=1)},
       r"at \['s'\].theta the checkpoint holds a dict with keys \[\], expected a dict with keys \['x'\]"),
      ({**tree, "s": MetaTrainState(theta={}, opt_state=(), worker_states=(), key_data=jax.random.key(0), step=1)},
       r"leaf \['s'\].key_data is uint32\[2\], expected key<fry>\[\]"),
  ]
  for like, message in cases:
    with pytest.raises(CheckpointError, match=message):
      checkpoint.load(path, like=like)


# -- permissions ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_written_files_follow_the_umask_like_open(tmp_path, umask):
  old = os.umask(umask)
  try:
    with open(tmp_path / "reference", "w"):
      pass
    atomic_write(str(tmp_path / "raw.bin"), b"x")
    write_json(str(tmp_path / "summary.json"), {"a": 1})
    checkpoint.save(str(tmp_path / "c.npz"), {"w": np.zeros(2)}, {})
    atomic_write(str(tmp_path / "raw.bin"), b"replaced")  # replacing keeps the same rule
  finally:
    os.umask(old)
  modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
  assert modes == dict.fromkeys(["reference", "raw.bin", "summary.json", "c.npz"], 0o666 & ~umask)
