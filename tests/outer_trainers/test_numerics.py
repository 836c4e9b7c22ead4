"""Numerics of meta-gradients and meta-training: no NaN leaks, no silent zeros, stable state dtypes, strict checks.

* TBPTT over lanes that go NaN returns the gradient of the masked meta-loss (central differences agree);
* meta-gradients through LearnableAdam / MLPLOpt on an MLP with dead ReLU units are finite and correct;
* every optimizer keeps its state's dtypes (bf16 params keep bf16 statistics), so low-precision unrolls work;
* an estimate with nothing finite reports meta_loss NaN, and MetaTrainer skips (and logs) that update, or with
  ``nonfinite="zero"`` applies the gradient with its non-finite entries set to 0 (learned_optimization's semantics);
* constructors refuse NaN, inf and bools with an error naming the argument.
"""

import inspect
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import metafam.optimizers as optimizers
from metafam.inner import ConstantSchedule, LogUniformSchedule, TruncatedStep
from metafam.optimizers import (SGD, SGDM, Adam, HandDesigned, LearnableAdam, LearnableSGD, LearnedOptimizer, MLPLOpt,
                                OptaxOptimizer, Optimizer)
from metafam.optimizers.learned import log1p_neg_safe, sqrt_zero_safe
from metafam.outer_trainers import GradientEstimate, GradientEstimator, MetaTrainer, make_estimator
from metafam.runs import train
from metafam.runs.run_dir import METRICS_NAME, read_metrics, run_identity
from metafam.taskfamilies.augmentations import LowPrecisionFamily
from metafam.taskfamilies.base import TaskFamily, single_task_to_family
from metafam.taskfamilies.quadratic import QuadraticFamily
from metafam.tasks import get_task
from metafam.tasks.base import Task

from metafam.optimizers.registry import LEARNED_OPTIMIZERS


# MLPLOpt's meta-gradient through dead units is also checked against differences in tests/optimizers/test_lopt_zoo.py
# (float64); LearnableAdam's case stays in the default suite as the float32 regression test of sqrt'(0). The NaN-lane
# TBPTT case on the train loss masks exactly as the case on a held-out split, which stays.
SLOW_CASES = {("test_meta_gradient_through_an_mlp_with_dead_units_is_finite_and_correct", "MLPLOpt(32x32)"),
              ("test_tbptt_with_nan_lanes_is_the_gradient_of_the_masked_loss", "adam-train-loss")}


def _unit_direction(tree, seed):
  """A random direction of unit norm shaped like ``tree`` (numpy draws: no random kernels to compile)."""
  rng = np.random.default_rng(seed)
  u = jax.tree.map(lambda x: rng.standard_normal(np.shape(x)), tree)
  norm = math.sqrt(sum(float(np.sum(x ** 2)) for x in jax.tree.leaves(u)))
  return jax.tree.map(lambda x, t: jnp.asarray(x / norm, jnp.result_type(t)), u, tree)


def _along(theta, u, h):
  return jax.tree.map(lambda t, v: t + h * v, theta, u)


def _dot(a, b):
  return sum(float(jnp.vdot(x, y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# -- 1. TBPTT over lanes that go NaN -----------------------------------------------------------------------------
class _NaNBall(Task):
  def __init__(self, cfg):
    self.cfg = cfg

  def init(self, key):
    return 0.5 * jax.random.normal(key, (4,), jnp.float32)

  def loss(self, params, key, batch):
    c = self.cfg
    noisy = params + 0.3 * jax.random.normal(key, params.shape)
    return (0.5 * c["scale"] * jnp.sum(jnp.square(params - c["target"]))
            + jnp.sqrt(c["radius"] - jnp.sum(jnp.square(noisy))) - jnp.sqrt(c["radius"]))


class NaNBallFamily(TaskFamily):
  """Quadratics pulling the params to a target at distance 3. A quarter of the instances ("bad": radius 4) add
  ``sqrt(4 - |params + noise|^2)``, which is NaN, value and gradient, once the noisy params leave the ball of radius
  2: a few steps into every trajectory. The noise depends on the loss key, so sometimes the meta-loss goes NaN first
  (params still finite) and sometimes the train loss (then the gradient and the updated params are NaN too)."""

  def sample(self, key):
    k_target, k_scale, k_bad = jax.random.split(key, 3)
    target = jax.random.normal(k_target, (4,))
    bad = jax.random.uniform(k_bad) < 0.25
    return {"target": 3.0 * target / jnp.linalg.norm(target),
            "scale": jnp.exp(jax.random.uniform(k_scale, (), jnp.float32, -0.5, 0.5)),
            "radius": jnp.where(bad, 4.0, 1e6)}

  def task_fn(self, cfg):
    return _NaNBall(cfg)


# SGD's case is Adam's without the sqrt(v) hazard at exactly-zero gradients: in the slow suite only.
NAN_LANE_CASES = [pytest.param(LearnableSGD(0.2), "same_batch", marks=pytest.mark.slow),
                  (LearnableAdam(0.1), "same_batch"), (LearnableAdam(0.1), None)]


@pytest.mark.parametrize("lopt, meta_loss_split", NAN_LANE_CASES, ids=["sgd", "adam", "adam-train-loss"])
def test_tbptt_with_nan_lanes_is_the_gradient_of_the_masked_loss(lopt, meta_loss_split):
  num_tasks, unroll = 8, 20
  est = make_estimator("tbptt", NaNBallFamily(), lopt, num_tasks=num_tasks, unroll_length=unroll,
                       schedule=ConstantSchedule(30), loss_kind="meta_loss", meta_loss_split=meta_loss_split,
                      random_initial_iteration=False)
  theta = lopt.init(jax.random.key(0))
  ws, key = est.init_worker_state(theta, jax.random.key(1)), jax.random.key(2)

  @jax.jit
  def meta_loss_and_mask(th):  # the estimator's own reported meta-loss, and the unroll's mask, as functions of theta
    loss = est.estimate_fn(th, ws, key)[0].meta_loss
    _, out = est.step.unroll_fn(th, ws, jax.random.split(key, unroll))
    return loss, out.mask

  e, _ = est.estimate(theta, ws, key)
  loss, mask = meta_loss_and_mask(theta)
  masked = int(np.sum(np.asarray(mask) == 0))
  assert 0 < masked < num_tasks * unroll // 4, "the test needs lanes that go NaN (and most steps finite)"
  for leaf in jax.tree.leaves(e.grad):
    assert np.all(np.isfinite(np.asarray(leaf))) and np.any(np.asarray(leaf) != 0)  # was exactly 0 before the fix
  assert float(e.metrics["num_nonfinite"]) == masked  # every gradient entry finite: nothing zeroed on the way
  assert float(e.meta_loss) == float(loss) and np.isfinite(float(loss))
  # Central difference of the masked meta-loss along a random unit direction. float32: the meta-loss (a mean of
  # ~150 values of order 1) carries rounding noise of ~1e-7 relative, i.e. ~1e-5 in the difference quotient at
  # h = 1e-2, and the h^2 term is ~1e-4 relative here; measured 6e-5 (SGD), 5e-5 and 5e-4 (Adam), so 5e-3.
  # The mask must be the same at theta +- h: the masked loss jumps where a lane's NaN moves to another step.
  u, h = _unit_direction(theta, 0), 1e-2
  (plus, mask_plus), (minus, mask_minus) = meta_loss_and_mask(_along(theta, u, h)), meta_loss_and_mask(
      _along(theta, u, -h))
  np.testing.assert_array_equal(np.asarray(mask_plus), np.asarray(mask))
  np.testing.assert_array_equal(np.asarray(mask_minus), np.asarray(mask))
  fd = (float(plus) - float(minus)) / (2 * h)
  np.testing.assert_allclose(_dot(e.grad, u), fd, rtol=5e-3)


# -- 2. meta-gradients through optimizers with exactly-zero gradient entries ---------------------------------------
def test_safe_sqrt_and_log1p_keep_values_and_have_finite_derivatives():
  x = jnp.asarray([0.0, 1e-45, 1e-30, 0.5, 2.0, 1e30, np.inf, np.nan], jnp.float32)
  np.testing.assert_array_equal(np.asarray(sqrt_zero_safe(x)), np.asarray(jnp.sqrt(x)))  # NaN == NaN here
  assert float(jax.grad(sqrt_zero_safe)(0.0)) == 0.0 and float(jax.grad(jnp.sqrt)(0.0)) == np.inf
  y = jnp.asarray([0.0, 1e-8, 0.5, 1.0 - 2 ** -24, 1.0], jnp.float32)
  np.testing.assert_array_equal(np.asarray(log1p_neg_safe(y)), np.asarray(jnp.log1p(-y)))
  assert float(jax.grad(log1p_neg_safe)(1.0)) == 0.0


def _mlp_unroll(lopt, dtype, num_steps=10):
  """``theta -> mean train loss over num_steps`` of the 8x8 MLP task (fixed batches, fixed init) in ``dtype``."""
  task = get_task("fmnist_mlp_8x8_32")
  batches = jax.vmap(task.datasets.device_data("train").sample)(jax.random.split(jax.random.key(3), num_steps))
  cast = lambda tree: jax.tree.map(lambda x: np.asarray(x, dtype) if np.issubdtype(x.dtype, np.floating) else
                                   np.asarray(x), tree)
  params0, batches = cast(task.init(jax.random.key(0))), cast(batches)

  def meta_loss(theta):
    opt = lopt.opt_fn(theta)

    def step(state, batch):
      loss, grad = jax.value_and_grad(task.loss)(opt.get_params(state), None, batch)
      return opt.update(state, grad, loss=loss), loss

    return jnp.mean(jax.lax.scan(step, opt.init(params0), batches)[1])

  first_grad = jax.grad(task.loss)(params0, None, jax.tree.map(lambda b: b[0], batches))
  return meta_loss, cast, first_grad


@pytest.mark.parametrize("lopt", [LearnableAdam(1e-2), MLPLOpt()], ids=lambda l: l.name)
def test_meta_gradient_through_an_mlp_with_dead_units_is_finite_and_correct(lopt):
  theta = lopt.init(jax.random.key(1))
  if isinstance(lopt, MLPLOpt):
    # Off the ReLU kinks of the optimizer's own MLP: with the descent init, a zero gradient entry puts the
    # pass-through units exactly at their kink, where the (one-sided) derivative and a central difference differ.
    rng = np.random.default_rng(5)
    theta = jax.tree.map(lambda x: x + jnp.asarray(0.1 * rng.standard_normal(x.shape), x.dtype), theta)
  # float32, as meta-training runs: finite (LearnableAdam's was NaN: sqrt'(0) = inf times 0 at dead units).
  meta_loss, _, first_grad = _mlp_unroll(lopt, np.float32)
  assert sum(int(jnp.sum(g == 0)) for g in jax.tree.leaves(first_grad)) > 24  # dead units: exact zeros
  grads = jax.jit(jax.grad(meta_loss))(theta)
  for leaf in jax.tree.leaves(grads):
    assert np.all(np.isfinite(np.asarray(leaf))) and np.any(np.asarray(leaf) != 0)
  # Correctness against central differences needs float64: in float32 the loss after 10 steps moves at its rounding
  # level for steps small enough to cross no ReLU kink (and Adam's normalization amplifies the rounding of tiny
  # gradients). With x64 the unroll runs in float64 (MLPLOpt's features stay float32 by design, which limits its
  # differences to ~1e-5..1e-3 relative), and h = 1e-4 measured relative errors of 4e-11 (LearnableAdam) and 2e-5
  # (MLPLOpt), so 1e-6 and 5e-3.
  with jax.enable_x64(True):
    meta_loss64, cast, _ = _mlp_unroll(lopt, np.float64)
    theta64 = cast(theta)
    value_and_grad = jax.jit(jax.value_and_grad(meta_loss64))
    _, grads64 = value_and_grad(theta64)
    u, h = _unit_direction(theta64, 0), 1e-4
    loss_fn = jax.jit(meta_loss64)
    fd = (float(loss_fn(_along(theta64, u, h))) - float(loss_fn(_along(theta64, u, -h)))) / (2 * h)
    directional = _dot(grads64, u)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree.leaves(grads64))
  np.testing.assert_allclose(directional, fd, rtol=1e-6 if isinstance(lopt, LearnableAdam) else 5e-3)


# -- 3. state dtypes are stable across updates ----------------------------------------------------------------------
def _exported_optimizers():
  """One instance of every optimizer class `metafam.optimizers` exports, plus every registered learned optimizer.

  Classes that need arguments are built here; a new export that cannot be built with defaults fails the test until
  it is added."""
  needs_args = {OptaxOptimizer: lambda: OptaxOptimizer(optax.adamw(1e-2)), HandDesigned: lambda: HandDesigned(Adam())}
  built = {f"registry:{name}": make() for name, make in LEARNED_OPTIMIZERS.items()}
  covered = {type(obj) for obj in built.values()}
  for name in optimizers.__all__:
    obj = getattr(optimizers, name)
    if inspect.isclass(obj) and issubclass(obj, (Optimizer, LearnedOptimizer)) and obj not in covered and obj not in (
        Optimizer, LearnedOptimizer):
      built[name] = needs_args[obj]() if obj in needs_args else obj()
  return built


OPTIMIZERS = _exported_optimizers()


def _types(tree):
  return [(jax.tree_util.keystr(path), jnp.result_type(x)) for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


# bf16 is where a dtype slips (float32 statistics promoting the params); the float32 run is in the slow suite.
@pytest.mark.parametrize("dtype", [pytest.param(jnp.float32, marks=pytest.mark.slow), jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_update_keeps_every_state_dtype(name, dtype):
  obj = OPTIMIZERS[name]
  opt = obj.opt_fn(obj.init(jax.random.key(0))) if isinstance(obj, LearnedOptimizer) else obj
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.standard_normal((3, 4)), dtype), "b": jnp.zeros((4,), dtype)}
  grad = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), dtype), params)
  state = opt.init(params)
  new = opt.update(state, grad, loss=jnp.float32(1.0))
  assert jax.tree.structure(new) == jax.tree.structure(state)
  assert _types(new) == _types(state)
  assert jnp.result_type(opt.get_params(new)["w"]) == dtype


def test_learnable_adam_trains_a_low_precision_family():
  lopt = LearnableAdam(1e-2)
  theta = lopt.init(jax.random.key(0))
  step = TruncatedStep(LowPrecisionFamily(QuadraticFamily(4)), lopt, 4, ConstantSchedule(3))
  state, out = step.unroll(theta, step.init_step_state(theta, jax.random.key(1)), jax.random.key(2), 5)
  assert np.all(np.asarray(out.mask) == 1) and np.all(np.isfinite(np.asarray(out.loss)))
  for leaf in jax.tree.leaves((state.opt_state.params, state.opt_state.opt_state)):
    assert leaf.dtype == jnp.bfloat16
  # and the meta-gradient through it
  est = make_estimator("tbptt", LowPrecisionFamily(QuadraticFamily(4)), lopt, num_tasks=2, unroll_length=3,
                       schedule=ConstantSchedule(5))
  e, _ = est.estimate(theta, est.init_worker_state(theta, jax.random.key(3)), jax.random.key(4))
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(e.grad))


# -- 4. nothing finite: meta_loss NaN, the meta-update skipped and logged -------------------------------------------
class _AlwaysNaN(Task):
  def init(self, key):
    return jnp.ones((3,))

  def loss(self, params, key, batch):
    return jnp.sum(params) * jnp.nan


def test_an_estimate_with_no_finite_step_reports_nan():
  fam, lopt = single_task_to_family(_AlwaysNaN()), LearnableSGD(0.1)
  theta = lopt.init(jax.random.key(0))
  kw = dict(loss_kind="meta_loss", meta_loss_split="same_batch")
  estimators = [make_estimator("tbptt", fam, lopt, num_tasks=2, unroll_length=3, **kw),
                make_estimator("pes", fam, lopt, num_tasks=2, unroll_length=3, **kw),
                make_estimator("truncated_es", fam, lopt, num_tasks=2, unroll_length=3, **kw),
                make_estimator("full_es", fam, lopt, num_tasks=2, trajectory_length=3, **kw)]
  for est in estimators:
    e, _ = est.estimate(theta, est.init_worker_state(theta, jax.random.key(1)), jax.random.key(2))
    assert np.isnan(float(e.meta_loss)), est.name  # was 0.0, indistinguishable from a perfect loss
    assert float(e.grad["log_lr"]) == 0.0 and float(e.metrics["num_nonfinite"]) > 0, est.name


class _Scripted(GradientEstimator):
  """Returns gradient 1 and meta-loss 2 except at step 1 (NaN gradient) and step 2 (NaN meta-loss); the worker
  state counts the calls."""

  name = "scripted"

  def init_worker_state(self, theta, key):
    return jnp.asarray(0, jnp.int32)

  def estimate_fn(self, theta, worker_state, key):
    grad = jax.tree.map(lambda t: jnp.where(worker_state == 1, jnp.nan, jnp.ones_like(t)), theta)
    meta_loss = jnp.where(worker_state == 2, jnp.nan, 2.0)
    return GradientEstimate(grad, meta_loss, {"num_nonfinite": jnp.float32(0)}), worker_state + 1

  @property
  def inner_steps_per_estimate(self):
    return 1


def test_meta_trainer_skips_and_logs_updates_without_information(tmp_path):
  lopt = LearnableSGD(0.1)
  trainer = MetaTrainer(lopt, [_Scripted()], optax.adam(0.1), clip_grad_norm=1.0)
  state, history = train(trainer, 4, key=jax.random.key(0), output_dir=str(tmp_path), progress=False)
  assert [h["update_skipped"] for h in history] == [0.0, 1.0, 1.0, 0.0]
  assert [h["nonfinite_grad_entries"] for h in history] == [0.0, 1.0, 0.0, 0.0]
  assert np.isnan(history[2]["meta_loss"]) and np.isnan(history[1]["grad_norm"])
  # Two real Adam steps of lr 0.1 on gradient 1 (skipped steps leave theta and the Adam moments alone).
  theta0 = float(lopt.init(None)["log_lr"])
  np.testing.assert_allclose(float(state.theta["log_lr"]), theta0 - 0.2, rtol=1e-5)
  assert int(state.opt_state[0].count) == 2
  # metrics.jsonl is strict JSON (null, not NaN), and read_metrics gives the NaN back.
  refuse = lambda constant: pytest.fail(f"metrics.jsonl holds the non-JSON constant {constant}")
  with open(os.path.join(str(tmp_path), METRICS_NAME)) as f:
    records = [json.loads(line, parse_constant=refuse) for line in f]
  assert records[2]["meta_loss"] is None and records[1]["grad_norm"] is None
  back = read_metrics(os.path.join(str(tmp_path), METRICS_NAME))
  assert np.isnan(back[2]["meta_loss"]) and back[3]["meta_loss"] == 2.0 and back[3]["step"] == 4



class _Fixed(GradientEstimator):
  """A fixed gradient and meta-loss on a 3-vector theta (no randomness); the worker state counts the calls."""

  def __init__(self, grad, meta_loss, name):
    self.grad, self.meta_loss, self.name = grad, meta_loss, name

  def init_worker_state(self, theta, key):
    return jnp.asarray(0, jnp.int32)

  def estimate_fn(self, theta, worker_state, key):
    grad = {"w": jnp.asarray(self.grad, jnp.float32)}
    return GradientEstimate(grad, jnp.float32(self.meta_loss), {"num_nonfinite": jnp.float32(0)}), worker_state + 1

  @property
  def inner_steps_per_estimate(self):
    return 1


@pytest.mark.parametrize("nonfinite", ["skip", "zero"])
def test_meta_update_skips_or_zeroes_a_nonfinite_gradient(nonfinite):
  # Two estimates: [1, nan, 2] (meta-loss NaN) and [3, 4, -inf] (meta-loss 1); their mean is [2, nan, -inf].
  estimators = [_Fixed([1.0, np.nan, 2.0], np.nan, "a"), _Fixed([3.0, 4.0, -np.inf], 1.0, "b")]
  trainer = MetaTrainer(LearnableSGD(0.1), estimators, optax.adam(0.1), nonfinite=nonfinite)
  state = trainer.init(jax.random.key(0), theta={"w": jnp.zeros(3)})
  state, metrics = trainer.step(state)
  adam = state.opt_state[0]
  assert float(metrics["nonfinite_grad_entries"]) == 2.0 and np.isnan(float(metrics["meta_loss"]))
  assert [int(w) for w in state.worker_states] == [1, 1] and int(state.step) == 1
  if nonfinite == "skip":  # theta and every Adam statistic as they were
    assert float(metrics["update_skipped"]) == 1.0 and np.isnan(float(metrics["grad_norm"]))
    np.testing.assert_array_equal(state.theta["w"], np.zeros(3))
    assert int(adam.count) == 0 and not np.any(adam.mu["w"]) and not np.any(adam.nu["w"])
    assert "nonfinite" not in run_identity(trainer)  # the default leaves checkpoints' configs as they were
  else:
    # learned_optimization's semantics: the mean gradient with NaN and +-inf entries set to 0, [2, 0, 0], is applied
    # whatever the meta-loss. Adam's first step is -lr * g / (|g| + eps): [-0.1, 0, 0]; mu = 0.1 g, nu = 0.001 g^2.
    assert float(metrics["update_skipped"]) == 0.0 and float(metrics["grad_norm"]) == 2.0
    np.testing.assert_allclose(state.theta["w"], [-0.1, 0.0, 0.0], rtol=1e-4)  # float32 bias corrections
    assert int(adam.count) == 1
    np.testing.assert_allclose(adam.mu["w"], [0.2, 0.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(adam.nu["w"], [0.004, 0.0, 0.0], rtol=1e-6)
    assert run_identity(trainer)["nonfinite"] == "zero"


def test_meta_update_nonfinite_policy_is_checked():
  with pytest.raises(ValueError, match="nonfinite must be one of 'skip', 'zero'.*got 'clip'"):
    MetaTrainer(LearnableSGD(0.1), [_Fixed([1.0, 1.0, 1.0], 1.0, "a")], optax.adam(0.1), nonfinite="clip")

# -- 5. argument checks refuse NaN, inf and bools -------------------------------------------------------------------
_FAMILY, _LOPT = QuadraticFamily(2), LearnableSGD(0.1)
BAD_ARGUMENTS = [
    (lambda v: make_estimator("pes", _FAMILY, _LOPT, sigma=v), "sigma"),
    (lambda v: make_estimator("truncated_es", _FAMILY, _LOPT, sigma=v), "sigma"),
    (lambda v: make_estimator("full_es", _FAMILY, _LOPT, sigma=v), "sigma"),
    (lambda v: make_estimator("pes", _FAMILY, _LOPT, clip_loss_diff=v), "clip_loss_diff"),
    (lambda v: MetaTrainer(_LOPT, [make_estimator("pes", _FAMILY, _LOPT)], optax.sgd(0.1), clip_grad_norm=v),
                                                  "clip_grad_norm"),
    (lambda v: SGD(v), "learning_rate"),
    (lambda v: SGDM(momentum=v), "momentum"),
    (lambda v: Adam(v), "learning_rate"),
    (lambda v: Adam(epsilon=v), "epsilon"),
    (lambda v: LearnableSGD(v), "initial_lr"),
    (lambda v: LearnableAdam(v), "initial_lr"),
    (lambda v: LearnableAdam(beta2=v), "beta2"),
    (lambda v: MLPLOpt(step_mult=v), "step_mult"),
    (lambda v: MLPLOpt(exp_mult=v), "exp_mult"),
    (lambda v: MLPLOpt(norm_eps=v), "norm_eps"),
    (lambda v: MLPLOpt(out_init_scale=v), "out_init_scale"),
    (lambda v: MLPLOpt(decays=(0.9, v)), r"decays\[1\]"),
    (lambda v: MLPLOpt(time_scales=(v,)), r"time_scales\[0\]"),
]
BAD_INTS = [
    (lambda v: make_estimator("full_es", _FAMILY, _LOPT, trajectory_length=v), "trajectory_length"),
    (lambda v: make_estimator("tbptt", _FAMILY, _LOPT, unroll_length=v), "unroll_length"),
    (lambda v: TruncatedStep(_FAMILY, _LOPT, num_tasks=v), "num_tasks"),
    (lambda v: ConstantSchedule(v), "length"),
    (lambda v: LogUniformSchedule(1, v), "LogUniformSchedule"),
    (lambda v: MLPLOpt(hidden_sizes=(v, 8)), r"hidden_sizes\[0\]"),
]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), True], ids=["nan", "inf", "-inf", "bool"])
@pytest.mark.parametrize("build, name", BAD_ARGUMENTS + BAD_INTS,
                         ids=[n.replace("\\", "") for _, n in BAD_ARGUMENTS + BAD_INTS])
def test_non_finite_and_bool_arguments_are_refused(build, name, value):
  with pytest.raises(ValueError, match=name):
    build(value)


def test_argument_errors_say_what_is_accepted():
  with pytest.raises(ValueError, match=r"sigma must be a positive number \(finite, not a bool\), got nan"):
    make_estimator("pes", _FAMILY, _LOPT, sigma=float("nan"))
  with pytest.raises(ValueError, match=r"beta1 must be a finite number in \(0, 1\) \(not a bool\), got inf"):
    LearnableAdam(beta1=float("inf"))
  assert SGD(np.float32(0.5)).learning_rate == 0.5 and MLPLOpt(hidden_sizes=(np.int64(4), 4)).hidden_sizes == (4, 4)
