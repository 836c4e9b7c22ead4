"""The learned_optimization compatibility layer used the way the reference's tests and notebooks use it:
meta-training through `VectorizedLOptTruncatedStep`, the estimators and `SingleMachineGradientLearner`."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import metafam
from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.compat.learned_optimization.optimizers import gradient_accumulator
from metafam.compat.learned_optimization.optimizers import optax_opts
from metafam.compat.learned_optimization.outer_trainers import full_es
from metafam.compat.learned_optimization.outer_trainers import gradient_learner
from metafam.compat.learned_optimization.outer_trainers import lopt_truncated_step
from metafam.compat.learned_optimization.outer_trainers import truncated_es
from metafam.compat.learned_optimization.outer_trainers import truncated_grad
from metafam.compat.learned_optimization.outer_trainers import truncated_pes
from metafam.compat.learned_optimization.outer_trainers import truncation_schedule
from metafam.compat.learned_optimization.tasks import quadratics


def _truncated_step(num_tasks=8, length=20, offset=20):
  return lopt_truncated_step.VectorizedLOptTruncatedStep(
      task_family=quadratics.FixedDimQuadraticFamily(10), learned_opt=lopt_base.LearnableSGD(initial_lr=1e-3),
      trunc_sched=truncation_schedule.ConstantTruncationSchedule(length), num_tasks=num_tasks,
      random_initial_iteration_offset=offset)


ESTIMATORS = {
    "TruncatedPES": lambda step: truncated_pes.TruncatedPES(step, trunc_length=5, std=0.01, steps_per_jit=5,
                                                            stack_antithetic_samples=False),
    "FullES": lambda step: full_es.FullES(step, std=0.01, steps_per_jit=10),
    "TruncatedGrad": lambda step: truncated_grad.TruncatedGrad(step, unroll_length=5, steps_per_jit=5),
}


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_meta_training_on_quadratics_lowers_the_meta_loss(name):
  step = _truncated_step()
  lopt = step.learned_opt
  learner = gradient_learner.SingleMachineGradientLearner(lopt, [ESTIMATORS[name](step)], optax_opts.Adam(0.1))
  state = learner.init(jax.random.PRNGKey(0))
  theta0 = learner.get_meta_params(state)
  losses = []
  key = jax.random.PRNGKey(1)
  for i in range(50):
    key, sub = jax.random.split(key)
    state, loss, metrics = learner.update(state, sub, with_metrics=(i % 10 == 0))
    losses.append(float(loss))
  assert np.all(np.isfinite(losses))
  # The learned step size grows from 1e-3 and the meta-loss (the lanes' train loss) falls.
  assert float(learner.get_meta_params(state)["log_lr"]) > float(theta0["log_lr"]) + 3.0
  assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), losses
  assert int(state.gradient_learner_state.theta_opt_state.iteration) == 50
  assert "none||mean_loss" in metrics


def test_estimators_are_metafams_engine_objects():
  step = _truncated_step()
  assert isinstance(step, metafam.TruncatedStep)
  pes = ESTIMATORS["TruncatedPES"](step)
  assert isinstance(pes, metafam.PES)
  assert type(pes).estimate_fn is metafam.PES.estimate_fn  # the estimate is metafam's code path, unchanged
  assert isinstance(pes, gradient_learner.GradientEstimator)  # and it has the reference's face
  assert (pes.unroll_length, pes.sigma, pes.num_tasks) == (5, 0.01, 8)
  assert pes.step.num_tasks == 16 and pes.step.antithetic  # N pairs on step.paired()
  assert isinstance(ESTIMATORS["FullES"](step), metafam.FullES)
  assert isinstance(ESTIMATORS["TruncatedGrad"](step), metafam.TruncatedBPTT)
  assert isinstance(truncated_es.TruncatedES(step, unroll_length=10), metafam.TruncatedES)
  learner = gradient_learner.SingleMachineGradientLearner(step.learned_opt, [pes], optax_opts.Adam(1e-2))
  assert isinstance(learner.meta_trainer, metafam.MetaTrainer)
  assert learner.meta_trainer.estimators[0] is pes
  # metafam's own optax-backed optimizers qualify too, and the reference's entry-wise clip around one (an optax.clip
  # in the trainer's chain); a wrapper with an update of its own does not.
  assert gradient_learner.SingleMachineGradientLearner(step.learned_opt, [pes], metafam.Adam(1e-2)).meta_trainer
  clipped = opt_base.GradientClipOptimizer(optax_opts.Adam(1e-2))
  assert gradient_learner.SingleMachineGradientLearner(step.learned_opt, [pes], clipped).meta_trainer
  accumulated = gradient_accumulator.GradientAccumulator(optax_opts.Adam(1e-2), 2)
  assert gradient_learner.SingleMachineGradientLearner(step.learned_opt, [pes], accumulated).meta_trainer is None


def test_update_does_not_consume_its_input_state():
  step = _truncated_step(num_tasks=2)
  pes = ESTIMATORS["TruncatedPES"](step)
  learner = gradient_learner.SingleMachineGradientLearner(step.learned_opt, [pes], optax_opts.Adam(1e-2))
  state = learner.init(jax.random.PRNGKey(0))
  new_state, _, _ = learner.update(state, jax.random.PRNGKey(1))
  # the old state is still readable (metafam's MetaTrainer donates its input; the adapter hands it copies)
  jax.tree.map(np.asarray, (state, new_state))
  again, _, _ = learner.update(state, jax.random.PRNGKey(1))
  np.testing.assert_allclose(learner.get_meta_params(again)["log_lr"], learner.get_meta_params(new_state)["log_lr"])


def test_worker_interface_and_non_optax_meta_optimizer():
  step = _truncated_step(num_tasks=2)
  pes = ESTIMATORS["TruncatedPES"](step)
  lopt = step.learned_opt
  weights = gradient_learner.WorkerWeights(theta=lopt.init(jax.random.PRNGKey(0)), theta_model_state=None,
                                           outer_state=gradient_learner.OuterState(0))
  worker_state = pes.init_worker_state(weights, jax.random.PRNGKey(1))
  out, metrics = pes.compute_gradient_estimate(weights, jax.random.PRNGKey(2), worker_state, with_summary=True)
  assert set(out.grad) == {"log_lr"} and np.isfinite(float(out.mean_loss))
  assert all("||" in k for k in metrics)
  computed = gradient_learner.gradient_worker_compute(weights, [pes], [worker_state], jax.random.PRNGKey(3),
                                                      with_metrics=True)
  assert np.isfinite(float(computed.to_put.mean_loss)) and len(computed.unroll_states) == 1

  # A meta-optimizer with an update of its own runs through the worker / learner path.
  theta_opt = gradient_accumulator.GradientAccumulator(optax_opts.Adam(0.1), 1)
  learner = gradient_learner.SingleMachineGradientLearner(lopt, [pes], theta_opt)
  assert learner.meta_trainer is None
  state = learner.init(jax.random.PRNGKey(0))
  for i in range(3):
    state, loss, _ = learner.update(state, jax.random.PRNGKey(i))
  assert np.isfinite(float(loss))
  assert float(learner.get_meta_params(state)["log_lr"]) != float(np.log(1e-3))


def test_misconfiguration_raises_value_error():
  step = _truncated_step(num_tasks=2)
  with pytest.raises(ValueError, match="multiples"):
    truncated_pes.TruncatedPES(step, trunc_length=10, steps_per_jit=3)
  with pytest.raises(ValueError, match="multiples"):
    truncated_grad.TruncatedGrad(step, unroll_length=7, steps_per_jit=5)
  with pytest.raises(ValueError, match="loss type"):
    full_es.FullES(step, loss_type="median")
  with pytest.raises(ValueError):
    truncated_pes.TruncatedPES(step, std=-1.0)
  with pytest.raises(ValueError):
    truncation_schedule.ConstantTruncationSchedule(0)
  with pytest.raises(ValueError):
    _truncated_step(offset=-1)
  with pytest.raises(ValueError, match="NeverEnding"):  # FullES decides the length: the step must never end
    full_es.FullES(step, truncation_schedule.ConstantTruncationSchedule(10))
  with pytest.raises(NotImplementedError):
    lopt_truncated_step.VectorizedLOptTruncatedStep(
        quadratics.FixedDimQuadraticFamily(4), lopt_base.LearnableSGD(),
        truncation_schedule.ScheduledTruncationSchedule(lambda i: 10 + i), num_tasks=2)


def test_truncation_schedules():
  outer = gradient_learner.OuterState(jnp.asarray(3))
  key = jax.random.PRNGKey(0)
  const = truncation_schedule.ConstantTruncationSchedule(7)
  assert int(const.next_state(const.init(key, outer), 3, key, outer)[0].length) == 7
  logu = truncation_schedule.LogUniformLengthSchedule(2, 50)
  lengths = [int(logu.init(k, outer).length) for k in jax.random.split(key, 20)]
  assert min(lengths) >= 2 and max(lengths) <= 50 and len(set(lengths)) > 1
  assert int(truncation_schedule.NeverEndingTruncationSchedule().init(key, outer).length) >= 2 ** 30
  sched = truncation_schedule.ScheduledTruncationSchedule(lambda i: 10 * (i + 1))
  assert int(sched.init(key, outer).length) == 40
  # A compat schedule drives metafam's step directly.
  step = metafam.TruncatedStep(quadratics.FixedDimQuadraticFamily(3), lopt_base.LearnableSGD(), 2, schedule=const)
  state = step.init_step_state({"log_lr": jnp.log(0.1)}, jax.random.PRNGKey(0))
  assert np.all(np.asarray(state.length) == 7)


def test_data_family_mlp_lopt_and_metafams_own_trainer():
  from metafam.compat.learned_optimization.learned_optimizers import mlp_lopt
  import optax
  lopt = mlp_lopt.MLPLOpt(hidden_size=8)
  step = lopt_truncated_step.VectorizedLOptTruncatedStep(
      quadratics.FixedDimQuadraticFamilyData(4), lopt, truncation_schedule.LogUniformLengthSchedule(5, 20),
      num_tasks=2, meta_loss_split="outer_valid", random_initial_iteration_offset=10)
  pes = truncated_pes.TruncatedPES(step, trunc_length=5, std=0.01, steps_per_jit=5)
  learner = gradient_learner.SingleMachineGradientLearner(lopt, [pes], optax_opts.Adam(1e-3))
  state = learner.init(jax.random.PRNGKey(0))
  theta0 = learner.get_meta_params(state)
  for i in range(3):
    state, loss, _ = learner.update(state, jax.random.PRNGKey(i))
    assert np.isfinite(float(loss))
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), learner.get_meta_params(state), theta0)
  assert max(jax.tree.leaves(moved)) > 0
  # The same estimator object trains in metafam's own MetaTrainer.
  trainer = metafam.MetaTrainer(lopt, [pes], optax.adam(1e-3))
  mt_state = trainer.init(jax.random.key(0))
  mt_state, metrics = trainer.step(mt_state)
  assert np.isfinite(float(metrics["meta_loss"]))


def test_a_users_own_learned_optimizer_trains():
  """A learned optimizer written against the reference's interface (namedtuple state, update with **kwargs)."""
  import collections
  State = collections.namedtuple("State", ["params", "state", "iteration", "momentum"])

  class MomentumOpt(opt_base.Optimizer):
    def __init__(self, theta):
      self.theta = theta

    def init(self, params, state=None, num_steps=None, key=None, **kwargs):
      return State(params, kwargs.get("model_state", state), jnp.asarray(0, jnp.int32),
                   jax.tree.map(jnp.zeros_like, params))

    def update(self, opt_state, grad, loss=None, model_state=None, key=None, **kwargs):
      beta = jax.nn.sigmoid(self.theta["logit_beta"])
      mom = jax.tree.map(lambda m, g: beta * m + g, opt_state.momentum, grad)
      params = jax.tree.map(lambda p, m: p - jnp.exp(self.theta["log_lr"]) * m, opt_state.params, mom)
      return State(params, model_state, opt_state.iteration + 1, mom)

  class LearnedMomentum(lopt_base.LearnedOptimizer):
    def init(self, key):
      return {"log_lr": jnp.log(1e-3), "logit_beta": jnp.asarray(0.0)}

    def opt_fn(self, theta, is_training=False):
      return MomentumOpt(theta)

  lopt = LearnedMomentum()
  step = lopt_truncated_step.VectorizedLOptTruncatedStep(
      quadratics.FixedDimQuadraticFamily(10), lopt, truncation_schedule.ConstantTruncationSchedule(20), num_tasks=4,
      random_initial_iteration_offset=20)
  learner = gradient_learner.SingleMachineGradientLearner(
      lopt, [truncated_pes.TruncatedPES(step, trunc_length=10, std=0.01)], optax_opts.Adam(0.1))
  state = learner.init(jax.random.PRNGKey(0))
  losses = []
  for i in range(20):
    state, loss, _ = learner.update(state, jax.random.PRNGKey(i))
    losses.append(float(loss))
  assert np.mean(losses[-5:]) < np.mean(losses[:5])
  assert float(learner.get_meta_params(state)["log_lr"]) > float(np.log(1e-3))


def test_compat_estimates_are_metafams_numbers():
  """The compat PES gives exactly the estimate of metafam's PES built by hand with the translated arguments."""
  step = _truncated_step(num_tasks=2)
  compat = truncated_pes.TruncatedPES(step, trunc_length=5, std=0.05, steps_per_jit=5)
  plain = metafam.PES(step, unroll_length=5, sigma=0.05, stack_antithetic=False)
  theta = step.learned_opt.init(jax.random.PRNGKey(0))
  weights = gradient_learner.WorkerWeights(theta, None, gradient_learner.OuterState(0))
  ws_compat = compat.init_worker_state(weights, jax.random.PRNGKey(1))
  ws_plain = plain.init_worker_state(theta, jax.random.PRNGKey(1))
  for i in range(2):
    out, _ = compat.compute_gradient_estimate(weights, jax.random.PRNGKey(10 + i), ws_compat)
    est, ws_plain = plain.estimate(theta, ws_plain, jax.random.PRNGKey(10 + i))
    ws_compat = out.unroll_state
    np.testing.assert_array_equal(out.grad["log_lr"], est.grad["log_lr"])
    np.testing.assert_array_equal(out.mean_loss, est.meta_loss)
  # FullES takes its trajectory length from the truncation schedule (or LO's early unroll_length).
  never = lopt_truncated_step.VectorizedLOptTruncatedStep(
      quadratics.FixedDimQuadraticFamily(4), lopt_base.LearnableSGD(),
      truncation_schedule.NeverEndingTruncationSchedule(), num_tasks=2)
  assert full_es.FullES(never, truncation_schedule.ConstantTruncationSchedule(30)).trajectory_length == 30
  assert full_es.FullES(step).trajectory_length == 20
  assert full_es.FullES(step, unroll_length=40).trajectory_length == 40


# -- a bad meta-gradient: the reference zeroes its non-finite entries and reports the loss as 20 ---------------------
_GRADS, _LOSSES = ([1.0, np.nan, 2.0], [3.0, 4.0, -np.inf]), (np.nan, 1.0)  # mean gradient [2, nan, -inf]


class _ZeroTheta:
  def init(self, key):
    return {"w": jnp.zeros(3)}


class _Fixed(metafam.GradientEstimator):
  """A metafam estimator with a fixed estimate; its worker state counts the calls."""

  def __init__(self, grad, loss):
    self.grad, self.loss = grad, loss

  def init_worker_state(self, theta, key):
    return jnp.asarray(0, jnp.int32)

  def estimate_fn(self, theta, worker_state, key):
    grad = {"w": jnp.asarray(self.grad, jnp.float32)}
    return metafam.GradientEstimate(grad, jnp.float32(self.loss), {"num_nonfinite": jnp.float32(0)}), worker_state + 1

  @property
  def inner_steps_per_estimate(self):
    return 1


class _ForkFixed(gradient_learner.GradientEstimator):
  """The same estimate from a fork's estimator (the reference's interface only)."""

  def __init__(self, grad, loss):
    self.grad, self.loss = grad, loss

  def init_worker_state(self, worker_weights, key):
    return jnp.asarray(0, jnp.int32)

  def compute_gradient_estimate(self, worker_weights, key, state, with_summary=False):
    out = gradient_learner.GradientEstimatorOut(mean_loss=jnp.float32(self.loss), unroll_state=state + 1,
                                                grad={"w": jnp.asarray(self.grad, jnp.float32)})
    return out, {}


@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("path", ["meta_trainer", "workers"])
def test_a_nonfinite_meta_gradient_is_zeroed_and_its_loss_reported_as_20(path, clip):
  make = _Fixed if path == "meta_trainer" else _ForkFixed
  theta_opt = optax_opts.Adam(0.1)
  if clip is not None:
    theta_opt = opt_base.GradientClipOptimizer(theta_opt, grad_clip=clip)
  learner = gradient_learner.SingleMachineGradientLearner(_ZeroTheta(), [make(g, l) for g, l in zip(_GRADS, _LOSSES)],
                                                          theta_opt)
  assert (learner.meta_trainer is not None) == (path == "meta_trainer")
  state, loss, metrics = learner.update(learner.init(jax.random.PRNGKey(0)), jax.random.PRNGKey(1))
  # As the reference: the mean gradient's NaN / -inf entries become 0 -> [2, 0, 0] (clipped to 1: [1, 0, 0]) and the
  # update is applied although a meta-loss is NaN; Adam's first step is -lr * g / (|g| + eps) and mu = 0.1 g. The
  # mean meta-loss, NaN, is reported as 20.
  assert float(loss) == 20.0 and float(metrics["none||mean_loss"]) == 20.0
  np.testing.assert_allclose(learner.get_meta_params(state)["w"], [-0.1, 0.0, 0.0], rtol=1e-4)
  opt_state = state.gradient_learner_state.theta_opt_state
  mu = optax.tree_utils.tree_get(opt_state.optax_opt_state, "mu")
  np.testing.assert_allclose(mu["w"], [0.1 * (clip or 2.0), 0.0, 0.0], rtol=1e-6)
  assert int(opt_state.iteration) == 1 and [int(s) for s in state.gradient_estimator_states] == [1, 1]


def test_worker_compute_reports_a_nonfinite_loss_as_lo_does():
  weights = gradient_learner.WorkerWeights(theta={"w": jnp.zeros(3)}, theta_model_state=None,
                                           outer_state=gradient_learner.OuterState(0))
  estimators = [_ForkFixed(g, l) for g, l in zip(_GRADS, _LOSSES)]
  states = [jnp.asarray(0, jnp.int32)] * 2
  for clip, expected in [(20.0, 20.0), (7.5, 7.5), (None, np.nan), (0.0, np.nan)]:  # the reference tests it for truth
    out = gradient_learner.gradient_worker_compute(weights, estimators, states, jax.random.PRNGKey(0),
                                                   clip_nan_loss_to_value=clip)
    np.testing.assert_array_equal(out.to_put.mean_loss, expected)
    np.testing.assert_array_equal(out.to_put.theta_grads["w"], [2.0, 0.0, 0.0])
