"""The estimator protocol: an estimator written by a user against the public protocol meets the registered
estimators' contract (it runs through `MetaTrainer` for a few meta-steps with a checkpoint, and a run resumed from the
checkpoint ends bit-identical to an uninterrupted one), and the protocol's checks, the paired step and the device data.

Every registered estimator meets that contract and, built on a step the test constructs itself (the injected-step
API), equals `make_estimator`'s: the conformance table, tests/test_conformance.py (row ESTIMATORS).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.optimizers.learned import LearnableSGD
from metafam.optimizers.mlp_lopt import MLPLOpt
from metafam.outer_trainers import GradientEstimate, GradientEstimator, MetaTrainer, get_estimator, make_estimator
from test_conformance import ESTIMATOR_FAMILY as FAMILY, check_meta_trains_checkpoints_and_resumes
from test_conformance import meta_trainer as _trainer


class FiniteDifferenceSGD(GradientEstimator):
  """A user's estimator written against the public protocol only: central finite differences of the mean loss of
  fresh lanes of its own `TruncatedStep`, along each coordinate of theta (LearnableSGD has one, ``log_lr``). Its step
  is declared a data field, so the step's device data are inputs of the jitted programs."""

  name = "finite_difference"
  _data_fields = ("step",)

  def __init__(self, step, num_steps=4, h=1e-3):
    self.step, self.num_steps, self.h = step, num_steps, h

  @property
  def inner_steps_per_estimate(self):
    return 2 * self.step.num_tasks * self.num_steps

  def init_worker_state(self, theta, key):
    return {"count": jnp.zeros((), jnp.int32)}

  def estimate_fn(self, theta, worker_state, key):
    def loss(th):
      lanes = self.step.init_fn(th, key)
      _, out = self.step.unroll_fn(th, lanes, jax.random.split(key, self.num_steps))
      return jnp.mean(out.meta_loss)

    shift = lambda s: jax.tree.map(lambda t: t + s, theta)
    grad = jax.tree.map(lambda _: (loss(shift(self.h)) - loss(shift(-self.h))) / (2 * self.h), theta)
    metrics = {"num_nonfinite": jnp.zeros((), jnp.float32)}
    return GradientEstimate(grad, loss(theta), metrics), {"count": worker_state["count"] + 1}


def _user_estimator(lopt):
  return FiniteDifferenceSGD(TruncatedStep(FAMILY, lopt, 4, ConstantSchedule(6), meta_loss_split="outer_valid"))


def test_a_users_estimator_meta_trains_checkpoints_and_resumes(tmp_path):
  lopt = LearnableSGD(0.01)
  check_meta_trains_checkpoints_and_resumes(lambda: _user_estimator(lopt), lopt, str(tmp_path))


def test_the_protocol_is_enforced():
  class Incomplete(GradientEstimator):
    def init_worker_state(self, theta, key):
      return {}

  with pytest.raises(TypeError, match="estimate_fn"):
    Incomplete()
  with pytest.raises(TypeError, match="not a GradientEstimator"):
    MetaTrainer(LearnableSGD(), [object()], optax.sgd(0.1))
  with pytest.raises(TypeError, match="needs a metafam.inner.TruncatedStep"):
    get_estimator("pes")(FAMILY)
  with pytest.raises(KeyError, match="valid names: full_es, nres, pes, tbptt, truncated_es"):
    get_estimator("es")


def test_paired_step_layout():
  lopt = LearnableSGD(0.01)
  step = TruncatedStep(FAMILY, lopt, 3, ConstantSchedule(4))
  paired = step.paired()
  assert paired.num_tasks == 6 and paired.antithetic and paired.schedule is step.schedule
  lanes = paired.init_step_state(lopt.init(None), jax.random.key(0))
  # Lanes 2i and 2i + 1 are the same task instance (metafam.inner.pairs), and pairs are different instances.
  for leaf in jax.tree.leaves(lanes.cfg):
    np.testing.assert_array_equal(np.asarray(leaf[0::2]), np.asarray(leaf[1::2]))
  assert any(not np.array_equal(np.asarray(leaf[0]), np.asarray(leaf[2])) for leaf in jax.tree.leaves(lanes.opt_state))
  with pytest.raises(ValueError, match="paired"):
    paired.paired()
  with pytest.raises(TypeError, match="unknown arguments"):
    step.replace(num_pairs=2)  # not an argument: the count is num_tasks


def test_initial_theta_is_the_theta_init_starts_from():
  lopt = MLPLOpt()  # random initial weights: theta depends on the key
  trainer = _trainer(_user_estimator(lopt), lopt)
  thetas = [trainer.initial_theta(jax.random.key(9)), trainer.init(jax.random.key(9)).theta,
            trainer.initial_theta(jax.random.key(10))]
  for a, b, c in zip(*map(jax.tree.leaves, thetas)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(not np.array_equal(np.asarray(a), np.asarray(c)) for a, c in zip(*map(jax.tree.leaves, thetas[::2])))


def test_device_data_are_program_inputs_not_constants():
  """The engine objects are pytrees of their device data, so their jitted programs take the data as arguments."""
  from metafam.taskfamilies import get_family
  family = get_family("fmnist_mlp_family_8x8_32")
  lopt = LearnableSGD(0.01)
  est = make_estimator("pes", family, lopt, num_tasks=2, unroll_length=2, schedule=ConstantSchedule(4))
  trainer = MetaTrainer(lopt, [est], optax.sgd(0.1))
  data_leaves = jax.tree.leaves(est.step.data)
  assert data_leaves and len(jax.tree.leaves(trainer)) == len(data_leaves)
  images = max(data_leaves, key=lambda x: x.size)
  state = trainer.init(jax.random.key(0))
  lowered = trainer._step.lower(trainer, state)
  input_shapes = [tuple(a.shape) for a in jax.tree.leaves(lowered.in_avals)]
  assert tuple(images.shape) in input_shapes
  assert images.size > 10_000  # so a baked-in constant would show in the program text as a huge literal
  assert len(lowered.as_text()) < images.size
