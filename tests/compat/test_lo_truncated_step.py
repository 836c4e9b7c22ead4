"""The reference's lower-level truncated-step calls on the compat layer: `VectorizedLOptTruncatedStep`'s
``init_step_state`` / ``unroll_step`` / ``meta_loss_batch`` / ``get_batch`` give metafam's own numbers, and
`truncated_step.VectorizedTruncatedStep` vectorizes a user-written step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.outer_trainers import lopt_truncated_step
from metafam.compat.learned_optimization.outer_trainers import truncated_step as ts
from metafam.compat.learned_optimization.outer_trainers import truncation_schedule
from metafam.compat.learned_optimization.tasks import base as tasks_base
from metafam.compat.learned_optimization.tasks import quadratics


def _step(family=None, length=4, num_tasks=3):
  family = family or quadratics.FixedDimQuadraticFamily(4)
  return lopt_truncated_step.VectorizedLOptTruncatedStep(
      family, lopt_base.LearnableSGD(initial_lr=0.1), truncation_schedule.ConstantTruncationSchedule(length),
      num_tasks=num_tasks)


def test_lo_calls_equal_metafams_calls():
  step = _step()
  key = jax.random.PRNGKey(0)
  theta = step.outer_init(key)
  lo_state = step.init_step_state(theta, None, key, False)
  mf_state = step.init_step_state(theta, key)
  jax.tree.map(np.testing.assert_array_equal, lo_state, mf_state)
  np.testing.assert_array_equal(lo_state.inner_step, [0, 0, 0])
  lo_next, out = step.unroll_step(theta, lo_state, key, step.get_batch(), None)
  mf_next, mf_out = step.unroll(theta, mf_state, key, 1)
  np.testing.assert_allclose(out.loss, mf_out.loss[0])
  jax.tree.map(np.testing.assert_array_equal, lo_next, mf_next)
  np.testing.assert_array_equal(lo_next.inner_step, [1, 1, 1])
  assert out.loss.shape == (3,) and not bool(jnp.any(out.is_done))
  jax.tree.map(np.testing.assert_array_equal, out.task_param, lo_state.cfg)


def test_meta_loss_batch_is_each_lanes_loss_at_its_params():
  step = _step()
  key = jax.random.PRNGKey(1)
  theta = step.outer_init(key)
  state = step.init_step_state(theta, None, key)
  losses = step.meta_loss_batch(theta, state, key, step.get_outer_batch(), None)
  opt = step.learned_opt.opt_fn(theta)
  for i in range(3):
    lane = jax.tree.map(lambda x: x[i], state)
    task = step.family.task_fn(lane.cfg)
    np.testing.assert_allclose(losses[i], task.loss(opt.get_params(lane.opt_state), key, ()), rtol=1e-6)


def test_get_batch_shapes_and_theta_is_vector():
  step = _step(quadratics.FixedDimQuadraticFamilyData(4), num_tasks=2)
  assert jax.tree.leaves(step.get_batch())[0].shape[0] == 2
  assert jax.tree.leaves(step.get_batch(5))[0].shape[:2] == (5, 2)
  thetas = jax.vmap(step.outer_init)(jax.random.split(jax.random.PRNGKey(0), 2))
  thetas = {"log_lr": jnp.log(jnp.asarray([0.0001, 0.5]))}
  state = step.init_step_state(thetas, None, jax.random.PRNGKey(0), True)
  state, out = step.unroll_step(thetas, state, jax.random.PRNGKey(2), step.get_batch(), None, True)
  state, out2 = step.unroll_step(thetas, state, jax.random.PRNGKey(3), step.get_batch(), None, True)
  # The tiny learning rate barely moves; the large one does (the data term is the same for both lanes' keys).
  assert abs(float(out2.loss[0] - out.loss[0])) < abs(float(out2.loss[1] - out.loss[1]))
  losses = step.meta_loss_batch(thetas, state, jax.random.PRNGKey(4), step.get_outer_batch(), None, True)
  assert losses.shape == (2,) and bool(jnp.all(jnp.isfinite(losses)))


def test_simple_vec_step_ends_trajectories_at_unroll_length():
  step = lopt_truncated_step.SimpleVecLOptTruncatedStep(quadratics.QuadraticTask(3), lopt_base.LearnableSGD(), 2,
                                                        unroll_length=3)
  key = jax.random.PRNGKey(0)
  theta = step.outer_init(key)
  state = step.init_step_state(theta, None, key)
  dones = []
  for i in range(4):
    state, out = step.unroll_step(theta, state, jax.random.fold_in(key, i), (), None)
    dones.append(bool(out.is_done[0]))
  assert dones == [False, False, True, False]


class _SGDOnQuadratic(ts.TruncatedStep):
  """A user-written step: SGD with learning rate theta on sum(p**2) from p = 1."""

  def outer_init(self, key):
    return jnp.asarray(0.25)

  def init_step_state(self, theta, outer_state, key):
    return {"p": jnp.ones(2), "i": jnp.asarray(0)}

  def unroll_step(self, theta, state, key, data, outer_state):
    loss, grad = jax.value_and_grad(lambda p: jnp.sum(p ** 2) + data)(state["p"])
    new = {"p": state["p"] - theta * grad, "i": state["i"] + 1}
    return new, ts.TruncatedUnrollOut(loss=loss, is_done=False, task_param=None, iteration=new["i"], mask=True)

  def meta_loss_batch(self, theta, state, key, data, outer_state):
    return jnp.sum(state["p"] ** 2) + data

  def get_batch(self, steps=None):
    return np.arange(steps, dtype=np.float32)

  get_outer_batch = get_batch


def test_vectorized_truncated_step_over_a_user_step():
  vec = ts.VectorizedTruncatedStep(_SGDOnQuadratic(), 3)
  theta = vec.outer_init(jax.random.PRNGKey(0))
  state = vec.init_step_state(theta, None, jax.random.PRNGKey(0))
  assert state["p"].shape == (3, 2)
  data = vec.get_batch()
  np.testing.assert_array_equal(data, [0.0, 1.0, 2.0])
  state, out = vec.unroll_step(theta, state, jax.random.PRNGKey(1), data, None)
  np.testing.assert_allclose(out.loss, [2.0, 3.0, 4.0])
  np.testing.assert_allclose(state["p"], np.full((3, 2), 0.5))  # 1 - 0.25 * 2
  np.testing.assert_allclose(vec.meta_loss_batch(theta, state, jax.random.PRNGKey(2), data, None), [0.5, 1.5, 2.5])
  assert vec.get_batch(4).shape == (4, 3)
  per_task = jnp.asarray([0.0, 0.25, 0.5])
  state = vec.init_step_state(per_task, None, jax.random.PRNGKey(0), theta_is_vector=True)
  state, _ = vec.unroll_step(per_task, state, jax.random.PRNGKey(1), data, None, theta_is_vector=True)
  np.testing.assert_allclose(state["p"][:, 0], [1.0, 0.5, 0.0])


def _estimate(estimator, theta, key):
  from metafam.compat.learned_optimization.outer_trainers import gradient_learner
  weights = gradient_learner.WorkerWeights(theta, None, gradient_learner.OuterState(0))
  state = estimator.init_worker_state(weights, key)
  out, _ = estimator.compute_gradient_estimate(weights, key, state)
  return out


def test_full_es_last_recompute_equals_last_on_data_free_tasks():
  from metafam.compat.learned_optimization.outer_trainers import full_es
  never = lopt_truncated_step.VectorizedLOptTruncatedStep(
      quadratics.FixedDimQuadraticFamily(4), lopt_base.LearnableSGD(initial_lr=0.05),
      truncation_schedule.NeverEndingTruncationSchedule(), num_tasks=3, meta_loss_split="same_batch")
  sched = truncation_schedule.ConstantTruncationSchedule(6)
  theta = never.outer_init(jax.random.PRNGKey(0))
  last = _estimate(full_es.FullES(never, sched, steps_per_jit=6, loss_type="last"), theta, jax.random.PRNGKey(3))
  recompute = _estimate(full_es.FullES(never, sched, steps_per_jit=6, loss_type="last_recompute",
                                       recompute_samples=3), theta, jax.random.PRNGKey(3))
  # Without data, the recomputed loss of the final params is the last step's meta-loss.
  np.testing.assert_allclose(recompute.mean_loss, last.mean_loss, rtol=1e-5)
  np.testing.assert_allclose(recompute.grad["log_lr"], last.grad["log_lr"], rtol=1e-4)
  with pytest.raises(ValueError):
    full_es.FullES(never, sched, loss_type="last_recompute", recompute_samples=0)


class _ShiftFamily(tasks_base.TaskFamily):
  """Tasks with loss sum(p**2) and aux "shift" = 3 + the task's sampled offset (0 or 1)."""

  def sample(self, key):
    return jax.random.bernoulli(key).astype(jnp.float32)

  def task_fn(self, cfg):
    class _Task(tasks_base.Task):
      datasets = None

      def init(self, key):
        return jnp.ones(2)

      def loss_and_aux(self, params, key, batch):
        return jnp.sum(params ** 2), {"shift": 3.0 + cfg + 0.0 * jnp.sum(params)}
    return _Task()


@pytest.mark.parametrize("loss_type", ["avg", "last_recompute"])
def test_meta_loss_with_aux_key_scores_the_aux_value(loss_type):
  from metafam.compat.learned_optimization.outer_trainers import full_es
  family = _ShiftFamily()
  step = lopt_truncated_step.VectorizedLOptTruncatedStep(
      family, lopt_base.LearnableSGD(), truncation_schedule.NeverEndingTruncationSchedule(), num_tasks=4,
      meta_loss_with_aux_key="shift")
  assert step.task_family is family
  key = jax.random.PRNGKey(0)
  theta = step.outer_init(key)
  est = full_es.FullES(step, truncation_schedule.ConstantTruncationSchedule(2), steps_per_jit=2, loss_type=loss_type,
                       recompute_samples=2)
  out = _estimate(est, theta, key)
  # The meta-loss is 3 + offset per lane, whatever the params do; the gradient is exactly zero.
  assert 3.0 <= float(out.mean_loss) <= 4.0 and float(out.mean_loss) * 4 == round(float(out.mean_loss) * 4)
  np.testing.assert_array_equal(out.grad["log_lr"], 0.0)
  # Training still follows the task's loss: the params move.
  state = step.init_step_state(theta, None, key)
  state, outs = step.unroll_step(theta, state, key, (), None)
  np.testing.assert_allclose(outs.loss, 2.0)
