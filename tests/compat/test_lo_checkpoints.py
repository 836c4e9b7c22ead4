"""`checkpoints.save_state` / `load_state` and `GradientLearner`'s init-from-path options of the compat layer."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.compat.learned_optimization import checkpoints
from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.optimizers import optax_opts
from metafam.compat.learned_optimization.outer_trainers import gradient_learner as gl
from metafam.runs.checkpoint import CheckpointError


def test_plain_tree_round_trip_and_mismatch(tmp_path):
  tree = {"w": jnp.arange(3.0), "n": jnp.asarray(4, jnp.int32)}
  path = os.path.join(tmp_path, "sub", "state.ckpt")
  checkpoints.save_state(path, tree)
  back = checkpoints.load_state(path, jax.tree.map(jnp.zeros_like, tree))
  np.testing.assert_array_equal(back["w"], [0.0, 1.0, 2.0])
  assert int(back["n"]) == 4
  with pytest.raises(CheckpointError):
    checkpoints.load_state(path, {"w": jnp.zeros(4), "n": jnp.zeros((), jnp.int32)})


def test_parameter_checkpoint_initializes_theta(tmp_path):
  lopt, theta_opt = lopt_base.LearnableSGD(1.0), optax_opts.SGD(3.0)
  theta = jax.tree.map(lambda x: x + 2.5, lopt.init(jax.random.PRNGKey(0)))
  path = os.path.join(tmp_path, "theta.param")
  checkpoints.save_state(path, gl.ParameterCheckpoint(params=theta, gen_id="run7", step=42))
  restored = checkpoints.load_state(path, gl.ParameterCheckpoint(lopt.init(jax.random.PRNGKey(0)), "", 0))
  assert restored.gen_id == "run7" and restored.step == 42
  learner = gl.GradientLearner(lopt, theta_opt, init_theta_from_path=path)
  state = learner.init(jax.random.PRNGKey(1))
  np.testing.assert_allclose(learner.get_meta_params(state)["log_lr"], 2.5)
  assert int(state.theta_opt_state.iteration) == 0


def test_opt_checkpoint_resumes_and_resets_the_outer_iteration(tmp_path):
  lopt, theta_opt = lopt_base.LearnableSGD(1.0), optax_opts.SGD(3.0)
  learner = gl.GradientLearner(lopt, theta_opt)
  state = learner.init(jax.random.PRNGKey(0))
  grads = gl.AggregatedGradient(theta_grads={"log_lr": jnp.asarray(1.0)}, theta_model_state=None, mean_loss=0.5)
  for _ in range(3):
    state, _ = learner.update(state, [grads])
  path = os.path.join(tmp_path, "outer.ckpt")
  checkpoints.save_state(path, gl.OptCheckpoint(state, elapsed_time=1.5, total_inner_steps=30))
  resumed = gl.GradientLearner(lopt, theta_opt, init_outer_state_from_path=path).init(jax.random.PRNGKey(9))
  assert int(resumed.theta_opt_state.iteration) == 3
  np.testing.assert_allclose(learner.get_meta_params(resumed)["log_lr"], -9.0)
  reset = gl.GradientLearner(lopt, theta_opt, init_outer_state_from_path=path, reset_outer_iteration=True)
  state0 = reset.init(jax.random.PRNGKey(9))
  assert int(state0.theta_opt_state.iteration) == 0
  np.testing.assert_allclose(reset.get_meta_params(state0)["log_lr"], -9.0)
  meta = checkpoints.load_state(path, gl.OptCheckpoint(learner.init(jax.random.PRNGKey(0)), 0.0, 0))
  assert meta.elapsed_time == 1.5 and meta.total_inner_steps == 30
