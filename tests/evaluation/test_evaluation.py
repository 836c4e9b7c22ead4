"""train_and_evaluate (single and vectorized, device and host paths) and the ensemble pytree helpers."""

import gc
import itertools
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metafam.datasets.base import SPLITS, ArraySplit, Datasets
from metafam.evaluation import (ensemble_apply, ensemble_init, ensemble_size, eval_points, train_and_evaluate,
                                train_and_evaluate_vectorized, tree_stack, tree_take, tree_unstack)
from metafam._identity import IdentityKey as _ByIdentity
from metafam.optimizers.base import SGD, Adam
from metafam.taskfamilies.quadratic import NoisyQuadraticFamily
from metafam.tasks.base import Task
from metafam.tasks.image_mlp import ImageMLPTask
from metafam.tasks.quadratic import QuadraticTask

LR, SCALE = 0.05, 2.0
RATE = 1.0 - LR * SCALE  # SGD contracts the error by this factor per step
QUAD = QuadraticTask(5, scale=SCALE, target=[1.0, -1.0, 0.5, 0.0, 2.0])
SGD_OPT = SGD(LR)


def _assert_results_equal(a, b, i=None):
  pick = (lambda x: x) if i is None else (lambda x: x[i])
  np.testing.assert_array_equal(a.train_losses, pick(b.train_losses))
  np.testing.assert_array_equal(a.eval_steps, b.eval_steps)
  for split in a.eval_losses:
    np.testing.assert_array_equal(a.eval_losses[split], pick(b.eval_losses[split]))
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, pick(y)), a.params, b.params)


# -- single runs --------------------------------------------------------------------------------------------------
def test_quadratic_sgd_matches_closed_form():
  num_steps, eval_every = 30, 7
  res = train_and_evaluate(QUAD, SGD_OPT, num_steps, eval_every, eval_batches=2, key=jax.random.key(1))
  np.testing.assert_array_equal(res.eval_steps, [0, 7, 14, 21, 28, 30])
  assert res.train_losses.shape == (num_steps,)
  assert set(res.eval_losses) == set(SPLITS) and all(v.shape == (6,) for v in res.eval_losses.values())
  loss0 = float(res.eval_losses["test"][0])
  # loss_t = 0.5 * scale * RATE^(2t) * ||x0 - target||^2: train loss t is measured before update t.
  np.testing.assert_allclose(res.train_losses, loss0 * RATE ** (2 * np.arange(num_steps)), rtol=2e-5)
  for split in SPLITS:  # no data: every split evaluates the same loss
    np.testing.assert_allclose(res.eval_losses[split], loss0 * RATE ** (2 * res.eval_steps), rtol=2e-5)
  # x_T - target = RATE^T (x0 - target), so the final params determine the initial loss.
  x0_err = (np.asarray(res.params) - np.asarray(QUAD.target)) / RATE ** num_steps
  np.testing.assert_allclose(loss0, 0.5 * SCALE * np.sum(x0_err ** 2), rtol=1e-4)
  assert res.model_state is None and int(res.opt_state.iteration) == num_steps and res.wall_time > 0
  # A raw optax transformation is wrapped and gives the same numbers.
  raw = train_and_evaluate(QUAD, optax.sgd(LR), num_steps, eval_every, 2, key=jax.random.key(1))
  _assert_results_equal(raw, res)


def test_eval_points_and_argument_errors():
  np.testing.assert_array_equal(eval_points(10, 3), [0, 3, 6, 9, 10])
  np.testing.assert_array_equal(eval_points(10, 5), [0, 5, 10])
  np.testing.assert_array_equal(eval_points(4, 10), [0, 4])
  with pytest.raises(ValueError, match="num_steps"):
    train_and_evaluate(QUAD, SGD_OPT, 0, 1, 1)
  with pytest.raises(ValueError, match="eval_every"):
    train_and_evaluate(QUAD, SGD_OPT, 5, 0, 1)
  with pytest.raises(ValueError, match="eval_batches"):
    train_and_evaluate(QUAD, SGD_OPT, 5, 1, 0)
  with pytest.raises(ValueError, match="splits"):
    train_and_evaluate(QUAD, SGD_OPT, 5, 1, 1, splits=("valid",))
  with pytest.raises(ValueError, match="num_instances"):
    train_and_evaluate_vectorized(QUAD, SGD_OPT, 5, 1, 1, num_instances=0)
  with pytest.raises(TypeError, match="optimizer"):
    train_and_evaluate(QUAD, "adam", 5, 1, 1)
  with pytest.raises(TypeError, match="TaskFamily"):
    train_and_evaluate(NoisyQuadraticFamily(4), SGD_OPT, 5, 1, 1)
  with pytest.raises(ValueError, match="3 keys"):
    train_and_evaluate_vectorized(QUAD, SGD_OPT, 5, 1, 1, 3, key=jax.random.split(jax.random.key(0), 2))


def test_image_mlp_losses_decrease_with_adam():
  task = ImageMLPTask((32,), image_size=8)
  res = train_and_evaluate(task, Adam(3e-3), 300, 150, eval_batches=4, key=jax.random.key(0), splits=("test",))
  np.testing.assert_array_equal(res.eval_steps, [0, 150, 300])
  assert res.train_losses.shape == (300,) and np.all(np.isfinite(res.train_losses))
  assert res.train_losses[:10].mean() > 2.0  # ~log(10) at init
  assert res.train_losses[-50:].mean() < res.train_losses[100:150].mean() < 0.6 * res.train_losses[:10].mean()
  test = res.eval_losses["test"]
  assert test[0] > 2.0 and test[2] < test[1] < test[0] and test[2] < 0.6 * test[0], test


class _Counter(Task):
  """``loss = 0.5 * mean_b ||p - x_b||^2`` with deterministic init ``p0 = 0.5``; its datasets are iterators."""

  def __init__(self, datasets):
    self.datasets = datasets

  def init(self, key):
    return jnp.full((2,), 0.5, jnp.float32)

  def loss(self, params, key, batch):
    return 0.5 * jnp.mean(jnp.sum(jnp.square(params[None] - batch["x"]), axis=-1))


EVAL_TARGETS = {"inner_valid": 1.0, "outer_valid": -1.0, "test": 2.0}


def _counter_datasets():
  """Host-only data: the t-th train batch has every row equal to 0.1 * t; eval splits are constant."""
  const = lambda v: ({"x": np.full((3, 2), v, np.float32)} for _ in itertools.count())
  train = ({"x": np.full((3, 2), 0.1 * t, np.float32)} for t in itertools.count())
  return Datasets(train, *(const(EVAL_TARGETS[s]) for s in SPLITS[1:]))


def _counter_reference(num_steps, lr, targets):
  """SGD by hand in float64: returns (train losses [T], params after each step [T + 1, 2])."""
  p, losses, params = np.full(2, 0.5), [], [np.full(2, 0.5)]
  for t in range(num_steps):
    losses.append(0.5 * np.sum((p - targets[t]) ** 2))
    p = p - lr * (p - targets[t])
    params.append(p)
  return np.array(losses), np.array(params)


def test_host_iterators_match_a_hand_written_loop():
  num_steps, lr = 9, 0.3
  task = _Counter(_counter_datasets())
  assert not task.datasets.has_device_data
  with pytest.raises(ValueError, match="use_device_data"):
    train_and_evaluate(task, SGD(lr), num_steps, 4, 2, use_device_data=True)
  # Evaluating "train" would draw from the training iterator itself, so only the other splits are evaluated.
  res = train_and_evaluate(task, SGD(lr), num_steps, 4, eval_batches=2, key=jax.random.key(0), splits=SPLITS[1:])
  losses, params = _counter_reference(num_steps, lr, 0.1 * np.arange(num_steps))
  np.testing.assert_allclose(res.train_losses, losses, rtol=1e-5)
  np.testing.assert_array_equal(res.eval_steps, [0, 4, 8, 9])
  for split, v in EVAL_TARGETS.items():
    np.testing.assert_allclose(res.eval_losses[split], 0.5 * np.sum((params[res.eval_steps] - v) ** 2, axis=-1),
                               rtol=1e-5)
  np.testing.assert_allclose(res.params, params[-1], rtol=1e-5)


def test_vectorized_host_members_draw_consecutive_batches_or_share_them():
  num_steps, lr, n = 6, 0.3, 2
  res = train_and_evaluate_vectorized(_Counter(_counter_datasets()), SGD(lr), num_steps, 3, 1, n, splits=("test",))
  for j in range(n):  # member j gets batches j, j + n, j + 2n, ... of the stream
    losses, params = _counter_reference(num_steps, lr, 0.1 * (n * np.arange(num_steps) + j))
    np.testing.assert_allclose(res.train_losses[j], losses, rtol=1e-5)
    np.testing.assert_allclose(res.eval_losses["test"][j], 0.5 * np.sum((params[[0, 3, 6]] - 2.0) ** 2, axis=-1),
                               rtol=1e-5)
  shared = train_and_evaluate_vectorized(_Counter(_counter_datasets()), SGD(lr), num_steps, 3, 1, n,
                                         splits=("test",), shared_batches=True)
  losses, _ = _counter_reference(num_steps, lr, 0.1 * np.arange(num_steps))
  np.testing.assert_allclose(shared.train_losses, np.stack([losses] * n), rtol=1e-5)


class _Regression(Task):
  """``0.5 * mean_b (w . x_b - y_b)^2`` with ``w ~ N(0, 1)``."""

  def __init__(self, datasets):
    self.datasets = datasets

  def init(self, key):
    return jax.random.normal(key, (3,), jnp.float32)

  def loss(self, params, key, batch):
    return 0.5 * jnp.mean(jnp.square(batch["x"] @ params - batch["y"]))


def test_host_fallback_equals_device_path_on_deterministic_data():
  # Every row of a split is the same example, so device sampling and host iteration see identical batches.
  def split(i, n=16):
    x = np.tile(np.array([[1.0, -0.5, 2.0]], np.float32) * (i + 1), (n, 1))
    return ArraySplit({"x": x, "y": np.full((n,), 1.0 - i, np.float32)}, batch_size=4, seed=i)

  task, adam, splits = _Regression(Datasets(*(split(i) for i in range(4)))), Adam(0.05), ("inner_valid", "test")
  kwargs = dict(num_steps=12, eval_every=5, eval_batches=3, key=jax.random.key(7), splits=splits)
  device = train_and_evaluate(task, adam, use_device_data=True, **kwargs)
  host = train_and_evaluate(task, adam, use_device_data=False, **kwargs)
  np.testing.assert_allclose(host.train_losses, device.train_losses, rtol=1e-6)
  for s in splits:
    np.testing.assert_allclose(host.eval_losses[s], device.eval_losses[s], rtol=1e-6)
  np.testing.assert_allclose(host.params, device.params, rtol=1e-6)
  assert device.train_losses[-1] < 0.5 * device.train_losses[0]
  assert abs(device.eval_losses["test"][-1] - device.eval_losses["inner_valid"][-1]) > 0.1  # splits really differ


class _Counting(Task):
  """A stateful task: the model state counts the loss calls made during training."""

  def init_with_state(self, key):
    return jax.random.normal(key, (2,)), {"calls": jnp.zeros((), jnp.int32)}

  def loss_with_state(self, params, state, key, batch):
    return jnp.sum(params ** 2), {"calls": state["calls"] + 1}


def test_stateful_task_state_travels_through_training():
  res = train_and_evaluate(_Counting(), SGD(0.1), 7, 3, 2, splits=("test",))
  assert int(res.model_state["calls"]) == 7  # evaluation does not update the state
  np.testing.assert_allclose(res.train_losses, res.train_losses[0] * 0.64 ** np.arange(7), rtol=1e-5)


# -- vectorized runs ----------------------------------------------------------------------------------------------
def test_vectorized_seeds_equal_separate_runs():
  key, n = jax.random.key(3), 3
  vec = train_and_evaluate_vectorized(QUAD, SGD_OPT, 12, 5, 2, n, key=key)
  assert vec.train_losses.shape == (n, 12) and vec.eval_losses["test"].shape == (n, 4) and vec.cfg is None
  assert vec.params.shape == (n, 5)
  for i, k in enumerate(jax.random.split(key, n)):
    _assert_results_equal(train_and_evaluate(QUAD, SGD_OPT, 12, 5, 2, key=k), vec, i)
  assert len(set(vec.train_losses[:, 0].tolist())) == n  # different seeds, different inits
  again = train_and_evaluate_vectorized(QUAD, SGD_OPT, 12, 5, 2, n, key=jax.random.split(key, n))
  _assert_results_equal(again, vec)


def test_vectorized_family_samples_equal_separate_runs_on_device_data():
  family = NoisyQuadraticFamily(dim=4, batch_size=8, scale_range=(0.5, 2.0))
  key, n, i, splits = jax.random.key(5), 3, 1, ("train", "test")
  vec = train_and_evaluate_vectorized(family, SGD_OPT, 10, 5, 2, n, key=key, splits=splits)
  assert vec.cfg["target"].shape == (n, 4) and len(set(vec.cfg["scale"].tolist())) == n
  # Instance i is the family's task for config i trained alone with key i (one instance keeps the test fast).
  single = train_and_evaluate(family.task_fn(tree_take(vec.cfg, i)), SGD_OPT, 10, 5, 2,
                              key=jax.random.split(key, n)[i], splits=splits)
  np.testing.assert_allclose(single.train_losses, vec.train_losses[i], rtol=1e-6)
  for s in splits:
    np.testing.assert_allclose(single.eval_losses[s], vec.eval_losses[s][i], rtol=1e-6)
  np.testing.assert_allclose(single.params, vec.params[i], rtol=1e-6)
  # Minibatch noise: the splits evaluate different noise rows, so their losses differ.
  assert not np.allclose(vec.eval_losses["train"], vec.eval_losses["test"])


def test_long_chunks_draw_in_blocks_with_the_same_numbers():
  """A training chunk draws its steps' keys and batch indices before its loop, DRAW_BLOCK steps at a time: one
  110-step chunk (2 blocks + 10 steps) trains exactly like eleven 10-step chunks, per member and with shared
  batches."""
  from metafam.inner.step import DRAW_BLOCK
  family = NoisyQuadraticFamily(dim=4, batch_size=8, scale_range=(0.5, 2.0))
  num_steps = 2 * DRAW_BLOCK + 10
  for shared in (False, True):
    runs = [train_and_evaluate_vectorized(family, SGD_OPT, num_steps, every, 1, 2, key=jax.random.key(6),
                                          splits=("test",), shared_batches=shared) for every in (num_steps, 10)]
    np.testing.assert_array_equal(runs[0].train_losses, runs[1].train_losses)
    jax.tree.map(np.testing.assert_array_equal, runs[0].params, runs[1].params)
    np.testing.assert_array_equal(runs[0].eval_losses["test"][:, -1], runs[1].eval_losses["test"][:, -1])


# -- ensemble helpers ---------------------------------------------------------------------------------------------
def test_ensemble_init_take_stack_unstack():
  init_fn = lambda k: {"w": jax.random.normal(k, (2, 3)), "b": jnp.zeros(3), "n": jnp.asarray(1)}
  key = jax.random.key(0)
  ens = ensemble_init(init_fn, key, 4)
  assert ensemble_size(ens) == 4 and ens["w"].shape == (4, 2, 3) and ens["n"].shape == (4,)
  for i, k in enumerate(jax.random.split(key, 4)):
    jax.tree.map(np.testing.assert_array_equal, tree_take(ens, i), init_fn(k))
  jax.tree.map(np.testing.assert_array_equal, tree_take(ens, -1), tree_take(ens, 3))
  jax.tree.map(np.testing.assert_array_equal, jax.jit(tree_take)(ens, 2), tree_take(ens, 2))  # traced index
  with pytest.raises(IndexError, match="out of range"):
    tree_take(ens, 4)
  jax.tree.map(np.testing.assert_array_equal, tree_stack(tree_unstack(ens)), ens)
  assert not np.array_equal(ens["w"][0], ens["w"][1])

  host = tree_stack([{"a": np.arange(3)}, {"a": np.arange(3) + 10}])
  assert isinstance(host["a"], np.ndarray) and host["a"].tolist() == [[0, 1, 2], [10, 11, 12]]
  with pytest.raises(ValueError, match="structure"):
    tree_stack([{"a": 1}, {"b": 1}])
  with pytest.raises(ValueError, match="leading"):
    ensemble_size({"a": np.zeros((2, 1)), "b": np.zeros((3,))})
  with pytest.raises(ValueError, match="n must"):
    ensemble_init(init_fn, key, 0)


def test_ensemble_apply_shares_the_inputs():
  members = {"w": jnp.arange(6.0).reshape(3, 2)}
  x = jnp.array([[1.0, 2.0], [0.5, -1.0]])
  out = ensemble_apply(lambda p, x: x @ p["w"], members, x)
  np.testing.assert_allclose(out, np.stack([np.asarray(x) @ np.asarray(w) for w in members["w"]]))


def test_compiled_programs_are_reused_but_do_not_keep_tasks_alive(caplog):
  """Same task and optimizer: the second call reuses the compiled programs. Once the caller drops them, jit's cache
  (which keys on their identity) does not keep them, or their data, alive."""
  task, opt = QuadraticTask(dim=3), SGD(0.1)
  train_and_evaluate(task, opt, num_steps=4, eval_every=2, eval_batches=1, key=jax.random.key(0))
  with jax.log_compiles():
    train_and_evaluate(task, opt, num_steps=4, eval_every=2, eval_batches=1, key=jax.random.key(1))
  assert not [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
  refs = (weakref.ref(task), weakref.ref(opt))
  del task, opt
  gc.collect()
  assert [r() for r in refs] == [None, None]


def test_identity_key_of_a_dead_object_matches_nothing():
  class Obj:
    pass

  obj = Obj()
  k1, k2 = _ByIdentity(obj), _ByIdentity(obj)
  assert k1 == k2 and hash(k1) == hash(k2) and k1.value is obj
  assert k1 != _ByIdentity(Obj())
  del obj
  gc.collect()
  assert k1 != k2  # a stale cache entry never matches, even a key that reuses the dead object's id
  slotted = _ByIdentity((1, 2))  # tuples take no weak references: held strongly, still keyed by identity
  assert slotted == slotted and slotted.value == (1, 2)
