"""The import surface of learned_optimization ("LO") under the compat prefix.

`tests/compat/data/lo_public_names.json` (written by `tools/lo_surface.py` from an LO checkout, without importing
it) lists every module-level name of every LO module, public and private (and of the test modules research code
imports, `tasks.fixed.vit_test`), and the signatures of its functions and classes. Here every listed
module must import as ``metafam.compat.learned_optimization.<module>`` (also in a fresh process whose sockets refuse
to connect: nothing is downloaded), every listed name must resolve, and every signature must
take the calls LO's does (`lo_surface.signature_problems`). What is left out is in `EXCLUDED` with its reason;
modules that other branches of issue 26 provide are in `PENDING_OTHER_BRANCHES` (skipped until they are merged).
"""

import importlib
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tools"))
import lo_surface  # noqa: E402  pylint: disable=g-import-not-at-top

DATA = lo_surface.load_data()

# Modules (a key covers the module and its submodules) built on other branches of issue 26; emptied at merge.
# ("research" itself is the package research.general_lopt lives in.)
PENDING_OTHER_BRANCHES: set = set()  # every group of issue 26 is merged

_PAPER = "paper-specific research project (its own models and experiments, not LO's library surface)"
_GIN_SCRIPT = ("absl/gin command-line script of LO's cluster workflow; metafam has no gin: the module raises "
               "ImportError naming the missing dependency")
_TIME_MODEL = ("LO's timing models trained on its cloud timing data (haiku, gin, tensorflow): the module raises "
               "ImportError naming the missing dependency")
_STATE = ("the optimizer's state is metafam's own (its fields differ: metafam's optimizer keeps other statistics); "
          "LO's state class would name a type this optimizer never produces")
_INTERNAL = ("the reference's estimator internals over host-side unroll outputs; metafam computes the estimate "
             "inside its one jitted estimator, and a second copy of that math would be a second engine")

_PRIVATE_STATE = ("module-internal state of LO's implementation (a cache, timer, thread pool, thread-local stack or "
                  "oryx tag): nothing a caller can use; metafam's counterpart keeps its own")
_PRIVATE_IO = ("LO's private I/O helper for TFDS, gfile / cloud paths, gin configurations or device-buffer "
               "management, none of which metafam uses (the public functions around it are provided)")
_PRIVATE_DEVICES = "LO's pmap / per-device helper; metafam shards with jax.sharding inside its one engine"
_PRIVATE_OTHER_MODEL = ("a component of LO's {} that metafam's implementation does not have (its state and "
                        "features differ), so a copy here would compute nothing metafam's optimizer uses")

# {module or "module.name": reason}. A module key covers its submodules.
EXCLUDED = {
    # research/: paper projects (research.general_lopt is LO's public learned optimizer and is covered).
    "research.brax": _PAPER + "; needs brax",
    "research.data_driven": _PAPER + "; needs haiku models and TFDS data",
    "research.discovered_policy_optimisation": _PAPER + "; needs brax / gymnax",
    "research.distill": _PAPER,
    "research.es_scaling": _PAPER,
    "research.hysteresis": _PAPER,
    "research.jaxnerf": _PAPER + "; needs NeRF data",
    "research.scaling": _PAPER,
    "research.univ_nfn": _PAPER + "; needs its own neural-functional layers",
    # scripts
    "entry_points": _GIN_SCRIPT,
    "run_outer_train_single": _GIN_SCRIPT,
    "setup_experiment": _GIN_SCRIPT,
    "outer_train": _GIN_SCRIPT + " (courier workers, population controller); single-machine meta-training is "
                   "outer_trainers.gradient_learner.SingleMachineGradientLearner",
    "distributed": "courier-based multi-machine learner/worker RPC; metafam distributes with jax.distributed "
                   "(metafam.distributed): the module raises ImportError naming courier",
    "baselines": "baseline archives on LO's cloud storage (gfile paths, gin-configured runs): the module raises "
                 "ImportError naming the missing dependency; metafam's tuned-Adam baseline is metafam.evaluation",
    # time_filter: timings is provided (over metafam's truncated step); the rest is LO's timing-model pipeline.
    **{f"time_filter.{m}": _TIME_MODEL for m in ("model_paths", "run_sample_and_time", "run_train_time_model",
                                                  "time_model", "time_model_data")},
    "tasks.datasets.beam": "Apache Beam pipeline that resizes TFDS image datasets on LO's cluster; metafam resizes "
                           "Fashion-MNIST on the fly and reads other datasets from local files",
    "research.general_lopt.configs": "gin parameter dictionaries of LO's cluster meta-training runs of VeLO (read by "
                                     "LO's launchers, which the issue excludes); no API",
    # single names
    **{f"optimizers.{m}SM3OptState": "SM3's state is `OptaxState`: metafam's SM3 views scalar params as 1-vectors "
                                     "inside its optax transformation, so there is no `should_reshape` to keep"
       for m in ("", "optax_opts.")},
    "tasks.parametric.lopt_trunc.truncated_snes": "re-export of LO's research.hyper_lopt estimator modules (outside "
                                                  "LO's library surface, not provided): ParametricLOptTrunc raises "
                                                  "NotImplementedError naming the modes TruncatedSNES and "
                                                  "TruncatedESSharedNoiseV2",
    "tasks.parametric.lopt_trunc.truncated_snes2": "see tasks.parametric.lopt_trunc.truncated_snes",
    "profile.FLAGS": "absl flag object; profile timings are logged at DEBUG level of the module's logger instead",
    "learned_optimizers.nn_adam.NNAdamState": _STATE + " (per-layer hyper-parameters from an LSTM over layers)",
    "learned_optimizers.rnn_mlp_lopt.RNNMLPLOptState": _STATE + " (per-tensor LSTM state)",
    "outer_trainers.truncated_pes.PESWorkerState": "resolves to metafam's PES worker state (lanes, accumulator, "
                                                   "noise, age); LO's fields (pos_state, neg_state) differ",
    "outer_trainers.truncated_es.compute_es_grad": _INTERNAL,
    "outer_trainers.truncated_pes.compute_pes_grad": _INTERNAL,
    "outer_trainers.full_es.traj_loss_antithetic_es": _INTERNAL,
    "outer_trainers.full_es.pmap_traj_loss_antithetic_es": _INTERNAL,
    "outer_trainers.full_es.last_recompute_antithetic_es": _INTERNAL,
    "outer_trainers.full_grad.meta_loss_and_grad": _INTERNAL,
    # private names (module-level names starting with "_")
    **{f"{m}.{n}": _PRIVATE_STATE for m, names in (
        ("checkpoints", ("_last_checkpoint_time", "_last_checkpoint_futures", "_checkpoint_thread_pool")),
        ("summary", ("_", "_SOW_TAG", "_summary_scope_stack", "_thread_state", "_SummaryState")),
        ("tasks.datasets.base", ("_CACHED_DATASETS",)), ("optimizers.opt_list", ("_cached_configs",)),
        ("eval_training", ("_CachedTrainFun", "_cached_vectorize_train_fns"))) for n in names},
    **{f"{m}.{n}": _PRIVATE_IO for m, names in (
        ("checkpoints", ("_ty_to_state_dict", "_ty_from_state_dict")),
        ("tasks.datasets.base", ("_cached_tfds_load", "_tfrecord_filenames_from_dataset_name")),
        ("tasks.datasets.language", ("_load",)), ("filesystem", ("_path_on_gcp",)),
        ("optimizers.opt_list", ("_read_local_file", "_load_file", "_get_optimizer_config")),
        ("research.general_lopt.pretrained_optimizers", ("_pretrain_root", "_pretrain_no_config_root", "_build",
                                                          "_pretrained_lopt_load_baseline")),
        ("learned_optimizers.opt_from_checkpoint", ("_GinScopeClass",)),
        ("time_filter.timings", ("_jax_clear_device_buffers",))) for n in names},
    **{f"{m}.{n}": _PRIVATE_DEVICES for m, names in (
        ("eval_training", ("_pmap_vector_random_split",)), ("outer_trainers.truncated_pes", ("_pmap_reduce",)),
        ("outer_trainers.gradient_learner", ("_tree_zeros_on_device", "_tree_zeros_on_device_inner"))) for n in names},
    **{f"{m}.{n}": _INTERNAL for m, names in (
        ("outer_trainers.full_es", ("_es_grad",)),
        ("outer_trainers.gradient_learner", ("_get_theta_update_fn",)),
        ("eval_training", ("_next_state", "_loss_and_aux", "_batch_eval")),
        ("time_filter.timings", ("_unrolled_meta_loss",))) for n in names},
    **{f"learned_optimizers.rnn_mlp_lopt.{n}": _PRIVATE_OTHER_MODEL.format("RNNMLPLOpt") for n in (
        "_LossNormalizerState", "_LossNormalizer", "_DynamicGradientClipperState", "_DynamicGradientClipper")},
    **{f"optimizers.nadamw.{n}": _PRIVATE_OTHER_MODEL.format("NAdamW (an optax chain in metafam)") for n in (
        "_NAdamWHyperParams", "_NAdamWAccumulators", "_nadamw_update")},
}

# Modules whose import must fail with an ImportError that names what is missing (the script modules above).
RAISING_MODULES = ("entry_points.run_single_machine_trainer", "outer_train", "distributed", "setup_experiment",
                   "baselines.utils", "time_filter.time_model", "run_outer_train_single")


def _matches(key_set, module, name=None):
  for key in key_set:
    if module == key or module.startswith(key + "."):
      return True
    if name is not None and key == f"{module}.{name}":
      return True
  return False


def _active_modules():
  return [m for m in DATA["modules"] if not _matches(PENDING_OTHER_BRANCHES, m) and not _matches(EXCLUDED, m)]


def test_data_file_records_its_source_and_is_not_empty():
  assert DATA["source"] == "google/learned_optimization"
  assert DATA["commit"].startswith("32186aa")
  assert len(DATA["modules"]) > 100
  for skipped in DATA["skipped_dirs"]:
    assert not any(m == skipped or m.startswith(skipped + ".") for m in DATA["modules"])


def test_data_file_lists_private_names_and_the_imported_test_module():
  modules = DATA["modules"]
  assert modules["tasks.fixed.image_mlp"]["_MLPImageTask"].get("private") is True
  assert modules["learned_optimizers.mlp_lopt"]["MLPLOptState"].get("private") is None
  assert "VITTest" in modules["tasks.fixed.vit_test"]
  assert not any(n.startswith("__") for names in modules.values() for n in names)
  # `from x import *` re-exports public names only.
  assert not any(n.startswith("_") for n in modules["tasks.fixed.all"])


def test_exclusions_and_pending_name_real_modules_or_names():
  for key in list(EXCLUDED) + list(PENDING_OTHER_BRANCHES):
    module_hit = any(m == key or m.startswith(key + ".") for m in DATA["modules"])
    module, _, name = key.rpartition(".")
    name_hit = module in DATA["modules"] and name in DATA["modules"][module]
    assert module_hit or name_hit, f"stale exclusion {key!r}"
    assert EXCLUDED.get(key, "reason") != "", key


@pytest.mark.parametrize("module", _active_modules())
def test_module_imports_and_its_names_resolve_with_lo_signatures(module):
  names = DATA["modules"][module]
  result = lo_surface.check_module(module, names)
  assert "" not in result, result.get("")
  problems = {name: p for name, p in result.items() if p and not _matches(EXCLUDED, module, name)}
  assert not problems, f"{module}: {problems}"


_NO_NETWORK_IMPORT = """
import importlib, socket, sys

def _blocked(*args, **kwargs):
  raise RuntimeError("network access during import")

socket.socket.connect = _blocked
socket.create_connection = _blocked
for module in sys.argv[1:]:
  importlib.import_module(module)
print("imported", len(sys.argv) - 1)
"""


def test_every_listed_module_imports_in_a_fresh_process_without_network():
  modules = [f"{lo_surface.NEW_PREFIX}.{m}" for m in _active_modules()]
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, "-c", _NO_NETWORK_IMPORT, *modules], capture_output=True, text=True,
                        env=env, cwd=root, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split()[-1] == str(len(modules))


@pytest.mark.parametrize("module", RAISING_MODULES)
def test_script_modules_raise_import_error_naming_the_dependency(module):
  sys.modules.pop(f"{lo_surface.NEW_PREFIX}.{module}", None)
  with pytest.raises(ImportError, match=r"learned_optimization\.\S+ needs"):
    importlib.import_module(f"{lo_surface.NEW_PREFIX}.{module}")


# ------------------------------------------------------------------------------------------------- the tool itself

_SOURCE = '''
import jax
from typing import Any
from learned_optimization.tasks.base import Batch, _Private
from learned_optimization import summary
Params = Any
_hidden = 1

def f(a, b=1, *args, c, d=2, **kw):
  pass

def _g(x):
  pass

class C:
  def __init__(self, x, y=None):
    pass

@flax.struct.dataclass
class S:
  p: int
  q: int = 0

class N(typing.NamedTuple):
  z: Any

class Inherits(C):
  pass

if True:
  def conditional(k):
    pass
'''


def test_module_surface_reads_names_kinds_and_defaults(tmp_path):
  for rel in ("learned_optimization/__init__.py", "learned_optimization/summary.py",
              "learned_optimization/tasks/base.py"):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text("")
  names = lo_surface.module_surface(str(tmp_path), "m", _SOURCE)
  assert set(names) == {"Batch", "_Private", "Params", "_hidden", "f", "_g", "C", "S", "N", "Inherits",
                        "conditional"}
  assert all(names[n].get("private") is (True if n.startswith("_") else None) for n in names)
  assert names["Batch"]["type"] == "reexport" and names["Params"]["type"] == "value"
  assert [(p["name"], p["kind"], p["default"]) for p in names["f"]["signature"]] == [
      ("a", "POSITIONAL_OR_KEYWORD", False), ("b", "POSITIONAL_OR_KEYWORD", True), ("args", "VAR_POSITIONAL", False),
      ("c", "KEYWORD_ONLY", False), ("d", "KEYWORD_ONLY", True), ("kw", "VAR_KEYWORD", False)]
  assert [(p["name"], p["default"]) for p in names["C"]["signature"]] == [("x", False), ("y", True)]
  assert [(p["name"], p["default"]) for p in names["S"]["signature"]] == [("p", False), ("q", True)]
  assert [p["name"] for p in names["N"]["signature"]] == ["z"]
  assert names["Inherits"]["signature"] is None


def test_signature_problems_accepts_compatible_and_names_each_incompatibility():
  reference = lo_surface.module_surface("/nonexistent", "m", _SOURCE)["f"]["signature"]

  def same(a, b=1, *args, c, d=2, **kw):
    del a, b, args, c, d, kw

  def extra_defaulted(a, b=1, *args, c, d=2, e=3, **kw):
    del a, b, args, c, d, e, kw

  assert lo_surface.signature_problems(reference, same) == []
  assert lo_surface.signature_problems(reference, extra_defaulted) == []

  def swapped(b, a=1, *args, c, d, **kw):
    del a, b, args, c, d, kw

  problems = " ".join(lo_surface.signature_problems(reference, swapped))
  assert "'a' at position 1" in problems and "'d' has no default" in problems

  def missing(a, *, c, z, **kw):
    del a, c, z, kw

  problems = " ".join(lo_surface.signature_problems(reference, missing))
  assert "missing parameter 'b'" in problems and "no *args" in problems and "extra required parameter 'z'" in problems
