"""One conformance table over every registry of the package: each row is a registry (a module-level table from name
to constructor or spec), the table that holds it and the contract every entry must meet; one test runs every entry
of every row through its row's check, so a new entry is covered by registering it.

* `TABLE` lists the rows; `test_every_entry_meets_its_contract` runs ``check(name, entry)`` for each entry of each.
* `test_every_registry_of_the_package_is_in_the_table`: every module-level mapping named in capitals that a module of
  ``metafam/`` defines is a row, or is listed in `NOT_REGISTRIES` with the reason (a view of a row, a file format's
  private table, the command line's spec), so a new registry cannot be left out.
* `test_a_broken_entry_fails_its_contract`: each row's check rejects an entry that breaks its contract (`BROKEN`,
  put into the registry itself), so a check cannot pass everything.
* `test_an_unknown_name_raises_the_shared_error`: each registry's lookup function names the valid names in the shared
  `UnknownNameError`.

The checks are cheap (construction, the documented protocol on tiny inputs, one invariant or known answer); deeper
per-registry behaviour lives with its package: the learned-optimizer zoo's meta-gradients, bf16 states, vmapped lanes
and estimators in tests/optimizers/test_lopt_zoo.py, every task's compiled numerics in tests/tasks/test_task_suite.py,
the shipped baselines' data in tests/benchmark/test_heldout.py and test_test_suite.py.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import json
import os
import re
import sys
import tempfile
import types
from collections.abc import Mapping
from typing import Any, Callable, FrozenSet, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lopt_goldens as G
import metafam
import metafam.pretrained as pretrained
from metafam._registry import UnknownNameError
from metafam.benchmark import baseline_files, baselines, suites
from metafam.evaluation.scores import REFERENCE
from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.optimizers import contract, num_meta_params
from metafam.optimizers import optax_zoo
from metafam.optimizers import registry as optimizers
from metafam.optimizers.base import Adam, OptaxOptimizer, Optimizer, OptimizerState
from metafam.optimizers.learned import LearnableAdam, LearnableSGD, LearnedOptimizer
from metafam.outer_trainers import GradientEstimator, MetaTrainer, make_estimator
from metafam.outer_trainers import registry as estimators
from metafam.outer_trainers.registry import estimator_arguments
from metafam.runs import checkpoint, recipes, train
from metafam.runs.recipes import Recipe, load_recipe
from metafam.taskfamilies import registry as families
from metafam.taskfamilies.base import TaskFamily, check_family
from metafam.taskfamilies.quadratic import NoisyQuadraticFamily, QuadraticFamily
from metafam.taskfamilies.registry import LazyConstructor
from metafam.taskfamilies.spec import FamilySpec
from metafam.tasks import _nn, autoencoder, conv, language
from metafam.tasks import registry as tasks
from metafam.tasks._nn import num_params
from metafam.tasks.base import Task
from metafam.tasks.quadratic import QuadraticTask


# -- tasks (metafam.tasks.registry.TASKS) ---------------------------------------------------------------------------
LEARNING_RATE = 1e-3
# "name": constructor(...),  # ... 12,345 params ...   (the registry's documented counts, tasks and families)
DOCUMENTED = {name: int(count.replace(",", "")) for name, count in
              re.findall(r'^\s*"(\w+)":[^#\n]*#.*?([\d,]+) params',
                         inspect.getsource(tasks) + inspect.getsource(families), re.M)}


def without_data(task):
  """``task`` with its datasets replaced by a stand-in that has only ``abstract_batch`` and ``extra_info``."""
  if task.datasets is not None:
    task.datasets = types.SimpleNamespace(abstract_batch=task.datasets.abstract_batch,
                                          extra_info=task.datasets.extra_info)
  return task


def task_program(task, opt):
  """``run(keys, batch)``: for each key (vmapped) init from the abstract batch, loss/aux, grad and one step of
  ``opt``, plus the loss after the step and with another loss key."""

  def one(key, batch):
    k_init, k_loss = jax.random.split(key)
    params = task.init(k_init)
    (loss, aux), grad = jax.value_and_grad(task.loss_and_aux, has_aux=True)(params, k_loss, batch)
    new_params = opt.get_params(opt.update(opt.init(params), grad, loss=loss))
    step = jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), new_params, params)
    return {"loss": loss, "aux": aux, "normalized": task.normalizer(loss), "params": params, "grad": grad,
            "loss_after": task.loss(new_params, k_loss, batch),
            "loss_other_key": task.loss(params, jax.random.fold_in(k_loss, 1), batch),
            "max_step": jnp.max(jnp.stack(jax.tree.leaves(step)))}

  return lambda keys, batch: jax.vmap(one, in_axes=(0, None))(keys, batch)


def check_task(name, build):
  """A `Task` named ``name`` with its documented parameter count (the registry's comment; our modules' docstrings
  too), whose whole vmapped init/loss/grad/Adam program traces on abstract inputs (no compile) to float32 scalars
  per instance and a gradient shaped like the params. Its numbers, compiled: tests/tasks/test_task_suite.py."""
  task = without_data(build())
  assert isinstance(task, Task), name
  assert task.name == name or isinstance(task, QuadraticTask)  # quadratic_10 keeps its historical name
  count = num_params(jax.eval_shape(task.init, jax.random.key(0)))
  assert name in DOCUMENTED, f"{name}: document its parameter count in the registry ('# 12,345 params')"
  assert count == DOCUMENTED[name], (name, count, DOCUMENTED[name])
  module = inspect.getmodule(type(task))
  if module in (conv, autoencoder, language):  # our modules also list the count in their docstring
    assert f"``{name}``" in module.__doc__ and f"{count:,} params" in module.__doc__
  batch = None if task.datasets is None else task.datasets.abstract_batch
  out = jax.eval_shape(task_program(task, Adam(LEARNING_RATE)), jax.random.split(jax.random.key(0), 2), batch)
  for leaf in ("loss", "normalized", "loss_after", "loss_other_key", "max_step"):
    assert out[leaf].shape == (2,) and out[leaf].dtype == jnp.float32
  assert jax.tree.structure(out["grad"]) == jax.tree.structure(out["params"])
  assert num_params(out["grad"]) == 2 * count


# -- the suites' tasks (HELDOUT_SUITE, TEST_SUITE) and the suites (metafam.benchmark.suites.SUITES) -----------------
def check_suite_task(suite, name, entry):
  """A `SuiteTask` of suite ``suite``: its constructor is the registered task's (`TASKS`, where the tasks row checks
  it) and its horizon a positive multiple of the evaluations per run, the suite's horizon of that task."""
  assert isinstance(entry, tasks.SuiteTask), name
  assert tasks.TASKS[name] is entry.build, f"{name}: the suite's constructor is not the registered task's"
  assert isinstance(entry.horizon, int) and entry.horizon > 0 and entry.horizon % baselines.EVALS_PER_RUN == 0, (
      name, entry.horizon)
  horizons = {"heldout": suites.HORIZONS, "test": suites.TEST_HORIZONS}[suite]
  assert horizons[name] == entry.horizon and name in suites.SUITES[suite]
  needs = tasks.needs_user_data(name)
  assert needs is None or (len(needs) == 2 and all(isinstance(s, str) and s for s in needs)), needs


def check_suite(name, task_names):
  """A non-empty list of distinct registered task names; `get_suite` returns it as a new list."""
  assert isinstance(task_names, list) and task_names, name
  assert len(set(task_names)) == len(task_names), f"{name}: tasks listed twice"
  assert not set(task_names) - set(tasks.TASKS), sorted(set(task_names) - set(tasks.TASKS))
  got = suites.get_suite(name)
  assert got == task_names and got is not task_names


def check_suite_spec(name, spec):
  """A suite with shipped baselines: a registered suite whose horizons are the suite's tasks, baselines that are
  tuned baselines (`OPTAX_FACTORIES`' entries, each with a rate grid) led by the reference, and a shipped data file
  of that suite."""
  assert isinstance(spec, baseline_files.SuiteSpec) and spec.name == name
  assert list(spec.horizons) == suites.SUITES[name]
  assert spec.optimizers[0] == REFERENCE, f"{name}: the reference ({REFERENCE}) leads, got {spec.optimizers}"
  assert len(set(spec.all_optimizers)) == len(spec.all_optimizers), spec.all_optimizers
  assert all(o in optax_zoo.OPTAX_FACTORIES and o in baselines.GRIDS for o in spec.all_optimizers), spec.all_optimizers
  assert spec.command and os.path.isfile(spec.data_file), spec.data_file
  with open(spec.data_file, encoding="utf-8") as f:
    data = json.load(f)
  assert data["suite"] == name and set(data["tasks"]) | set(data["pending"]) == set(spec.horizons)


# -- optimizers (metafam.optimizers.registry, metafam.optimizers.optax_zoo) ------------------------------------------
# Counts the older docstrings state as a list of theta's scalars rather than as a number.
LISTED_COUNTS = {"learnable_sgd": 1, "learnable_adam": 4}
COUNT_PATTERNS = (r"Meta-parameters \(default config\): ([\d,]+)", r"\(([\d,]+) scalars\)")


def _documented_count(name, lopt):
  docs = (type(lopt).__doc__ or "") + (sys.modules[type(lopt).__module__].__doc__ or "")
  # A registry entry that configures a class (e.g. a functools.partial) states its own count as "(``name``): N".
  patterns = (r"\(``%s``\): ([\d,]+)" % re.escape(name),) + COUNT_PATTERNS
  found = [m.group(1) for p in patterns for m in [re.search(p, docs)] if m]
  assert found or name in LISTED_COUNTS, f"{name}: document 'Meta-parameters (default config): N' in its docstring"
  return int(found[0].replace(",", "")) if found else LISTED_COUNTS[name]


def check_learned_optimizer(name, make):
  """The learned-optimizer contract (`metafam.optimizers.contract`, docs/guide/optimizers.md):

  * a fresh `LearnedOptimizer` whose theta is a tree of float32 arrays of the size its docstring states;
  * its two faces, ``opt_fn(theta)`` (a `ThetaOptimizer`) and ``as_optax(theta)``, agree bit for bit over two eager
    updates of the goldens' params (tests/lopt_goldens.py: a scalar, a vector, a matrix, 3-D and 4-D leaves), with
    int32 step counts and updates, states and params of unchanged shapes and dtypes;
  * ``as_optax`` jits and vmaps over theta (two thetas in one program give each theta's updates);
  * ten steps of ``opt_fn(theta)`` reduce a quadratic's loss.
  """
  lopt = make()
  assert isinstance(lopt, LearnedOptimizer), name
  theta = lopt.init(jax.random.key(0))
  assert jax.tree.leaves(theta) and all(isinstance(x, jax.Array) and x.dtype == jnp.float32
                                        for x in jax.tree.leaves(theta))
  assert num_meta_params(theta) == _documented_count(name, lopt), name

  params, grads = jax.tree.map(jnp.asarray, G.PARAMS), jax.tree.map(jnp.asarray, G.grads(0))
  opt = lopt.opt_fn(theta)
  assert isinstance(opt, contract.ThetaOptimizer)
  tx = lopt.as_optax(theta, num_steps=G.HORIZON)
  state, ostate = opt.init(params, num_steps=G.HORIZON), tx.init(params)
  assert isinstance(state, OptimizerState) and isinstance(ostate, contract.LearnedOptState)
  assert state.iteration.dtype == jnp.int32 and ostate.count.dtype == jnp.int32
  p = params
  for step in range(2):  # eager: no fusion, so p - step and p + (-step) round alike
    g = jax.tree.map(jnp.asarray, G.grads(step))
    new = opt.update(state, g, loss=G.loss(step))
    updates, new_ostate = tx.update(g, ostate, p, loss=G.loss(step))
    jax.tree.map(lambda a, b: (a.shape, a.dtype) == (b.shape, b.dtype) or pytest.fail(name), updates, p)
    jax.tree.map(lambda a, b: (a.shape, a.dtype) == (b.shape, b.dtype) or pytest.fail(name), new, state)
    p = optax.apply_updates(p, updates)
    jax.tree.map(np.testing.assert_array_equal, opt.get_params(new), p)
    jax.tree.map(np.testing.assert_array_equal, new_ostate.accumulators, new.opt_state["accumulators"]
                 if opt.packed else new.opt_state)
    assert int(new.iteration) == int(new_ostate.count) == step + 1
    state, ostate = new, new_ostate

  thetas = jax.tree.map(lambda *xs: jnp.stack(xs), theta, lopt.init(jax.random.key(1)))

  def one(th):
    tx = lopt.as_optax(th, num_steps=G.HORIZON)
    return tx.update(grads, tx.init(params), params, loss=jnp.float32(1.0))

  batched, _ = jax.jit(jax.vmap(one))(thetas)
  single, _ = jax.jit(one)(theta)
  jax.tree.map(lambda b, s: np.testing.assert_allclose(b[0], s, rtol=1e-4, atol=1e-6), batched, single)
  jax.tree.map(lambda b, p: b.shape == (2,) + p.shape or pytest.fail(name), batched, params)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(batched))

  task = QuadraticTask(dim=8, scale=2.0)

  @jax.jit
  def ten_steps(x0):
    def step(state, _):
      loss, grad = jax.value_and_grad(task.loss)(opt.get_params(state), None, None)
      return opt.update(state, grad, loss=loss), loss
    state, losses = jax.lax.scan(step, opt.init(x0), None, length=10)
    return losses, task.loss(opt.get_params(state), None, None)

  losses, final = ten_steps(jnp.asarray(np.random.default_rng(1).standard_normal(8), jnp.float32))
  assert np.all(np.isfinite(np.asarray(losses))) and np.isfinite(float(final))
  assert float(final) < float(losses[0])  # the small-step ones (steps ~1e-3 per element) only need to decrease it


HAND_RATE = 1e-2  # small enough that every optimizer's first steps descend the quadratic below
# Updates are compared to float32 rounding and eps-sized terms at this size; a wrong rate is off by a factor.


def _quadratic_params():
  rng = np.random.default_rng(0)
  return {"w": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32), "b": jnp.asarray(rng.standard_normal(3),
                                                                                         jnp.float32)}


def _half_square(params):
  return 0.5 * sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(params))


def _layout(tree):
  return jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), tree)


def check_hand_optimizer(name, build):
  """``build(learning_rate)`` is a named `Optimizer` whose jitted updates keep its state's layout and descend a
  quadratic over 5 steps; an entry named like an optax factory (`OPTAX_FACTORIES`) is that factory step for step (to
  rounding). Metafam's own Adam, SGD and SGDM against hand computations: tests/optimizers/test_optimizers.py."""
  opt = build(HAND_RATE)
  assert isinstance(opt, Optimizer) and isinstance(opt.name, str) and opt.name, name
  params = _quadratic_params()

  @jax.jit
  def five_steps(params):
    state = opt.init(params)
    for _ in range(5):
      loss, grad = jax.value_and_grad(_half_square)(opt.get_params(state))
      state = opt.update(state, grad, loss=loss)
    return state

  state = five_steps(params)
  assert _layout(state) == _layout(opt.init(params))
  final = float(_half_square(opt.get_params(state)))
  assert np.isfinite(final) and final < float(_half_square(params)), (name, final)
  if name in optax_zoo.OPTAX_FACTORIES:
    tx, p = optax_zoo.OPTAX_FACTORIES[name](HAND_RATE), params
    s = tx.init(p)
    for _ in range(5):
      updates, s = tx.update(jax.grad(_half_square)(p), s, p)
      p = optax.apply_updates(p, updates)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), opt.get_params(state), p)


def _first_update(tx, params):
  return tx.update(jax.grad(_half_square)(params), tx.init(params), params)[0]


def check_optax_factory(name, factory):
  """``factory(learning_rate)`` is an optax transformation: a number and a constant schedule give the same first
  update, that update is linear in the rate (every other hyper-parameter fixed), and 5 steps descend a quadratic.
  As a tuned baseline, ``optax.inject_hyperparams`` sweeps it by ``learning_rate`` (the tuning sweep's lanes) and it
  has a rate grid (`GRIDS`)."""
  params = _quadratic_params()
  tx = factory(HAND_RATE)
  assert isinstance(tx, optax.GradientTransformation), name
  first = _first_update(tx, params)
  assert all(bool(jnp.all(jnp.isfinite(u))) for u in jax.tree.leaves(first)) and _layout(first) == _layout(params)
  by_schedule = _first_update(factory(optax.constant_schedule(HAND_RATE)), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * HAND_RATE), by_schedule, first)
  doubled = _first_update(factory(2 * HAND_RATE), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, 2 * b, rtol=1e-4, atol=1e-6 * HAND_RATE), doubled, first)
  p, state = params, tx.init(params)
  for _ in range(5):
    updates, state = tx.update(jax.grad(_half_square)(p), state, p)
    p = optax.apply_updates(p, updates)
  assert float(_half_square(p)) < float(_half_square(params)), name
  assert baselines.GRIDS.get(name, 0) > 0, f"{name}: no rate grid in metafam.benchmark.baselines.GRIDS"
  injected = _first_update(optax.inject_hyperparams(factory)(learning_rate=HAND_RATE), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4 * HAND_RATE), injected,
               _first_update(factory(HAND_RATE), params))


# -- estimators (metafam.outer_trainers.registry.ESTIMATORS) --------------------------------------------------------
ESTIMATOR_FAMILY = QuadraticFamily(4, scale_range=(0.5, 2.0))
ESTIMATOR_SIZES = dict(unroll_length=3, trajectory_length=5)


def estimator_kwargs(name):
  return {k: v for k, v in ESTIMATOR_SIZES.items() if k in estimator_arguments(name)}


def meta_trainer(estimator, lopt):
  return MetaTrainer(lopt, [estimator], optax.adam(0.05), clip_grad_norm=1.0)


def check_meta_trains_checkpoints_and_resumes(build, lopt, directory):
  """``build()``'s estimator meta-trains ``lopt`` through `MetaTrainer` for 4 meta-steps with finite metrics and moves
  theta, and a run checkpointed at step 2 in ``directory`` and resumed ends bit-identical to the uninterrupted one."""
  full, _ = train(meta_trainer(build(), lopt), 4, key=jax.random.key(1), progress=False)
  train(meta_trainer(build(), lopt), 2, key=jax.random.key(1), output_dir=directory, progress=False)
  resumed, history = train(meta_trainer(build(), lopt), 4, key=jax.random.key(1), output_dir=directory,
                           progress=False)
  assert [r["step"] for r in history] == [3, 4]
  assert all(np.isfinite(r["meta_loss"]) and np.isfinite(r["grad_norm"]) for r in history)
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  initial = lopt.init(jax.random.key(1))
  assert any(not np.array_equal(np.asarray(a), np.asarray(b))  # something was learned: theta moved
             for a, b in zip(jax.tree.leaves(full.theta), jax.tree.leaves(initial)))


def check_estimator(name, cls):
  """A `GradientEstimator` class built on a step the caller constructs (the injected-step API) that estimates bit for
  bit what `make_estimator`'s does, and that meta-trains, checkpoints and resumes bit-identically (the protocol a
  user's estimator meets too: tests/outer_trainers/test_estimator_conformance.py)."""
  assert inspect.isclass(cls) and issubclass(cls, GradientEstimator), name
  assert estimators.get_estimator(name) is cls
  lopt = LearnableSGD(0.01)
  theta = lopt.init(None)
  step = TruncatedStep(ESTIMATOR_FAMILY, lopt, 2, ConstantSchedule(4), random_initial_iteration=True,
                       meta_loss_split="outer_valid")
  results = []
  for est in (cls(step, **estimator_kwargs(name)),
              make_estimator(name, ESTIMATOR_FAMILY, lopt, num_tasks=2, schedule=ConstantSchedule(4),
                             **estimator_kwargs(name))):
    ws = est.init_worker_state(theta, jax.random.key(2))
    results.append(est.estimate(theta, ws, jax.random.key(3)))
  for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with tempfile.TemporaryDirectory() as directory:
    check_meta_trains_checkpoints_and_resumes(
        lambda: make_estimator(name, ESTIMATOR_FAMILY, lopt, num_tasks=2, schedule=ConstantSchedule(4),
                               **estimator_kwargs(name)), lopt, directory)


# -- families, family kinds and augmentations (metafam.taskfamilies.registry) --------------------------------------
def check_registered_family(name, make):
  """``make()`` is a `TaskFamily` that `check_family` vmaps: configs and initial params of the same shapes and dtypes
  for every key, and finite losses and gradients from a jitted, vmapped sample/init/value_and_grad."""
  family = make()
  assert isinstance(family, TaskFamily), name
  check_family(family, jax.random.key(3))


# Arguments of each family kind for the kind's check: a new kind needs an entry here.
KIND_EXAMPLES = {
    "quadratic": {"dim": 3, "scale_range": (0.5, 2.0)},
    "noisy_quadratic": {"dim": 3, "batch_size": 4},
    "image_mlp": {"hidden_sizes": (8,), "image_size": 8},
    "conv": {"channels": (4, 8), "image_size": 16},
    "autoencoder": {"hidden_sizes": (8, 4, 8), "image_size": 8},
    "lstm_lm": {"hidden_size": 8, "embed_size": 4, "sequence_length": 8},
    "transformer_lm": {"model_size": 8, "num_heads": 2, "sequence_length": 8},
    "task": {"name": "quadratic_10"},
    "registered": {"name": "quadratic_family_10"},
}


def check_family_kind(kind, ctor):
  """`FamilySpec(kind, kwargs)` (`KIND_EXAMPLES`) round-trips through JSON and builds a `TaskFamily` whose vmapped
  sample/init/loss traces (no compile) to a float32 loss per instance; the same key samples the same config."""
  assert callable(ctor.load() if isinstance(ctor, LazyConstructor) else ctor), kind
  assert kind in KIND_EXAMPLES, f"{kind}: give the family kind example arguments in KIND_EXAMPLES"
  spec = FamilySpec(kind, KIND_EXAMPLES[kind])
  assert FamilySpec.from_json(spec.to_json()) == spec
  family = spec.build()
  assert isinstance(family, TaskFamily), (kind, type(family))
  batch = None if family.datasets is None else family.datasets.abstract_batch

  def one(key, batch):
    task = family.task_fn(family.sample(key))
    params, state = task.init_with_state(key)
    return task.loss_with_state(params, state, key, batch)[0]

  losses = jax.eval_shape(jax.vmap(one, in_axes=(0, None)), jax.random.split(jax.random.key(0), 2), batch)
  assert losses.shape == (2,) and losses.dtype == jnp.float32, (kind, losses)
  key = jax.random.key(4)
  jax.tree.map(np.testing.assert_array_equal, family.sample(key), family.sample(key))


def _augmentation_bases():
  return QuadraticFamily(4, scale_range=(0.5, 2.0)), NoisyQuadraticFamily(4, batch_size=8)


# Each augmentation's example: (base family: 0 a quadratic, 1 a noisy quadratic with batches; positional arguments;
# the config keys the wrapper adds beside "inner"). A new augmentation needs an entry here.
AUGMENTATION_EXAMPLES = {
    "reparam": (0, ((-1.0, 1.0),), {"log_scale"}),
    "loss_scale": (0, ((-2.0, 2.0),), {"log_loss_scale"}),
    "noisy_gradients": (0, ((0.0, 0.5),), {"noise_std"}),
    "clip_gradients": (0, ((0.1, 1.0),), {"max_norm"}),
    "reduced_batch_size": (1, (3,), set()),
    "low_precision": (1, ("bfloat16",), set()),
}


def _close(a, b, **kw):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), **kw),
               a, b)


def check_augmented_family(family, own):
  """An augmentation wrapper ``family`` of ``family.family``: its config nests the inner family's config (the same
  instance for the same key) beside its own keys ``own``, it keeps the inner datasets and extends the inner name,
  and it passes `check_family`."""
  assert isinstance(family, TaskFamily) and isinstance(getattr(family, "family", None), TaskFamily), family
  key = jax.random.key(5)
  cfg = family.sample(key)
  assert set(cfg) == {"inner"} | own, (sorted(cfg), own)
  _close(cfg["inner"], family.family.sample(key), rtol=0)  # paired with the unwrapped family's instance
  assert family.datasets is family.family.datasets and family.name.startswith(family.family.name + "_")
  check_family(family, jax.random.key(2), num_samples=2)


def check_augmentation(name, wrap):
  """``wrap(family, *args)`` (`AUGMENTATION_EXAMPLES`) meets the augmentation contract (`check_augmented_family`)."""
  assert name in AUGMENTATION_EXAMPLES, f"{name}: give the augmentation example arguments in AUGMENTATION_EXAMPLES"
  base, args, own = AUGMENTATION_EXAMPLES[name]
  check_augmented_family(wrap(_augmentation_bases()[base], *args), own)


# -- recipes (metafam.runs.recipes.RECIPES), pretrained optimizers (metafam.pretrained.PRETRAINED) ------------------
def check_recipe(name, filename):
  """A JSON file of ``metafam/runs/recipes/`` holding the recipe ``name`` (`load_recipe` by name reads it), whose
  optimizer and estimator are registered; it round-trips through JSON, and the identity a checkpoint records (no
  name, description or length; no rank for full noise) reads back as a recipe of the same identity, and a changed
  field does not."""
  path = os.path.join(os.path.dirname(os.path.abspath(recipes.__file__)), "recipes", filename)
  assert os.path.isfile(path), path
  recipe = load_recipe(name)
  assert recipe.name == name and load_recipe(path) == recipe, (name, recipe.name)
  assert recipe.optimizer in optimizers.LEARNED_OPTIMIZERS and recipe.estimator in estimators.ESTIMATORS
  assert Recipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
  for variant in (recipe, recipe.replace(perturbation="low_rank", perturbation_rank=3)):
    recorded = variant.identity(7)["recipe"]
    assert "name" not in recorded and "num_steps" not in recorded
    back = Recipe.from_identity(recorded, name)
    assert back.name == name and back.identity(7) == variant.identity(7)
  other = dict(recipe.identity(7)["recipe"], sigma=recipe.sigma * 2)
  assert Recipe.from_identity(other, name).identity(7) != recipe.identity(7)


def check_pretrained(name, entry):
  """The shipped weights load as the recipe that trained them built the optimizer, at its meta-training rate (the
  default), meta-trained (not the initial theta), finite float32; the file says where it comes from (licence,
  recipe field by field, optimizer, meta-steps) and the model card has every section."""
  assert isinstance(entry, pretrained.Pretrained) and pretrained.info(name) is entry
  lopt, theta = pretrained.load(name)
  # Built as its recipe built it, at the rate it was meta-trained at (the default).
  recipe = load_recipe(entry.recipe)
  built = recipe.build_learned_optimizer()
  assert recipe.optimizer == entry.optimizer and type(lopt) is type(built) and lopt.name == built.name
  assert lopt.step_mult == entry.default_learning_rate == recipe.step_mult, (name, lopt.step_mult, recipe.step_mult)
  for key, value in recipe.optimizer_kwargs.items():
    assert getattr(lopt, key) == value, key
  init = lopt.init(jax.random.key(0))
  assert jax.tree.structure(theta) == jax.tree.structure(init)
  assert all(np.all(np.isfinite(x)) and x.dtype == np.float32 for x in jax.tree.leaves(theta))
  # Meta-trained: not the initialization.
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(theta), jax.tree.leaves(init)))
  metadata = checkpoint.read_metadata(entry.weights_path)
  assert metadata["license"] == "Apache-2.0" and metadata["recipe"]["name"] == entry.recipe
  assert Recipe.from_identity(metadata["recipe"], "?").identity(0) == recipe.identity(0)  # its recipe, field by field
  assert metadata["optimizer"] == entry.optimizer and metadata["meta_steps"] > 0
  with open(entry.model_card_path, encoding="utf-8") as f:
    card = f.read()
  for section in ("Architecture", "Recipe", "Data", "Compute", "Held-out results", "Known failure cases",
                  "Licence"):
    assert f"## {section}" in card, section
  assert "Apache-2.0" in card


# -- activations (metafam.tasks._nn.ACTIVATIONS) --------------------------------------------------------------------
def check_activation(name, fn):
  """An elementwise function (each output from its own input only), dtype- and shape-preserving in float32 and
  bfloat16, with finite derivatives; `activation_by_name` returns it."""
  assert _nn.activation_by_name(name) is fn
  x = jnp.linspace(-3.0, 3.0, 7, dtype=jnp.float32)
  y = fn(x)
  assert y.shape == x.shape and y.dtype == x.dtype
  np.testing.assert_allclose(np.asarray(y), np.asarray([fn(v) for v in x]), rtol=1e-6, atol=1e-7)
  assert fn(x.astype(jnp.bfloat16)).dtype == jnp.bfloat16
  assert bool(jnp.all(jnp.isfinite(jax.vmap(jax.grad(fn))(x))))


# -- the table ------------------------------------------------------------------------------------------------------
class Row(NamedTuple):
  """A registry: its name (the module-level name), the table itself and the contract check ``check(name, entry)``;
  ``lookup(name)`` is how the package looks a name up (None: it has no lookup of its own), ``fixtures`` what the
  checks need, ``slow`` the entries whose check runs only with ``-m slow``."""
  name: str
  registry: Mapping
  check: Callable[[str, Any], None]
  lookup: Optional[Callable[[str], Any]] = None
  fixtures: Tuple[str, ...] = ()
  slow: FrozenSet[str] = frozenset()


TABLE = [
    Row("TASKS", tasks.TASKS, check_task, tasks.get_task, fixtures=("small_full_fashion_mnist",)),
    Row("HELDOUT_SUITE", tasks.HELDOUT_SUITE, functools.partial(check_suite_task, "heldout")),
    Row("TEST_SUITE", tasks.TEST_SUITE, functools.partial(check_suite_task, "test")),
    Row("SUITES", suites.SUITES, check_suite, suites.get_suite),
    Row("SUITE_SPECS", baseline_files.SUITE_SPECS, check_suite_spec, baseline_files.suite_spec),
    Row("LEARNED_OPTIMIZERS", optimizers.LEARNED_OPTIMIZERS, check_learned_optimizer,
        optimizers.get_learned_optimizer),
    Row("HAND_DESIGNED", optimizers.HAND_DESIGNED, check_hand_optimizer,
        lambda n: optimizers.get_hand_optimizer(n, 1e-3)),
    Row("OPTAX_FACTORIES", optax_zoo.OPTAX_FACTORIES, check_optax_factory,
        lambda n: baselines.tune_baseline(None, n, 8)),
    Row("ESTIMATORS", estimators.ESTIMATORS, check_estimator, estimators.get_estimator),
    Row("FAMILIES", families.FAMILIES, check_registered_family, families.get_family),
    Row("FAMILY_KINDS", families.FAMILY_KINDS, check_family_kind, lambda n: FamilySpec(n).build()),
    Row("AUGMENTATIONS", families.AUGMENTATIONS, check_augmentation,
        lambda n: FamilySpec("quadratic", {"dim": 2}).augment(n).build()),
    Row("RECIPES", recipes.RECIPES, check_recipe, recipes.load_recipe),
    Row("PRETRAINED", pretrained.PRETRAINED, check_pretrained, pretrained.info),
    Row("ACTIVATIONS", _nn.ACTIVATIONS, check_activation, _nn.activation_by_name),
]

# Module-level mappings named in capitals that are not registries of their own, with the reason.
NOT_REGISTRIES = {
    "metafam.tasks.registry.HELDOUT_TASKS": "HELDOUT_SUITE's constructors by name (its row checks each is TASKS')",
    "metafam.tasks.registry.TEST_TASKS": "TEST_SUITE's constructors by name (its row checks each is TASKS')",
    "metafam.tasks.registry.USER_DATA": "which registered tasks need data the user supplies (`needs_user_data`)",
    "metafam.tasks.registry.USER_DATA_SOURCES": "the data the user supplies, and how (`needs_user_data`)",
    "metafam.benchmark.suites.HORIZONS": "HELDOUT_SUITE's horizons by task (its row checks them)",
    "metafam.benchmark.suites.TEST_HORIZONS": "TEST_SUITE's horizons by task (its row checks them)",
    "metafam.optimizers.registry._NATIVE": "metafam's own classes behind three HAND_DESIGNED entries (its row checks "
                                           "each against OPTAX_FACTORIES' entry of that name)",
    "metafam.benchmark.baselines.GRIDS": "each tuned baseline's rate grid (OPTAX_FACTORIES' row checks every entry "
                                         "has one)",
    "metafam._cli_spec.EXIT_CODES": "the command line's specification (tests/test_cli.py)",
    "metafam._cli_spec.COMMANDS": "the command line's specification (tests/test_cli.py)",
    "metafam._cli_spec.RUN_DEFAULTS": "the command line's specification (tests/test_cli.py)",
    "metafam.cli.FLAG_NAMES": "the command line's specification (tests/test_cli.py)",
    "metafam.datasets.idx._CODES": "a file format's private table (the IDX type codes)",
    "metafam.datasets.idx._BY_KIND": "a file format's private table (the IDX type codes)",
    "metafam.datasets.images._IDX_FILES": "a file format's private table (the IDX file names)",
    "metafam.runs.checkpoint_leaves._NATIVE": "a file format's private table (the checkpoint's dtypes)",
}
# learned_optimization's own module tree, mirrored with its names and tables (tests/compat checks it against LO).
NOT_SCANNED = ("metafam.compat.learned_optimization",)


class _ShapeShiftingFamily(QuadraticFamily):
  """Broken on purpose: the config's 'target' length depends on the key (not vmappable)."""

  def __init__(self):
    super().__init__(3)

  def sample(self, key):
    cfg = super().sample(key)
    return dict(cfg, target=jnp.zeros((3 + int(jax.random.randint(key, (), 0, 2)),)))


# For each row, one entry (name, entry) that breaks the row's contract: its check must reject it.
BROKEN = {
    "TASKS": ("quadratic_10", lambda: QuadraticTask(11)),  # not the documented parameter count
    "HELDOUT_SUITE": ("mnist_mlp_16x16_64_b32", tasks.SuiteTask(tasks.TASKS["mnist_mlp_16x16_64_b32"], 7)),
    "TEST_SUITE": ("fmnist60k_logreg_28x28_b128", tasks.SuiteTask(tasks.TASKS["fmnist60k_logreg_28x28_b128"], 1001)),
    "SUITES": ("tiny", ["quadratic_10", "no_such_task"]),
    "SUITE_SPECS": ("heldout", dataclasses.replace(baseline_files.SUITE_SPECS["heldout"], optimizers=("adamw", "adam"))),
    "LEARNED_OPTIMIZERS": ("learnable_sgd", LearnableAdam),  # 4 meta-parameters, documented 1
    "HAND_DESIGNED": ("sgd", lambda lr: OptaxOptimizer(optax.sgd(-lr), name="sgd")),  # ascends
    "OPTAX_FACTORIES": ("adam", lambda learning_rate: optax.chain(optax.sgd(learning_rate), optax.scale(-1.0))),
    "ESTIMATORS": ("pes", object),  # not a GradientEstimator
    "FAMILIES": ("quadratic_family_10", _ShapeShiftingFamily),
    "FAMILY_KINDS": ("task", tasks.get_task),  # builds the task, not a family of it
    "AUGMENTATIONS": ("loss_scale", lambda family, *args: family),  # does not wrap
    "RECIPES": ("generalist", "generalist_v2.json"),  # another recipe's file
    "PRETRAINED": ("generalist_v1", dataclasses.replace(pretrained.PRETRAINED["generalist_v1"],
                                                        default_learning_rate=0.5)),  # not its recipe's rate
    "ACTIVATIONS": ("relu", jnp.cumsum),  # not elementwise
}


def _entries():
  for row in TABLE:
    for name in sorted(row.registry):
      marks = [pytest.mark.slow] if name in row.slow else []
      yield pytest.param(row, name, id=f"{row.name}-{name}", marks=marks)


@pytest.mark.parametrize("row, name", list(_entries()))
def test_every_entry_meets_its_contract(row, name, request):
  for fixture in row.fixtures:
    request.getfixturevalue(fixture)
  row.check(name, row.registry[name])


def _module_level_tables():
  """``{"module.NAME": mapping}``: every mapping named in capitals (``_`` first allowed) that a module of metafam's
  source (less `NOT_SCANNED`) assigns at module level, read from the sources and looked up on the imported module."""
  root = os.path.dirname(os.path.abspath(metafam.__file__))
  found = {}
  for folder, _, files in os.walk(root):
    for filename in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(folder, filename)
      parts = os.path.relpath(path, os.path.dirname(root))[:-3].split(os.sep)
      module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
      if module.startswith(NOT_SCANNED):
        continue
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
      names = [t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(t, ast.Name) and re.fullmatch(r"_?[A-Z][A-Z0-9_]*", t.id)]
      if names:
        loaded = importlib.import_module(module)
        found.update({f"{module}.{n}": getattr(loaded, n) for n in names if isinstance(getattr(loaded, n), Mapping)})
  return found


def test_every_registry_of_the_package_is_in_the_table():
  tables = _module_level_tables()
  rows = {id(row.registry): row.name for row in TABLE}
  assert len(rows) == len(TABLE), "a registry is in the table twice"
  missing = sorted(n for n, t in tables.items() if id(t) not in rows and n not in NOT_REGISTRIES)
  assert not missing, f"registries not in the table (add a row, or say in NOT_REGISTRIES why not): {missing}"
  assert not set(NOT_REGISTRIES) - set(tables), f"stale NOT_REGISTRIES entries: {set(NOT_REGISTRIES) - set(tables)}"
  in_package = {id(t) for t in tables.values()}
  assert all(id(row.registry) in in_package for row in TABLE)
  assert {n.rsplit(".", 1)[1] for n, t in tables.items() if id(t) in rows} == set(rows.values())
  assert all(row.registry for row in TABLE)


@pytest.mark.parametrize("row", TABLE, ids=lambda row: row.name)
def test_a_broken_entry_fails_its_contract(row, monkeypatch, request):
  assert row.name in BROKEN, f"{row.name}: give BROKEN an entry its check rejects"
  name, entry = BROKEN[row.name]
  for fixture in row.fixtures:
    request.getfixturevalue(fixture)
  monkeypatch.setitem(row.registry, name, entry)
  with pytest.raises((AssertionError, ValueError, TypeError)):
    row.check(name, entry)


@pytest.mark.parametrize("row", [row for row in TABLE if row.lookup is not None], ids=lambda row: row.name)
def test_an_unknown_name_raises_the_shared_error(row):
  with pytest.raises(UnknownNameError) as info:
    row.lookup("no_such_name")
  error = info.value
  assert isinstance(error, KeyError) and isinstance(error, ValueError)
  message = str(error)
  assert message.startswith("unknown ") and "'no_such_name'; valid names: " in message
  assert message.endswith(", ".join(sorted(row.registry)))
