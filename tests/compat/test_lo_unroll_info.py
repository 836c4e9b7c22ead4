"""Estimator outputs with `unroll_info` (issue 26): the compat estimators fill the reference's `UnrollInfo` from the
per-step outputs of metafam's own estimate (``with_unroll_info=True``), and the default estimate is unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.outer_trainers import (full_es, full_grad, gradient_learner,
                                                                lopt_truncated_step, truncated_es, truncated_grad,
                                                                truncated_pes, truncation_schedule)
from metafam.compat.learned_optimization.outer_trainers import _adapter
from metafam.compat.learned_optimization.tasks import quadratics
from metafam.inner import pairs
from metafam.outer_trainers import GradientEstimator, PES

DIM, LENGTH = 3, 4


def _step(num_tasks=2, length=LENGTH, offset=0, sched=None, **kwargs):
  sched = sched or truncation_schedule.ConstantTruncationSchedule(length)
  return lopt_truncated_step.VectorizedLOptTruncatedStep(
      task_family=quadratics.FixedDimQuadraticFamily(DIM), learned_opt=lopt_base.LearnableSGD(initial_lr=0.05),
      trunc_sched=sched, num_tasks=num_tasks, random_initial_iteration_offset=offset, **kwargs)


def _weights(theta, outer_iteration=3):
  return gradient_learner.WorkerWeights(theta, None, gradient_learner.OuterState(jnp.asarray(outer_iteration)))


def _check_lo_shapes(info, steps, lanes):
  if isinstance(info, _adapter.LazyUnrollInfo):  # computed when read: see the next test
    info = info.value()
  assert isinstance(info, gradient_learner.UnrollInfo)
  assert info.loss.shape == info.iteration.shape == info.is_done.shape == (steps, lanes)
  assert info.is_done.dtype == jnp.bool_ and jnp.issubdtype(info.iteration.dtype, jnp.integer)
  assert info.task_param.shape == (steps, lanes, DIM)  # the family's config: the quadratic's target


def test_truncated_grad_unroll_info_is_the_unroll_of_its_lanes_with_resets_where_the_schedule_says():
  step = _step(num_tasks=2)
  est = truncated_grad.TruncatedGrad(step, unroll_length=10, steps_per_jit=5)
  theta = step.learned_opt.init(jax.random.PRNGKey(0))
  weights = _weights(theta)
  state = est.init_worker_state(weights, jax.random.PRNGKey(1))
  key = jax.random.PRNGKey(2)
  out, _ = est.compute_gradient_estimate(weights, key, state)
  info = out.unroll_info
  _check_lo_shapes(info, 10, 2)
  # Trajectories of 4 steps from iteration 0: the reference's iteration (inner step after the step) is 1..4 and
  # is_done marks every 4th step; the step after it trains a new instance (a new target).
  np.testing.assert_array_equal(info.iteration[:, 0], [1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
  np.testing.assert_array_equal(info.is_done, info.iteration == LENGTH)
  np.testing.assert_array_equal(np.where(info.is_done[:, 0])[0], [3, 7])
  target = np.asarray(info.task_param)
  np.testing.assert_array_equal(target[0], np.asarray(state.cfg))  # the lanes' own configs first
  assert np.all(target[:4] == target[0]) and np.all(target[4:8] == target[4]) and not np.allclose(target[3], target[4])
  # The losses are those of the estimator's unroll done directly with the same keys (one key per step, split from
  # the estimate's key): equal up to float rounding, as the estimate differentiates that unroll in one program
  # that XLA fuses differently from the forward-only one.
  new_lanes, direct = step.unroll_with_keys(theta, state, jax.random.split(key, 10))
  np.testing.assert_allclose(info.loss, direct.normalized_meta_loss, rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(info.iteration, direct.iteration + 1)
  # The next estimate continues the trajectories: the resets come at global steps 11, 15, 19.
  out2, _ = est.compute_gradient_estimate(weights, jax.random.PRNGKey(3), out.unroll_state)
  np.testing.assert_array_equal(np.where(out2.unroll_info.is_done[:, 1])[0], [1, 5, 9])
  np.testing.assert_array_equal(out2.unroll_info.task_param[0], target[-1])


def test_compute_gradient_estimate_runs_the_unroll_info_program_only_when_unroll_info_is_read(monkeypatch):
  step = _step(num_tasks=2)
  est = truncated_pes.TruncatedPES(step, trunc_length=4, std=0.1, steps_per_jit=4)
  theta = step.learned_opt.init(jax.random.PRNGKey(0))
  weights = _weights(theta)
  ws = est.init_worker_state(weights, jax.random.PRNGKey(1))
  calls = []
  estimate = est.estimate

  def spy(*args, **kwargs):
    calls.append(kwargs.get("with_unroll_info", False))
    return estimate(*args, **kwargs)

  monkeypatch.setattr(est, "estimate", spy)
  out, _ = est.compute_gradient_estimate(weights, jax.random.PRNGKey(2), ws)
  assert calls == [False] and out.unroll_info  # nothing more runs until a field is read
  loss = out.unroll_info.loss
  assert calls == [False, True] and out.unroll_info.loss is loss  # computed once, then cached
  is_done = out.unroll_info.is_done
  direct, _ = estimate(theta, ws, jax.random.PRNGKey(2), with_unroll_info=True)
  np.testing.assert_array_equal(is_done, _adapter.lo_unroll_info(direct.unroll_info).is_done)
  np.testing.assert_allclose(loss, _adapter.lo_unroll_info(direct.unroll_info).loss, rtol=1e-6)
  assert calls == [False, True]


def test_pes_unroll_info_reports_the_positive_particles_of_staggered_pairs():
  step = _step(num_tasks=2, offset=LENGTH)  # staggered starts
  est = truncated_pes.TruncatedPES(step, trunc_length=6, std=0.1, steps_per_jit=3)
  theta = step.learned_opt.init(jax.random.PRNGKey(0))
  weights = _weights(theta)
  ws = est.init_worker_state(weights, jax.random.PRNGKey(1))
  key = jax.random.PRNGKey(4)
  out, metrics = est.compute_gradient_estimate(weights, key, ws)
  info = out.unroll_info
  _check_lo_shapes(info, 6, 2)  # [steps, pairs]: one lane per pair
  # The same estimate as the default (separately compiled) program, up to float rounding.
  plain, _ = est.estimate(theta, ws, key)
  assert plain.unroll_info is None
  np.testing.assert_allclose(out.mean_loss, plain.meta_loss, rtol=1e-6)
  np.testing.assert_allclose(out.grad["log_lr"], plain.grad["log_lr"], rtol=1e-5, atol=1e-9)
  # Reset where each lane's trajectory reaches the schedule's length, wherever the lane started.
  np.testing.assert_array_equal(info.is_done, info.iteration == LENGTH)
  after = np.asarray(info.iteration[1:])[np.asarray(info.is_done[:-1])]
  assert after.size and np.all(after == 1)
  # The losses of the positive particles (theta + eps, lane 2i) of the estimator's unroll done directly with the
  # same perturbations and keys (a fresh worker state draws new noise); not the negative particles'.
  k_eps, k_unroll = jax.random.split(key)
  thetas = pairs.antithetic_thetas(theta, est._sample_eps(theta, k_eps))
  _, direct = est.step.unroll_with_keys(thetas, ws.lanes, jax.random.split(k_unroll, 6), theta_is_batched=True)
  pos, neg = pairs.halves(direct.normalized_meta_loss, 1)
  np.testing.assert_allclose(info.loss, pos, rtol=1e-6, atol=1e-7)
  assert not np.allclose(info.loss, neg)
  np.testing.assert_array_equal(info.task_param[0], pairs.first_half(ws.lanes.cfg))  # the pairs' own targets
  if len(jax.devices()) >= 2:  # the multi-device variant: lanes split over 2 devices, the same unroll_info
    pmap = truncated_pes.TruncatedPESPMAP(_step(num_tasks=2, offset=LENGTH, devices=2), trunc_length=6, std=0.1,
                                          steps_per_jit=3, num_devices=2)
    spread = pmap.compute_gradient_estimate(weights, key, pmap.init_worker_state(weights, jax.random.PRNGKey(1)))
    for field in ("loss", "iteration", "task_param", "is_done"):
      np.testing.assert_allclose(getattr(spread[0].unroll_info, field), getattr(info, field), rtol=1e-6)


def test_truncated_es_and_full_es_fill_unroll_info_and_worker_compute_records_an_event():
  step = _step(num_tasks=2)
  tes = truncated_es.TruncatedES(step, unroll_length=6, steps_per_jit=3, std=0.1)
  fes = full_es.FullES(_step(num_tasks=2, sched=truncation_schedule.NeverEndingTruncationSchedule()),
                       truncation_schedule=truncation_schedule.ConstantTruncationSchedule(5), std=0.1,
                       steps_per_jit=5)
  theta = step.learned_opt.init(jax.random.PRNGKey(0))
  weights = _weights(theta, outer_iteration=7)
  states = [tes.init_worker_state(weights, jax.random.PRNGKey(1)), fes.init_worker_state(weights, None)]
  key = jax.random.PRNGKey(5)
  result = gradient_learner.gradient_worker_compute(weights, [tes, fes], states, key)
  assert len(result.event_info) == 2
  for (est, state, steps), event in zip([(tes, states[0], 6), (fes, states[1], 5)], result.event_info):
    key, sub = jax.random.split(key)  # the key gradient_worker_compute hands this estimator
    info = est.compute_gradient_estimate(weights, sub, state)[0].unroll_info
    _check_lo_shapes(info, steps, 2)
    # The event is one step of that unroll_info: its per-lane losses, its targets and its iteration.
    (row,) = [i for i in range(steps) if np.array_equal(info.loss[i], event["loss"])]
    np.testing.assert_array_equal(event["task_param"], info.task_param[row])
    assert int(event["iteration"][0]) == int(info.iteration[row, 0]) and int(event["outer_iteration"]) == 7
  # FullES: complete trajectories of 5 steps from fresh instances, on a step whose schedule never ends: no step is
  # done (the reference's NeverEndingTruncationSchedule reports is_done False as well).
  np.testing.assert_array_equal(info.iteration, np.tile(np.arange(1, 6)[:, None], (1, 2)))
  assert not np.any(info.is_done)


def test_default_estimate_program_has_no_unroll_outputs_and_the_option_is_checked():
  step = _step(num_tasks=2)
  est = PES(step, unroll_length=4, sigma=0.1)
  theta = step.learned_opt.init(jax.random.PRNGKey(0))
  ws = est.init_worker_state(theta, jax.random.PRNGKey(1))
  key = jax.random.PRNGKey(2)
  default = jax.jit(type(est)._placed_estimate_fn).lower(est, theta, ws, key)  # what estimate() compiles
  # MetaTrainer's call (the protocol's three arguments) traces the same program as the default estimate.
  protocol = jax.jit(lambda e, t, w, k: e.estimate_fn(t, w, k)).lower(est, theta, ws, key)
  body = lambda lowered: lowered.as_text().split("\n", 1)[1]  # the text after the module's name
  assert body(default) == body(protocol)
  with_info = jax.jit(type(est)._placed_estimate_fn_with_info).lower(est, theta, ws, key)
  assert jax.tree.leaves(default.out_info[0].unroll_info) == []
  assert len(jax.tree.leaves(with_info.out_info)) == len(jax.tree.leaves(default.out_info)) + 10  # + nonfinite
  extra = default.compile().memory_analysis(), with_info.compile().memory_analysis()
  assert extra[0].output_size_in_bytes < extra[1].output_size_in_bytes
  # Bad input names the argument; estimators that do not report unroll outputs say so.
  with pytest.raises(TypeError, match="with_unroll_info"):
    est.estimate(theta, ws, key, with_unroll_info="yes")

  class Mine(GradientEstimator):
    def init_worker_state(self, theta, key):
      return {}

    def estimate_fn(self, theta, worker_state, key):
      raise AssertionError("not reached")

  with pytest.raises(NotImplementedError, match="with_unroll_info=True: Mine"):
    Mine().estimate(theta, {}, key, with_unroll_info=True)
  assert not full_grad.FullGrad.reports_unroll_info  # the reference's FullGrad reports None as well
