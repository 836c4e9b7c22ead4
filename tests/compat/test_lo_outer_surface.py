"""The outer-trainer surface research code imports: duck-typed worker weights (a forked namedtuple), the per-lane
functional API of `lopt_truncated_step`, `FullGrad`, the multi-device estimators' checks, estimator names, and
`opt_from_checkpoint`."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.compat.learned_optimization import checkpoints
from metafam.compat.learned_optimization.learned_optimizers import adafac_nominal, opt_from_checkpoint
from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.optimizers import optax_opts
from metafam.compat.learned_optimization.outer_trainers import full_es, full_grad, gradient_learner
from metafam.compat.learned_optimization.outer_trainers import lopt_truncated_step as lts
from metafam.compat.learned_optimization.outer_trainers import truncated_pes, truncation_schedule
from metafam.compat.learned_optimization.tasks import base as tasks_base
from metafam.compat.learned_optimization.tasks import quadratics

# A fork's own copies of LO's namedtuples (the fields are LO's; the classes are not the compat layer's).
ForkWorkerWeights = collections.namedtuple("ForkWorkerWeights", ["theta", "theta_model_state", "outer_state"])
ForkOuterState = collections.namedtuple("ForkOuterState", ["outer_iteration"])


def _step(num_tasks=4, length=10, sched=None):
  return lts.VectorizedLOptTruncatedStep(
      task_family=quadratics.FixedDimQuadraticFamily(4), learned_opt=lopt_base.LearnableSGD(initial_lr=0.05),
      trunc_sched=sched or truncation_schedule.ConstantTruncationSchedule(length), num_tasks=num_tasks)


def test_estimators_and_worker_compute_accept_a_forked_worker_weights_namedtuple():
  step = _step()
  estimator = truncated_pes.TruncatedPES(step, trunc_length=5, std=0.01, steps_per_jit=5)
  theta = step.learned_opt.init(jax.random.PRNGKey(0))
  weights = ForkWorkerWeights(theta=theta, theta_model_state=None, outer_state=ForkOuterState(jnp.asarray(0)))
  state = estimator.init_worker_state(weights, jax.random.PRNGKey(1))
  out = gradient_learner.gradient_worker_compute(weights, [estimator], [state], jax.random.PRNGKey(2),
                                                 with_metrics=True)
  # The estimate is the same as with the compat layer's own WorkerWeights and the same keys.
  own = gradient_learner.WorkerWeights(theta, None, gradient_learner.OuterState(jnp.asarray(0)))
  ref = gradient_learner.gradient_worker_compute(own, [estimator], [estimator.init_worker_state(
      own, jax.random.PRNGKey(1))], jax.random.PRNGKey(2), with_metrics=True)
  np.testing.assert_allclose(out.to_put.theta_grads["log_lr"], ref.to_put.theta_grads["log_lr"], rtol=1e-6)
  assert np.isfinite(float(out.to_put.mean_loss))
  with pytest.raises(TypeError, match="theta, theta_model_state and outer_state"):
    gradient_learner.gradient_worker_compute({"theta": theta}, [estimator], [state], jax.random.PRNGKey(2))


def test_worker_compute_records_an_event_from_a_forked_estimators_unroll_info():
  ForkOut = collections.namedtuple("ForkOut", ["mean_loss", "grad", "unroll_state", "unroll_info"])
  ForkInfo = collections.namedtuple("ForkInfo", ["loss", "iteration", "task_param", "is_done"])

  class ForkEstimator:  # a user's own estimator: only LO's worker method, no base class
    def compute_gradient_estimate(self, worker_weights, key, state, with_summary=False):
      info = ForkInfo(loss=jnp.arange(6.0).reshape(3, 2), iteration=jnp.arange(3), task_param=None,
                      is_done=jnp.zeros((3, 2), bool))
      return ForkOut(jnp.asarray(1.0), {"w": worker_weights.theta["w"] * 2}, state, info), {}

  weights = ForkWorkerWeights({"w": jnp.ones(2)}, None, ForkOuterState(5))
  out = gradient_learner.gradient_worker_compute(weights, [ForkEstimator()], [None], jax.random.PRNGKey(0))
  np.testing.assert_allclose(out.to_put.theta_grads["w"], [2.0, 2.0])
  (event,) = out.event_info
  step = int(event["iteration"])  # the drawn step's losses are that row
  np.testing.assert_allclose(event["loss"], [2.0 * step, 2.0 * step + 1])
  assert event["outer_iteration"] == 5


def test_gradient_learner_takes_a_forked_aggregated_gradient():
  ForkAggregated = collections.namedtuple("ForkAggregated", ["theta_grads", "theta_model_state", "mean_loss"])
  learner = gradient_learner.GradientLearner(lopt_base.LearnableSGD(initial_lr=0.1), optax_opts.SGD(0.5))
  state = learner.init(jax.random.PRNGKey(0))
  theta0 = learner.get_meta_params(state)
  grads = [ForkAggregated({"log_lr": jnp.asarray(1.0)}, None, jnp.asarray(2.0)),
           ForkAggregated({"log_lr": jnp.asarray(3.0)}, None, jnp.asarray(4.0))]
  state, metrics = learner.update(state, grads)
  # SGD(0.5) on the mean gradient 2.0; the reported loss is the mean of the two.
  np.testing.assert_allclose(learner.get_meta_params(state)["log_lr"], theta0["log_lr"] - 0.5 * 2.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["none||mean_loss"], 3.0)


def test_estimators_report_task_and_cfg_names():
  step = _step()
  estimator = truncated_pes.TruncatedPES(step, trunc_length=5, steps_per_jit=5)
  assert estimator.task_name() == step.task_name()
  assert estimator.cfg_name() == step.cfg_name()


def test_per_lane_functions_take_one_sgd_step_by_hand():
  family = tasks_base.single_task_to_family(quadratics.QuadraticTask(3))
  lopt = lopt_base.LearnableSGD(initial_lr=0.1)
  sched = truncation_schedule.ConstantTruncationSchedule(2)
  theta = lopt.init(jax.random.PRNGKey(0))
  keys = jax.random.split(jax.random.PRNGKey(1), 2)
  states = lts.init_truncation_state(family, lopt, sched, theta, None, keys)
  assert isinstance(states, lts.TruncatedUnrollState) and states.inner_step.shape == (2,)
  p0 = np.asarray(states.inner_opt_state.params)
  datas = jnp.zeros((2, 1))
  states, out = lts.truncated_unroll_one_step(family, lopt, sched, theta, keys, states, datas, None, None, None)
  # loss sum(p^2) and its gradient 2p: SGD gives p (1 - 2 lr); the reported loss is at p0.
  np.testing.assert_allclose(states.inner_opt_state.params, p0 * (1 - 2 * 0.1), rtol=1e-6)
  np.testing.assert_allclose(out.loss, np.sum(p0 ** 2, axis=1), rtol=1e-6)
  np.testing.assert_array_equal(out.mask, [True, True])
  states, out = lts.truncated_unroll_one_step(family, lopt, sched, theta, keys, states, datas, None, None, None)
  np.testing.assert_array_equal(out.is_done, [True, True])  # 2 steps of a length-2 trajectory
  states, out = lts.truncated_unroll_one_step(family, lopt, sched, theta, keys, states, datas, None, None, None)
  np.testing.assert_array_equal(out.mask, [False, False])  # the reset step
  np.testing.assert_array_equal(states.inner_step, [0, 0])
  loss, _ = lts.vectorized_loss_and_aux(family, lopt, theta, states.inner_opt_state, states.task_param,
                                        keys, datas)
  np.testing.assert_allclose(loss, np.sum(np.asarray(states.inner_opt_state.params) ** 2, axis=1), rtol=1e-6)


def test_full_grad_is_the_gradient_of_its_trajectory_loss():
  step = _step(num_tasks=2, sched=truncation_schedule.NeverEndingTruncationSchedule())
  estimator = full_grad.FullGrad(step, truncation_schedule.ConstantTruncationSchedule(6))
  theta = {"log_lr": jnp.asarray(np.log(0.05), jnp.float32)}
  key = jax.random.PRNGKey(3)
  state = estimator.init_worker_state(theta, key)
  estimate, _ = estimator.estimate(theta, state, key)

  def loss_at(log_lr):
    return float(estimator.estimate({"log_lr": jnp.asarray(log_lr, jnp.float32)}, state, key)[0].meta_loss)

  h = 1e-2  # central difference; the loss is smooth in log_lr, float32 noise ~1e-6 relative
  fd = (loss_at(np.log(0.05) + h) - loss_at(np.log(0.05) - h)) / (2 * h)
  np.testing.assert_allclose(float(estimate.grad["log_lr"]), fd, rtol=2e-2)
  assert float(estimate.grad["log_lr"]) < 0  # a larger step size lowers the quadratic's loss here
  with pytest.raises(ValueError, match="NeverEndingTruncationSchedule"):
    full_grad.FullGrad(_step(), truncation_schedule.ConstantTruncationSchedule(6))


def test_multi_device_estimators_check_the_step_placement():
  step = _step(sched=truncation_schedule.NeverEndingTruncationSchedule())
  est = full_es.PMAPFullES(step, truncation_schedule.ConstantTruncationSchedule(10), steps_per_jit=10)
  assert est.num_devices == 1
  with pytest.raises(ValueError, match="num_devices=2"):
    full_es.PMAPFullES(step, truncation_schedule.ConstantTruncationSchedule(10), steps_per_jit=10, num_devices=2)
  with pytest.raises(NotImplementedError, match="replicate_data_across_devices"):
    truncated_pes.TruncatedPESPMAP(_step(), 5, steps_per_jit=5, replicate_data_across_devices=True)
  k1, k2 = full_es.vec_key_split(jax.random.split(jax.random.PRNGKey(0), 3))
  assert k1.shape == k2.shape == (3, 2)


def test_opt_from_checkpoint_loads_theta(tmp_path):
  lopt = lopt_base.LearnableSGD(initial_lr=0.1)
  theta = {"log_lr": jnp.asarray(np.log(0.25), jnp.float32)}
  path = str(tmp_path / "params")
  checkpoints.save_state(path, gradient_learner.ParameterCheckpoint(theta, "gen", 7))
  opt = opt_from_checkpoint.opt_from_checkpoint(path, learned_opt=lopt)
  state = opt.update(opt.init({"w": jnp.ones(2)}), {"w": jnp.ones(2)}, loss=jnp.asarray(0.0))
  np.testing.assert_allclose(opt.get_params(state)["w"], 1 - 0.25, rtol=1e-6)
  with pytest.raises(NotImplementedError, match="gin"):
    opt_from_checkpoint.opt_from_checkpoint(path, config_path="x.gin", learned_opt=lopt)
  with pytest.raises(ValueError, match="learned_opt"):
    opt_from_checkpoint.opt_from_checkpoint(path)


def test_unmodelled_reference_options_are_rejected_by_name():
  with pytest.raises(NotImplementedError, match="weight_decay"):
    adafac_nominal.MLPNomLOpt(weight_decay=0.1)
