"""The learned-optimizer zoo: one conformance suite run over every entry of the registry, plus per-optimizer checks.

Conformance (every test taking the ``zoo`` fixture runs once per entry of `LEARNED_OPTIMIZERS`, so a new entry is
covered by registering it): the meta-gradient through 10 steps of the 8x8 MLP task (with exact-zero gradient entries)
is finite and matches a finite difference; state dtypes and shapes survive updates of bf16 params; `vmap` lanes (theta
shared or per lane) equal separate runs; ``as_optax`` equals the `Optimizer`; and every outer-gradient estimator
gives a finite estimate, which runs `TruncatedStep` with theta shared (also under `jax.grad`) and per lane
(PES in the default suite, the other estimators with ``pytest -m slow``). The registry's contract itself (theta a tree
of float32 arrays of the documented size, the two faces agreeing, jit and vmap over theta, 10 steps reducing a
quadratic's loss) is the conformance table's row LEARNED_OPTIMIZERS (tests/test_conformance.py).

Compilation dominates the run time, so each test builds one jitted program (e.g. all estimators together).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from optax_runs import assert_trees_close, run_optax

from metafam import outer_trainers
from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.optimizers import SGDM, Adam, LearnedOptimizer
from metafam.optimizers.adafac_mlp_lopt import AdafacMLPLOpt
from metafam.optimizers.newton_schulz import orthogonalize
from metafam.optimizers.learnable_sgdm import LearnableSGDM
from metafam.optimizers.mlp_nom_lopt import MLPNomLOpt
from metafam.optimizers.nn_adam import NNAdam
from metafam.optimizers.registry import LEARNED_OPTIMIZERS, get_learned_optimizer, list_learned_optimizers
from metafam.optimizers.rnn_mlp_lopt import RNNMLPLOpt
from metafam.outer_trainers import PES, FullES, GradientEstimator, NoiseReuseES, TruncatedBPTT, TruncatedES
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks import get_task
from metafam.tasks.base import Task
from metafam.tasks.quadratic import QuadraticTask

NAMES = list_learned_optimizers()


@pytest.fixture(scope="module", params=NAMES)
def zoo(request):
  """``(name, lopt, theta)`` for each registry entry, built once per module."""
  lopt = get_learned_optimizer(request.param)
  return request.param, lopt, lopt.init(jax.random.key(0))


def _perturbed(theta, seed, scale=0.1):
  """``theta + scale * N(0, 1)``: every pathway active (zero-initialized heads included)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: x + jnp.asarray(scale * rng.standard_normal(np.shape(x)), x.dtype), theta)


def _layout(tree):
  return jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), tree)



def _all_finite(tree):
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


# -- registry -------------------------------------------------------------------------------------------------------
def test_registry_lists_every_optimizer_and_builds_with_kwargs():
  assert NAMES == sorted(LEARNED_OPTIMIZERS) and {"mlp_lopt", "learnable_adam", "learnable_sgd", "learnable_sgdm",
                                                   "adafac_mlp_lopt", "adafac_muon_mlp_lopt", "nn_adam", "rnn_mlp_lopt",
                                                   "mlp_nom_lopt"} <= set(NAMES)
  for name in NAMES:
    assert isinstance(get_learned_optimizer(name), LearnedOptimizer)
  assert get_learned_optimizer("learnable_sgdm", initial_lr=0.3).initial_lr == 0.3
  with pytest.raises(ValueError, match="unknown learned optimizer 'adamw'; valid names: adafac_mlp_lopt, .*nn_adam"):
    get_learned_optimizer("adamw")


@pytest.mark.parametrize("build, message", [
    (lambda: LearnableSGDM(momentum=1.0), r"momentum must be a finite number in \(0, 1\) \(not a bool\), got 1.0"),
    (lambda: LearnableSGDM(initial_lr=float("inf")), r"initial_lr must be a finite number > 0 \(not a bool\), got inf"),
    (lambda: AdafacMLPLOpt(hidden_sizes=(1,)), "hidden_sizes must be a non-empty sequence of ints >= 2"),
    (lambda: AdafacMLPLOpt(decays=(0.9, float("nan"))), r"decays\[1\] must be a finite number in \(0, 1\).*, got nan"),
    (lambda: AdafacMLPLOpt(step_mult=0.0), "step_mult must be a finite number > 0"),
    (lambda: AdafacMLPLOpt(orthogonal_momentum="yes"), "orthogonal_momentum must be a bool, got 'yes'"),
    (lambda: AdafacMLPLOpt(fan_in_power=float("nan")),
     r"fan_in_power must be a finite number >= 0 \(not a bool\), got nan"),
    (lambda: AdafacMLPLOpt(base_fan_in=0), "base_fan_in must be a positive int, got 0"),
    (lambda: NNAdam(beta2=0.0), r"beta2 must be a finite number in \(0, 1\)"),
    (lambda: NNAdam(lstm_hidden=True), r"lstm_hidden must be an int >= 1 \(not a bool\), got True"),
    (lambda: RNNMLPLOpt(lstm_hidden=0), "lstm_hidden must be an int >= 1"),
    (lambda: RNNMLPLOpt(time_scales=(1.0, -3.0)), r"time_scales\[1\] must be a finite number > 0"),
    (lambda: MLPNomLOpt(beta1=0.8), r"beta1 must be one of decays=\(0.9, 0.99, 0.999\)"),
    (lambda: MLPNomLOpt(out_init_scale=-1.0), "out_init_scale must be a finite number >= 0"),
])
def test_bad_arguments_are_named(build, message):
  with pytest.raises(ValueError, match=message):
    build()


# -- conformance: every registered optimizer ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlp_problem():
  """The 8x8 Fashion-MNIST MLP, one fixed batch, and params with 4 dead hidden units (bias -100), so the gradient
  has exact zeros: their incoming weights, biases and outgoing weights, besides any constant-zero input pixel."""
  task = get_task("fmnist_mlp_8x8_32")
  # A batch drawn by key, not from the shared train iterator (whose position depends on which tests ran before).
  batch = jax.tree.map(np.asarray, task.datasets.device_data("train").sample(jax.random.key(3)))
  params = task.init(jax.random.key(0))
  params["linear_0"]["b"] = params["linear_0"]["b"].at[:4].set(-100.0)
  grad = jax.grad(task.loss)(params, None, batch)
  assert sum(int(jnp.sum(g == 0)) for g in jax.tree.leaves(grad)) >= 4 * (64 + 1 + 10)
  return task, params, batch


def test_meta_gradient_is_finite_and_matches_finite_difference(zoo, mlp_problem):
  name, lopt, theta = zoo
  task, params, batch = mlp_problem
  theta = _perturbed(theta, seed=1)
  rng = np.random.default_rng(2)
  direction = jax.tree.map(lambda x: rng.standard_normal(np.shape(x)), theta)
  norm = np.sqrt(sum(np.sum(np.square(u)) for u in jax.tree.leaves(direction)))
  # In float64, so a difference quotient resolves the derivative: rounding contributes ~1e-16 * loss / eps ~ 1e-10.
  with jax.enable_x64(True):
    f64 = lambda tree: jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), tree)
    theta, params, direction = f64(theta), f64(params), jax.tree.map(lambda u: jnp.asarray(u / norm), direction)

    def meta_loss(theta):  # mean over 10 steps of the loss after each update
      opt = lopt.opt_fn(theta, is_training=True)

      def step(state, _):
        loss, grad = jax.value_and_grad(task.loss)(opt.get_params(state), None, batch)
        state = opt.update(state, grad, loss=loss)
        return state, task.loss(opt.get_params(state), None, batch)

      return jnp.mean(jax.lax.scan(step, opt.init(params), None, length=10)[1])

    value_and_grad = jax.jit(jax.value_and_grad(meta_loss))  # one program, reused for the difference quotient
    value, grad = value_and_grad(theta)
    assert np.isfinite(float(value)) and _all_finite(grad), name
    assert all(g.dtype == jnp.float64 for g in jax.tree.leaves(grad))
    ad = sum(float(jnp.vdot(g, u)) for g, u in zip(jax.tree.leaves(grad), jax.tree.leaves(direction)))
    # Central difference along a unit direction, eps = 1e-4. Too large a step crosses kinks (ReLUs in the task and
    # the optimizers' MLPs; Adam's m / (sqrt(v) + 1e-8) is nearly a step function of g near g = 0: eps = 1e-3 was
    # off by 10-40% for some entries); too small a step drowns in the float32 rounding of MLPLOpt's features (float32
    # by design even under x64: eps = 1e-5 was off by 1.5% on some batches). At 1e-4 the measured relative errors
    # are 8e-4 (mlp_lopt), 6e-5 (rnn_mlp_lopt), 2e-6 (mlp_nom_lopt) and <= 5e-9 for the rest; rtol 1e-2 keeps a 12x
    # margin, and a wrong gradient is off by far more. A kink within 1e-4 of theta can still spoil that quotient
    # (muon_residual_lopt: 6x off at 1e-4, equal to 1e-8 at 1e-5 and 1e-6): then 1e-5 must agree. A wrong gradient
    # disagrees at both.
    shifted = lambda s: value_and_grad(jax.tree.map(lambda t, u: t + s * u, theta, direction))[0]
    fds = []
    for eps in (1e-4, 1e-5):
      fds.append((float(shifted(eps)) - float(shifted(-eps))) / (2 * eps))
      if abs(ad - fds[-1]) <= 1e-2 * abs(fds[-1]):
        break
  assert abs(ad) > 0, name
  np.testing.assert_allclose(ad, fds[-1], rtol=1e-2, err_msg=f"{name}: difference quotients {fds}")


def test_state_dtypes_and_shapes_are_stable_with_bf16_params(zoo):
  _, lopt, theta = zoo
  opt = lopt.opt_fn(_perturbed(theta, seed=3))
  rng = np.random.default_rng(4)
  params = {"w": jnp.asarray(rng.standard_normal((6, 4)), jnp.bfloat16),
            "w3": jnp.asarray(rng.standard_normal((2, 3, 5)), jnp.bfloat16),
            "b": jnp.zeros((4,), jnp.bfloat16), "s": jnp.asarray(0.5, jnp.bfloat16),
            "f": jnp.asarray(rng.standard_normal(3), jnp.float32)}
  state = opt.init(params)
  layout = _layout(state)
  assert state.iteration.dtype == jnp.int32
  update = jax.jit(opt.update)
  for i in range(3):
    grad = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(jnp.shape(p)), p.dtype), params)
    grad["w"] = grad["w"].at[:, 0].set(0.0)  # exact zeros, and a whole zero leaf
    grad["b"] = jnp.zeros_like(grad["b"])
    state = update(state, grad, loss=jnp.float32(1.0))
    assert _layout(state) == layout, f"update {i + 1} changed the state's dtypes or shapes"
    assert _all_finite(state) and int(state.iteration) == i + 1


def test_vmap_over_lanes_equals_separate_runs(zoo):
  """Lanes of a `vmap` (theta shared, or one theta per lane) compute exactly what separate runs compute."""
  _, lopt, theta = zoo
  lanes, num_steps = 2, 3
  rng = np.random.default_rng(7)
  tree = lambda *lead: {"w": rng.standard_normal(lead + (5, 3)), "b": rng.standard_normal(lead + (3,)),
                        "s": rng.standard_normal(lead)}
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree(lanes))
  grads = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree(lanes, num_steps))
  thetas = jax.tree.map(lambda *xs: jnp.stack(xs), *[_perturbed(theta, seed=10 + i) for i in range(lanes)])

  def train(th, p, gs):
    opt = lopt.opt_fn(th)
    state = jax.lax.scan(lambda st, g: (opt.update(st, g), None), opt.init(p), gs)[0]
    return opt.get_params(state)

  @jax.jit  # one program
  def run(theta, thetas, params, grads):
    lane = lambda tree, i: jax.tree.map(lambda x: x[i], tree)
    shared = jax.vmap(train, in_axes=(None, 0, 0))(theta, params, grads)
    batched = jax.vmap(train)(thetas, params, grads)
    singles = [(train(theta, lane(params, i), lane(grads, i)), train(lane(thetas, i), lane(params, i), lane(grads, i)))
               for i in range(lanes)]
    return shared, batched, singles

  shared, batched, singles = run(theta, thetas, params, grads)
  for i, (want_shared, want_batched) in enumerate(singles):
    assert_trees_close(jax.tree.map(lambda x: x[i], shared), want_shared, rtol=1e-5, atol=1e-6)
    assert_trees_close(jax.tree.map(lambda x: x[i], batched), want_batched, rtol=1e-5, atol=1e-6)


class _MatrixQuadratics(TaskFamily):
  """``0.5 * scale * (||w - target||^2 + ||b||^2)`` with params ``{"w": f32[3, 2], "b": f32[2]}`` (a matrix, so the
  factored paths run in `TruncatedStep` too)."""

  def sample(self, key):
    k1, k2 = jax.random.split(key)
    return {"target": jax.random.normal(k1, (3, 2)), "scale": jnp.exp(jax.random.uniform(k2, (), minval=-1.0))}

  def task_fn(self, cfg):
    return _MatrixQuadratic(cfg)


class _MatrixQuadratic(Task):
  def __init__(self, cfg):
    self.cfg = cfg

  def init(self, key):
    return {"w": jax.random.normal(key, (3, 2)), "b": jnp.ones((2,))}

  def loss(self, params, key, batch):
    return 0.5 * self.cfg["scale"] * (jnp.sum(jnp.square(params["w"] - self.cfg["target"]))
                                      + jnp.sum(jnp.square(params["b"])))


# The cheapest configuration of each estimator: 1 pair (2 lanes), 2-step truncations of 2-step trajectories (so every
# lane finishes a trajectory and resets inside the estimate).
ESTIMATORS = {  # estimator class -> (lanes of its step: TBPTT lanes or ES pairs, estimator arguments)
    TruncatedBPTT: (2, dict(unroll_length=2)),
    FullES: (1, dict(trajectory_length=2)),
    TruncatedES: (1, dict(unroll_length=2)),
    PES: (1, dict(unroll_length=2)),
    NoiseReuseES: (1, dict(unroll_length=2)),
}


def test_estimator_list_covers_every_estimator_class():
  exported = {c for c in vars(outer_trainers).values()
              if isinstance(c, type) and issubclass(c, GradientEstimator) and c is not GradientEstimator}
  assert exported == set(ESTIMATORS)


# PES runs the truncated step with per-lane antithetic theta and an accumulator across resets, and the test adds
# `jax.grad` through an unroll with per-lane theta: the default suite runs that for every entry. Theta shared by the
# lanes is in `test_vmap_over_lanes_equals_separate_runs` and the conformance table's ESTIMATORS row
# (tests/test_conformance.py); the other estimators (TruncatedBPTT's shared theta under `jax.grad` among them) run
# for every entry in the slow suite.
REPRESENTATIVE = ("PES",)
OTHERS = tuple(cls.__name__ for cls in ESTIMATORS if cls.__name__ not in REPRESENTATIVE)
# The estimators' path through `TruncatedStep` with per-lane theta does not depend on the optimizer beyond what
# `test_vmap_over_lanes_equals_separate_runs` (per-lane states) and the finite-difference test (`jax.grad` through
# its updates) check for every entry, so the default suite runs it for three entries of different structure (the
# per-parameter MLP, the main job's factored Muon MLP, the Muon residual); the others run with `-m slow`. Likewise
# `adafac_muon_rms_lopt` is `adafac_muon_mlp_lopt` with unit-RMS steps (tested by
# `test_unit_rms_steps_follow_the_learning_rate_schedule_whatever_the_parameter_scale`), and `adafac_mlp_lopt` is it
# without the orthogonalized-momentum feature: their gradient and vmap cases repeat the main job's optimizer's.
ESTIMATOR_DEFAULT_ENTRIES = ("mlp_lopt", "adafac_muon_mlp_lopt", "muon_residual_lopt")
SLOW_CASES = {("test_truncated_step_and_every_estimator", f"{name}-representative") for name in NAMES
              if name not in ESTIMATOR_DEFAULT_ENTRIES} | {
    (test, name) for test in ("test_meta_gradient_is_finite_and_matches_finite_difference",
                              "test_vmap_over_lanes_equals_separate_runs")
    for name in ("adafac_muon_rms_lopt", "adafac_mlp_lopt")}


@pytest.mark.parametrize("estimator_names", [REPRESENTATIVE, pytest.param(OTHERS, marks=pytest.mark.slow)],
                         ids=["representative", "others"])
def test_truncated_step_and_every_estimator(zoo, estimator_names):
  """One short estimate of every estimator class (PES by default, the rest with ``-m slow``). Between them
  they run `TruncatedStep` with theta shared by the lanes (TruncatedBPTT under `jax.grad`; TruncatedES's unperturbed
  lanes) and per lane (the antithetic ES lanes), across trajectory resets; the lane states must keep their dtypes and
  shapes. Plus `jax.grad` through an unroll with per-lane theta."""
  name, lopt, theta = zoo
  step_of = lambda lanes: TruncatedStep(_MatrixQuadratics(), lopt, lanes, ConstantSchedule(2),
                                       random_initial_iteration=True, meta_loss_split="outer_valid")
  estimators = {cls.__name__: cls(step_of(lanes), loss_kind="meta_loss", **kwargs)
                for cls, (lanes, kwargs) in ESTIMATORS.items() if cls.__name__ in estimator_names}
  step = step_of(2)  # theta per lane under jax.grad below

  thetas = jax.tree.map(lambda a, b: jnp.stack([a, b]), theta, _perturbed(theta, seed=5))

  def batched_meta_loss(thetas, lanes, keys):  # per-lane theta under jax.grad (the estimators differentiate shared)
    return jnp.mean(step.unroll_fn(thetas, lanes, keys, theta_is_batched=True)[1].meta_loss)

  @jax.jit  # all in one program: one compilation per optimizer instead of two per estimator
  def estimate_all(theta, thetas, key):
    k_init, k_est = jax.random.split(key)
    out = {}
    for n, est in estimators.items():
      worker = est.init_worker_state(theta, k_init)
      out[n] = (worker,) + est.estimate_fn(theta, worker, k_est)
    lanes = step.init_fn(thetas, k_init, theta_is_batched=True)
    return out, jax.grad(batched_meta_loss)(thetas, lanes, jax.random.split(k_est, 2))

  results, per_lane_grad = estimate_all(theta, thetas, jax.random.key(0))
  assert _all_finite(per_lane_grad), name
  for lane in range(2):  # each lane's theta gets its own nonzero gradient
    assert any(np.any(np.asarray(g)[lane] != 0) for g in jax.tree.leaves(per_lane_grad)), (name, lane)
  for estimator, (worker, estimate, new_worker) in results.items():
    where = f"{name} with {estimator}"
    assert _layout(new_worker) == _layout(worker), where
    assert jax.tree.structure(estimate.grad) == jax.tree.structure(theta), where
    assert _all_finite(estimate.grad) and np.isfinite(float(estimate.meta_loss)), where
    assert float(estimate.metrics["num_nonfinite"]) == 0.0, where
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(estimate.grad)), where


def test_as_optax_matches_the_optimizer(zoo):
  _, lopt, theta = zoo
  theta = _perturbed(theta, seed=6)
  task = QuadraticTask(dim=5, scale=3.0, target=jnp.arange(5.0))
  x0 = jnp.asarray(np.random.default_rng(1).standard_normal(5), jnp.float32)
  opt, tx = lopt.opt_fn(theta), lopt.as_optax(theta)
  assert isinstance(tx, optax.GradientTransformationExtraArgs)

  def optimizer_step(state, _):
    return opt.update(state, jax.grad(task.loss)(opt.get_params(state), None, None)), None

  def optax_step(carry, _):
    params, ostate = carry
    updates, ostate = tx.update(jax.grad(task.loss)(params, None, None), ostate, params)
    return (optax.apply_updates(params, updates), ostate), None

  @jax.jit  # both paths in one program
  def both(x0):
    state = jax.lax.scan(optimizer_step, opt.init(x0), None, length=4)[0]
    return opt.get_params(state), jax.lax.scan(optax_step, (x0, tx.init(x0)), None, length=4)[0][0]

  want, got = both(x0)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
  assert not np.allclose(np.asarray(got), np.asarray(x0))


# -- per-optimizer checks ------------------------------------------------------------------------------------------
def _params(seed=0):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(rng.standard_normal((6, 4)), jnp.float32),
          "b": jnp.asarray(rng.standard_normal(4), jnp.float32), "s": jnp.float32(0.3)}


def _grads(num, seed=1):
  return [jax.tree.map(lambda x: 0.5 * x, _params(seed * 100 + i)) for i in range(num)]


def _run(opt, params, grads):
  state, update = opt.init(params), jax.jit(opt.update)
  for g in grads:
    state = update(state, g)
  return state



def test_learnable_sgdm_is_sgd_with_momentum():
  lopt = LearnableSGDM(initial_lr=0.05, momentum=0.8)
  theta = lopt.init(jax.random.key(0))
  hp = LearnableSGDM.hyperparameters(theta)
  np.testing.assert_allclose([float(hp["lr"]), float(hp["momentum"])], [0.05, 0.8], rtol=1e-6)
  params, grads = _params(), _grads(5)
  got = _run(lopt.opt_fn(theta), params, grads).params
  assert_trees_close(got, run_optax(optax.sgd(0.05, momentum=0.8), params, grads), rtol=1e-5)
  assert_trees_close(got, _run(SGDM(0.05, 0.8), params, grads).params, rtol=1e-5)


@pytest.mark.parametrize("lopt", [NNAdam(initial_lr=1e-3), MLPNomLOpt(initial_lr=1e-3)], ids=lambda l: l.name)
def test_initial_theta_is_exactly_adam(lopt):
  """Their learned parts start at zero, so the initial optimizer is Adam(1e-3, 0.9, 0.999, 1e-8)."""
  params, grads = _params(), _grads(6)
  grads[2]["w"] = grads[2]["w"].at[0].set(0.0)
  got = _run(lopt.opt_fn(lopt.init(jax.random.key(0))), params, grads).params
  assert_trees_close(got, run_optax(optax.adam(1e-3), params, grads), rtol=1e-5, atol=1e-7)
  assert_trees_close(got, _run(Adam(1e-3), params, grads).params, rtol=1e-5, atol=1e-7)
  # ... and perturbing the learned part changes the steps.
  other = _run(lopt.opt_fn(_perturbed(lopt.init(jax.random.key(0)), seed=0)), params, grads).params
  assert not np.allclose(np.asarray(other["w"]), np.asarray(got["w"]), rtol=0, atol=1e-7)


def test_adafac_accumulators_are_factored_and_features_normalized():
  lopt = AdafacMLPLOpt()
  theta = lopt.init(jax.random.key(0))
  params = {"w": jnp.ones((2, 5, 3)), "v": jnp.ones((4,))}
  rng = np.random.default_rng(0)
  g = {"w": jnp.asarray(rng.standard_normal((2, 5, 3)), jnp.float32),
       "v": jnp.asarray(rng.standard_normal(4), jnp.float32)}
  state = jax.jit(lopt.opt_fn(theta).update)(lopt.opt_fn(theta).init(params), g)
  acc = state.opt_state
  omd = 1.0 - np.asarray(lopt.decays)[:, None, None]
  g2 = np.square(np.asarray(g["w"], np.float64))
  assert set(acc["w"]) == {"momenta", "row", "col"} and set(acc["v"]) == {"momenta", "v"}
  np.testing.assert_allclose(np.asarray(acc["w"]["row"]), omd * g2.mean(-1)[None], rtol=1e-5)
  np.testing.assert_allclose(np.asarray(acc["w"]["col"]), omd * g2.mean(-2)[None], rtol=1e-5)
  np.testing.assert_allclose(np.asarray(acc["v"]["v"]), omd[:, :, 0] * np.square(np.asarray(g["v"]))[None],
                             rtol=1e-5)
  # The initial step is per-tensor normalized Adafactor momentum: its RMS over the tensor is step_mult (+- noise).
  step = np.asarray(params["w"] - state.params["w"])
  np.testing.assert_allclose(np.sqrt(np.mean(np.square(step))), lopt.step_mult, rtol=0.1)
  assert np.corrcoef(step.ravel(), np.asarray(g["w"]).ravel())[0, 1] > 0.5


def test_orthogonalize_is_the_polar_factor_and_nan_safe():
  rng = np.random.default_rng(0)
  m = rng.standard_normal((24, 6))
  u, _, vt = np.linalg.svd(m, full_matrices=False)
  o = np.asarray(orthogonalize(jnp.asarray(m, jnp.float32)), np.float64)
  # Muon's quintic iteration trades exactness for speed: singular values land in about [0.5, 1.5] (optax's docs),
  # with the singular vectors of m, so o is close to the polar factor U V^T.
  sv = np.linalg.svd(o, compute_uv=False)
  assert sv.min() > 0.5 and sv.max() < 1.5
  polar = u @ vt
  assert np.sum(o * polar) / (np.linalg.norm(o) * np.linalg.norm(polar)) > 0.97
  # Invariant to the scale of m; a rank-3 tensor is the matrix [prod(shape[:-1]), shape[-1]].
  np.testing.assert_allclose(np.asarray(orthogonalize(jnp.asarray(1e-3 * m, jnp.float32))), o, rtol=1e-4, atol=1e-5)
  t = orthogonalize(jnp.asarray(m.reshape(4, 6, 6), jnp.float32))
  np.testing.assert_allclose(np.asarray(t).reshape(24, 6), o, rtol=1e-5, atol=1e-6)
  # All-zero momentum (a layer with no gradient yet): zero direction, and a zero, finite derivative.
  zero = jnp.zeros((5, 3))
  assert not np.any(np.asarray(orthogonalize(zero)))
  d = jax.grad(lambda x: jnp.sum(orthogonalize(x) * jnp.arange(15.0).reshape(5, 3)))(zero)
  assert np.all(np.isfinite(np.asarray(d))) and not np.any(np.asarray(d))  # the documented zero, not only finite


def test_adafac_muon_starts_as_muon_on_matrices_and_normalized_momentum_on_vectors():
  lopt = get_learned_optimizer("adafac_muon_mlp_lopt")
  assert lopt.orthogonal_momentum and lopt.name == "AdafacMLPLOpt(4x4, orthogonal)"
  theta = lopt.init(jax.random.key(0))
  params, (g,) = _params(), _grads(1)
  state = _run(lopt.opt_fn(theta), params, [g])
  step = jax.tree.map(lambda a, b: np.asarray(a - b, np.float64), params, state.params)
  # First step: m = (1 - b) g, so the matrix's direction is orthogonalize(g), RMS-normalized over the tensor; the
  # vector's Adafactor-normalized momentum (1 - b) g / sqrt((1 - b) g^2) is sign(g) up to a constant. The other two
  # hidden units add output weights ~N(0, 1e-4 / 4): a few percent of the step.
  want = np.asarray(orthogonalize(g["w"]), np.float64)
  want *= lopt.step_mult / np.sqrt(np.mean(np.square(want)))
  np.testing.assert_allclose(step["w"], want, rtol=0, atol=0.1 * lopt.step_mult)
  np.testing.assert_allclose(step["b"], lopt.step_mult * np.sign(np.asarray(g["b"])), rtol=0,
                             atol=0.1 * lopt.step_mult)
  # The feature is only in the orthogonal variant: the default takes a different first step on the matrix.
  plain = AdafacMLPLOpt()
  other = _run(plain.opt_fn(plain.init(jax.random.key(0))), params, [g])
  assert not np.allclose(np.asarray(params["w"] - other.params["w"]), step["w"], rtol=0, atol=0.2 * lopt.step_mult)


def test_rnn_mlp_lopt_context_reaches_the_steps():
  lopt = RNNMLPLOpt()
  theta = lopt.init(jax.random.key(0))
  params, grads = _params(), _grads(3)
  state = _run(lopt.opt_fn(theta), params, grads)
  assert state.opt_state["h"].shape == (3, lopt.lstm_hidden) and float(jnp.max(jnp.abs(state.opt_state["h"]))) > 0
  changed = dict(theta, context=jax.tree.map(lambda x: x + 0.5, theta["context"]))
  other = _run(lopt.opt_fn(changed), params, grads)
  assert not np.allclose(np.asarray(other.params["w"]), np.asarray(state.params["w"]), rtol=0, atol=1e-8)


def test_unit_rms_steps_follow_the_learning_rate_schedule_whatever_the_parameter_scale():
  """``unit_rms_step``: every tensor's k-th step has RMS ``schedule(k)`` exactly, for any theta (the network sets
  only the direction), and a step's direction does not depend on the scale of the tensor and its gradient."""
  schedule = optax.linear_schedule(3e-2, 1e-2, 4)
  lopt = get_learned_optimizer("adafac_muon_rms_lopt", step_mult=schedule)
  assert lopt.name == "AdafacMLPLOpt(4x4, orthogonal, unit RMS)" and lopt.time_scales == ()
  theta = _perturbed(lopt.init(jax.random.key(0)), seed=3)
  params, grads = _params(), _grads(4)
  opt = lopt.opt_fn(theta)
  state, before = opt.init(params), params
  for k, g in enumerate(grads):
    state = jax.jit(opt.update)(state, g)
    for name in ("w", "b", "s"):
      step = np.asarray(before[name], np.float64) - np.asarray(state.params[name], np.float64)
      # float32 rounding of p - step at |p| ~ 1: relative 1e-5 of a 1e-2 step.
      assert np.sqrt(np.mean(step ** 2)) == pytest.approx(float(schedule(k)), rel=1e-4), (name, k)
    before = state.params
  first = _run(opt, params, grads[:1])
  # w' = w / s with gradient s * g: the same first step (features are per-tensor RMS). Not for small gradients: the
  # slowest decay's first row/column factors, 1e-3 * mean(g^2), have an RMS^2 near the normalization's floor
  # (norm_eps = 1e-12) once |g| is below ~0.03 (documented in the module and the model card).
  for scale in (1e1, 1e3):
    scaled = _run(opt, jax.tree.map(lambda x: x / scale, params), [jax.tree.map(lambda x: x * scale, grads[0])])
    for name in ("w", "b", "s"):
      # Rounding: p' - step at |p'| ~ 1 / scale loses up to 2^-24 / scale of the step in float32.
      np.testing.assert_allclose(np.asarray(params[name] / scale - scaled.params[name]),
                                 np.asarray(params[name] - first.params[name]), rtol=1e-3, atol=1e-6 / scale)


def test_fan_in_power_scales_matrix_steps_by_their_fan_in_only():
  """``fan_in_power``: with unit-RMS steps, a matrix's step RMS is the rate times ``(base / fan_in) ** power``
  (``fan_in`` = the product of all but the last axis); vectors and scalars keep the rate, and the direction is that
  of the unscaled optimizer."""
  theta = _perturbed(get_learned_optimizer("adafac_muon_rms_lopt").init(jax.random.key(0)), seed=5)
  params = dict(_params(), k=jnp.asarray(np.random.default_rng(7).standard_normal((3, 2, 4)), jnp.float32))
  grads = [dict(g, k=0.5 * params["k"][::-1]) for g in _grads(1)]
  plain = _run(get_learned_optimizer("adafac_muon_rms_lopt", step_mult=1e-2).opt_fn(theta), params, grads)
  lopt = get_learned_optimizer("adafac_muon_rms_lopt", step_mult=1e-2, fan_in_power=0.5, base_fan_in=2)
  assert lopt.name.endswith("fan-in^-0.5 from 2)")
  scaled = _run(lopt.opt_fn(theta), params, grads)
  # w: [6, 4] has fan-in 6; k: [3, 2, 4] has fan-in 6 too (a conv kernel's H * W * C_in); b, s are not scaled.
  factors = {"w": (2 / 6) ** 0.5, "k": (2 / 6) ** 0.5, "b": 1.0, "s": 1.0}
  for name, factor in factors.items():
    moved = np.asarray(params[name], np.float64) - np.asarray(scaled.params[name], np.float64)
    moved_plain = np.asarray(params[name], np.float64) - np.asarray(plain.params[name], np.float64)
    assert np.sqrt(np.mean(moved ** 2)) == pytest.approx(1e-2 * factor, rel=1e-4), name
    # The same direction; float32 rounding of p - step at |p| ~ 1 is ~6e-8, 1e-5 of a 6e-3 step.
    np.testing.assert_allclose(moved, factor * moved_plain, rtol=1e-4, atol=1e-7)
