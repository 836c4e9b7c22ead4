"""`outer_trainers.common` of the compat layer: perturbations with known draws, `truncated_unroll` equal to
metafam's ``unroll_with_keys`` on its truncated step and to a hand loop on a user step, antithetic unrolls."""

import jax
import jax.numpy as jnp
import numpy as np

from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.outer_trainers import common, lopt_truncated_step
from metafam.compat.learned_optimization.outer_trainers import truncated_step as ts
from metafam.compat.learned_optimization.outer_trainers import truncation_schedule
from metafam.compat.learned_optimization.tasks import quadratics


def test_perturbations_known_draws():
  theta = {"a": jnp.zeros(3), "b": jnp.ones(())}
  key = jax.random.PRNGKey(4)
  eps = common.sample_perturbations(theta, key, 0.5)
  ka, kb = jax.random.split(key, 2)
  np.testing.assert_allclose(eps["a"], 0.5 * jax.random.normal(ka, (3,)), rtol=1e-6)
  np.testing.assert_allclose(eps["b"], 0.5 * jax.random.normal(kb, ()), rtol=1e-6)
  vec_eps, pos, neg = common.vector_sample_perturbations(theta, key, 0.1, 4)
  assert vec_eps["a"].shape == (4, 3)
  np.testing.assert_allclose(pos["b"] - neg["b"], 2 * vec_eps["b"], rtol=1e-5)
  np.testing.assert_allclose(pos["a"] + neg["a"], 0.0, atol=1e-7)


def test_truncated_unroll_on_metafams_step():
  step = lopt_truncated_step.VectorizedLOptTruncatedStep(
      quadratics.FixedDimQuadraticFamily(3), lopt_base.LearnableSGD(initial_lr=0.1),
      truncation_schedule.ConstantTruncationSchedule(4), num_tasks=2)
  key = jax.random.PRNGKey(0)
  theta = step.outer_init(key)
  state = step.init_step_state(theta, None, key)
  (new_state, outs), metrics = common.truncated_unroll(step, 6, False, theta, key, state, (), None)
  ref_state, ref = step.unroll_with_keys(theta, state, jax.random.split(key, 6))
  assert metrics == {} and outs.loss.shape == (6, 2)
  np.testing.assert_allclose(outs.loss, ref.loss)
  np.testing.assert_array_equal(outs.is_done[:, 0], [False, False, False, True, False, False])
  jax.tree.map(np.testing.assert_array_equal, new_state, ref_state)
  p, n, p_out, n_out, _ = common.maybe_stacked_es_unroll(step, 2, True, {"log_lr": jnp.log(jnp.full(2, 0.2))},
                                                         {"log_lr": jnp.log(jnp.full(2, 0.05))}, state, state,
                                                         key, (), None)
  assert bool(jnp.all(p_out.loss[-1] < n_out.loss[-1]))  # the larger learning rate descends faster


class _Halving(ts.TruncatedStep):
  """x <- x * theta + data, loss x."""

  def init_step_state(self, theta, outer_state, key):
    return jnp.asarray(8.0)

  def unroll_step(self, theta, state, key, data, outer_state):
    new = state * theta + data
    return new, ts.TruncatedUnrollOut(loss=new, is_done=False, task_param=None, iteration=0, mask=True)


def test_truncated_unroll_and_stacked_es_on_a_user_step():
  vec = ts.VectorizedTruncatedStep(_Halving(), 2)
  state = vec.init_step_state(jnp.asarray(0.5), None, jax.random.PRNGKey(0))
  datas = jnp.asarray([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
  (state3, outs), _ = common.truncated_unroll(vec, 3, False, jnp.asarray(0.5), jax.random.PRNGKey(1), state, datas,
                                              None)
  np.testing.assert_allclose(outs.loss, [[4.0, 5.0], [2.0, 3.5], [1.0, 2.75]])
  thetas_p, thetas_n = jnp.asarray([0.5, 0.5]), jnp.asarray([0.25, 0.25])
  stacked = common.maybe_stacked_es_unroll(vec, 3, True, thetas_p, thetas_n, state, state, jax.random.PRNGKey(1),
                                           datas, None)
  serial = common.maybe_stacked_es_unroll(vec, 3, False, thetas_p, thetas_n, state, state, jax.random.PRNGKey(1),
                                          datas, None)
  for a, b in zip(stacked[:4], serial[:4]):
    jax.tree.map(np.testing.assert_allclose, a, b)
  np.testing.assert_allclose(stacked[2].loss, outs.loss)
  np.testing.assert_allclose(stacked[3].loss[0], [2.0, 3.0])
