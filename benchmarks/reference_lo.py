"""The reference library (google/learned_optimization, "LO") timed in the same process as metafam.

Nothing of LO is vendored. Point the benchmarks at its unpacked source distribution (its last PyPI release):

    pip download --no-deps --no-binary :all: learned_optimization==0.0.1 -d /tmp/lo
    tar xzf /tmp/lo/learned_optimization-0.0.1.tar.gz -C /tmp/lo
    pip install gin-config
    python benchmarks/inner_training.py --reference_src /tmp/lo/learned_optimization-0.0.1

LO's 2021-era imports are satisfied inside this process only: TensorFlow and TFDS (imported for summary writing and
dataset loading, neither used here), flax (the `flax.struct` dataclass decorator of its states; its checkpointing
modules are imported but never called; the real flax is used when installed, with stubs for its modules that do
not import here, e.g. `flax.metrics.tensorboard` without the real TensorFlow) and the `jax.tree_*`,
`jax.ShapedArray` and `jax.lib.xla_client` names that JAX has since removed. Its own code runs unchanged:
`outer_trainers.common.truncated_unroll` (a jitted scan over ``vmap(lax.cond(is_done, reset, train))``), its
per-parameter `MLPLOpt` ("LOLv2") and `Adam`, and `TruncatedPES`. The task is written against LO's `Task` /
`TaskFamily` API with the same model, loss, per-instance init scale and data as metafam's image-MLP family, and its
batches come from the same embedded Fashion-MNIST iterator, assembled on the host the way LO's
`training.get_batches` does (one ``next()`` per lane per step, stacked).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np

_REMOVED_JAX_NAMES = {"tree_map": jax.tree.map, "tree_multimap": jax.tree.map, "tree_leaves": jax.tree.leaves,
                        "tree_flatten": jax.tree.flatten, "tree_unflatten": jax.tree.unflatten,
                        "tree_structure": jax.tree.structure, "ShapedArray": jax.ShapeDtypeStruct}


def _module(name, **attrs):
  mod = types.ModuleType(name)
  mod.__dict__.update(attrs)
  sys.modules[name] = mod
  return mod


def _stub_module(name):
  """A module whose every attribute is a function that fails when called."""
  mod = _module(name)
  mod.__getattr__ = lambda attr: _unused(f"{name}.{attr}")
  return mod


def _missing(name):
  """Whether ``name`` fails to import (not installed, or broken against today's packages)."""
  try:
    importlib.import_module(name)
    return False
  except Exception:  # pylint: disable=broad-except
    return True


def _unused(what):
  def fail(*args, **kwargs):
    raise NotImplementedError(f"{what} is stubbed out for benchmarking and must not be called.")
  return fail


def _flax_dataclass(cls):
  cls = dataclasses.dataclass(frozen=True)(cls)
  fields = dataclasses.fields(cls)
  jax.tree_util.register_dataclass(
      cls, data_fields=[f.name for f in fields if f.metadata.get("pytree_node", True)],
      meta_fields=[f.name for f in fields if not f.metadata.get("pytree_node", True)])
  cls.replace = lambda self, **changes: dataclasses.replace(self, **changes)
  return cls


def _install_shims():
  for name, fn in _REMOVED_JAX_NAMES.items():
    if name not in jax.__dict__:
      setattr(jax, name, fn)
  if not hasattr(jax.lib, "xla_client"):  # only read in a type annotation of LO's gradient_learner
    jax.lib.xla_client = types.SimpleNamespace(Device=jax.Device)
  tf_stubbed = _missing("tensorflow")
  if tf_stubbed:
    v2 = _module("tensorflow.compat.v2", enable_v2_behavior=lambda: None)
    _module("tensorflow", compat=_module("tensorflow.compat", v2=v2))
  if _missing("tensorflow_datasets"):
    _module("tensorflow_datasets", load=_unused("tensorflow_datasets.load"))
  # flax's modules that LO imports besides `flax.struct`: checkpointing, serialization, replication and summary
  # writing, never called by these benchmarks.
  unused = ("jax_utils", "serialization", "training.checkpoints", "training.prefetch_iterator", "metrics.tensorboard")
  if not _missing("flax"):
    # The real flax, with stubs for what of it does not import here. Its `flax.metrics.tensorboard` (LO's summary
    # module reads its `SummaryWriter` name) imports TensorFlow and tensorboard, whose hparams plugin calls
    # `tf.make_tensor_proto` at import time: with the TensorFlow stand-in above it is a stub without being tried.
    for name in unused:
      if (name == "metrics.tensorboard" and tf_stubbed) or _missing(f"flax.{name}"):
        package, _, attr = f"flax.{name}".rpartition(".")
        setattr(importlib.import_module(package), attr, _stub_module(f"flax.{name}"))
    return
  field = lambda pytree_node=True, **kw: dataclasses.field(metadata={"pytree_node": pytree_node}, **kw)  # noqa: E731
  struct = _module("flax.struct", dataclass=_flax_dataclass, field=field)
  # (registering a serialization handler at import time is a no-op)
  stubs = {name: _stub_module(f"flax.{name}") for name in unused}
  stubs["serialization"].register_serialization_state = lambda *args, **kwargs: None
  training = _module("flax.training", checkpoints=stubs["training.checkpoints"],
                     prefetch_iterator=stubs["training.prefetch_iterator"])
  _module("flax", struct=struct, jax_utils=stubs["jax_utils"], serialization=stubs["serialization"],
          training=training, metrics=_module("flax.metrics", tensorboard=stubs["metrics.tensorboard"]))


def load(src: str) -> types.SimpleNamespace:
  """Imports LO from the unpacked source directory ``src``; clear errors for a wrong path or missing gin-config."""
  if not os.path.isfile(os.path.join(src, "learned_optimization", "__init__.py")):
    raise SystemExit(f"--reference_src {src!r}: expected the unpacked learned_optimization source distribution (a "
                     f"directory holding learned_optimization/__init__.py); see benchmarks/reference_lo.py.")
  if _missing("gin"):
    raise SystemExit("--reference_src needs gin-config, which learned_optimization imports: pip install gin-config")
  _install_shims()
  sys.path.insert(0, os.path.abspath(src))
  import absl.logging
  verbosity = absl.logging.get_verbosity()
  absl.logging.set_verbosity(absl.logging.FATAL)  # its summary module logs an error when oryx is absent
  try:
    mods = {name: importlib.import_module(f"learned_optimization.{path}") for name, path in [
        ("common", "outer_trainers.common"), ("schedules", "outer_trainers.truncation_schedule"),
        ("pes", "outer_trainers.truncated_pes"), ("full_es", "outer_trainers.full_es"),
        ("learner", "outer_trainers.gradient_learner"),
        ("mlp_lopt", "learned_optimizers.mlp_lopt"), ("lopt_base", "learned_optimizers.base"),
        ("opt_base", "optimizers.base"), ("tasks", "tasks.base")]}
  finally:
    absl.logging.set_verbosity(verbosity)
  return types.SimpleNamespace(**mods)


def image_mlp_family(lo, family):
  """metafam's `ImageMLPFamily` (one hidden layer, ReLU, no label noise) written against LO's Task API."""
  import haiku as hk

  if family.activations != ("relu",) or family.label_noise_range != (0.0, 0.0):
    raise ValueError("the LO twin covers the benchmark's family only: activations=('relu',), no label noise.")
  net = hk.without_apply_rng(hk.transform(lambda x: hk.nets.MLP([*family.hidden_sizes, family.num_classes])(
      hk.Flatten()(x))))
  image = family.datasets.abstract_batch["image"]
  low, high = np.log(family.init_scale_range[0]), np.log(family.init_scale_range[1])

  class Task(lo.tasks.Task):
    def __init__(self, init_scale):
      self.init_scale = init_scale

    def init(self, key):
      params = net.init(key, jnp.zeros((1,) + image.shape[1:], image.dtype))
      return {mod: {k: v * self.init_scale if k == "w" else v for k, v in p.items()} for mod, p in params.items()}

    def loss(self, params, key, data):
      logits = net.apply(params, data["image"])
      labels = jax.nn.one_hot(data["label"], family.num_classes)
      return jnp.mean(lo.tasks.softmax_cross_entropy(logits=logits, labels=labels))

    def normalizer(self, loss):
      return loss / jnp.log(family.num_classes)

  class Splits:  # LO's Datasets: ``split(name)`` gives the iterator (training.vec_get_batch)
    def split(self, name):
      return getattr(family.datasets, name)

  class Family(lo.tasks.TaskFamily):
    datasets = Splits()

    def sample(self, key):
      return jnp.exp(jax.random.uniform(key, (), minval=low, maxval=high))

    def task_fn(self, cfg):
      return Task(cfg)

  return Family()


def learned_optimizer(lo, name):
  """LO's MLPLOpt (summaries off), or its Adam(3e-3) wrapped as a LearnedOptimizer with empty theta."""
  if name == "mlp_lopt":
    return lo.mlp_lopt.MLPLOpt(compute_summary=False)

  class FixedAdam(lo.lopt_base.LearnedOptimizer):
    def init(self, key):
      return {}

    def opt_fn(self, theta, is_training=False):
      return lo.opt_base.Adam(3e-3)

  return FixedAdam()


def host_batches(family, lanes, steps):
  """``[steps, lanes, ...]`` host batches, one ``next()`` per lane per step (LO's training.get_batches)."""
  it = family.datasets.train
  per_step = [jax.tree.map(lambda *xs: np.stack(xs), *[next(it) for _ in range(lanes)]) for _ in range(steps)]
  return jax.tree.map(lambda *xs: np.stack(xs), *per_step)


def setup_inner(lo, family, opt_name, lanes, unroll):
  """Blocking calls running one ``unroll``-step `truncated_unroll` of LO: ``(with host data, with fixed on-device
  data)``. The first is LO as used (batches assembled per call); the second times its jitted engine alone."""
  lo_family, lopt = image_mlp_family(lo, family), learned_optimizer(lo, opt_name)
  theta = lopt.init(jax.random.key(0))
  schedule = lo.schedules.ConstantTruncationSchedule(unroll)
  keys = jax.random.split(jax.random.key(1), lanes)
  box = {"state": lo.common.init_truncation_state(lo_family, lopt, schedule, theta, None, keys)}
  fixed = jax.device_put(host_batches(family, lanes, unroll))

  def make(get_data):
    def run():
      (box["state"], ys), _ = lo.common.truncated_unroll(
          lo_family, lopt, schedule, lanes, unroll, False, False, False, theta, jax.random.key(2), box["state"],
          get_data(), None)
      ys.loss.block_until_ready()
    return run

  return make(lambda: host_batches(family, lanes, unroll)), make(lambda: fixed)


def setup_pes(lo, family, num_tasks, unroll_length, trajectory_length, sigma, train_and_meta=False):
  """A blocking call computing one LO `TruncatedPES` gradient estimate with its MLPLOpt (antithetic pairs run as
  two unrolls, its default); the state carries over between calls. The meta-loss is LO's default, the normalized
  train-batch loss before each update, or with ``train_and_meta`` the normalized loss of the updated params on an
  ``outer_valid`` batch."""
  lo_family, lopt = image_mlp_family(lo, family), learned_optimizer(lo, "mlp_lopt")
  schedule = lo.schedules.ConstantTruncationSchedule(trajectory_length)
  est = lo.pes.TruncatedPES(lo_family, lopt, schedule, num_tasks=num_tasks, trunc_length=unroll_length,
                            steps_per_jit=unroll_length, std=sigma,
                            random_initial_iteration_offset=trajectory_length, train_and_meta=train_and_meta)
  weights = lo.learner.WorkerWeights(theta=lopt.init(jax.random.key(0)), theta_model_state=None, outer_state=None)
  box = {"state": est.init_worker_state(weights, jax.random.key(1)), "key": jax.random.key(2)}

  def run():
    box["key"], key = jax.random.split(box["key"])
    out, _ = est.compute_gradient_estimate(weights, key, box["state"], with_summary=False)
    box["state"] = out.unroll_state
    jax.block_until_ready(out.grad)
  return run


def setup_full_es(lo, family, num_tasks, trajectory_length, sigma, train_and_meta=False, steps_per_jit=10):
  """A blocking call computing one LO `FullES` gradient estimate (its MLPLOpt, ``num_tasks`` antithetic pairs of
  complete ``trajectory_length``-step trajectories from fresh instances, meta-loss averaged over the trajectory:
  ``loss_type="avg"``), its data assembled on the host per ``steps_per_jit`` steps as LO does."""
  lo_family, lopt = image_mlp_family(lo, family), learned_optimizer(lo, "mlp_lopt")
  est = lo.full_es.FullES(lo_family, lopt, num_tasks=num_tasks, unroll_length=trajectory_length, std=sigma,
                          steps_per_jit=steps_per_jit, train_and_meta=train_and_meta, loss_type="avg")
  weights = lo.learner.WorkerWeights(theta=lopt.init(jax.random.key(0)), theta_model_state=None, outer_state=None)
  box = {"state": est.init_worker_state(weights, jax.random.key(1)), "key": jax.random.key(2)}

  def run():
    box["key"], key = jax.random.split(box["key"])
    out, _ = est.compute_gradient_estimate(weights, key, box["state"], with_summary=False)
    jax.block_until_ready(out.grad)
  return run
