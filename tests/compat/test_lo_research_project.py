"""A small research project written against learned_optimization's import prefix runs on metafam after the prefix
rewrite alone.

The project (written to a temporary directory, as a user's repository would hold it) defines its own learned
optimizer from `learned_optimizers.common` accumulators, `summary` calls and `optimizers.base.Optimizer`, and
meta-trains it with its own fork of `SingleMachineGradientLearner` (with its own WorkerWeights / OuterState
namedtuples, as forks of `gradient_learner.py` have) and `TruncatedPES` on the Fashion-MNIST image-MLP task. The test
rewrites the import prefix with `tools/lo_test_suite.rewrite_imports` (the same rewrite as for LO's own tests), runs
the project in a subprocess and checks that meta-training helped.

A second project reaches below LO's public names, as research code does: a task family that subclasses
`tasks.fixed.image_mlp._MLPImageTask` on another dataset (12x12 Fashion-MNIST, a 16-unit MLP) and a fork of
`MLPLOpt` (decoupled weight decay) that builds its own `mlp_lopt.MLPLOptState` from `common.vec_rolling_mom` and
checks the state's class on every update, meta-trained with `SingleMachineGradientLearner` and `TruncatedPES`.
"""

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import lo_test_suite  # noqa: E402  pylint: disable=g-import-not-at-top

MY_LOPT = '''
"""A learned optimizer: a learned step size and a learned mix of momenta at several decays."""
import collections

import jax
import jax.numpy as jnp
from learned_optimization import summary
from learned_optimization import tree_utils
from learned_optimization.learned_optimizers import base as lopt_base
from learned_optimization.learned_optimizers import common
from learned_optimization.optimizers import base as opt_base

MixMomState = collections.namedtuple("MixMomState", ["params", "state", "iteration", "mom"])


class MixMomLOpt(lopt_base.LearnedOptimizer):

  def __init__(self, decays=(0.5, 0.9, 0.99), initial_lr=3e-3):
    self.decays = decays
    self.initial_lr = initial_lr

  def init(self, key):
    return {"log_lr": jnp.log(jnp.asarray(self.initial_lr, jnp.float32)),
            "mix": jnp.zeros([len(self.decays)], jnp.float32)}

  def opt_fn(self, theta, is_training=False):
    accumulator = common.vec_rolling_mom(jnp.asarray(self.decays, jnp.float32))

    class _Opt(opt_base.Optimizer):

      def init(self, params, model_state=None, num_steps=None, key=None):
        return MixMomState(params, model_state, jnp.asarray(0, jnp.int32), accumulator.init(params))

      def update(self, opt_state, grad, loss=None, model_state=None, key=None, **kwargs):
        mom = accumulator.update(opt_state.mom, grad)
        weights = jax.nn.softmax(theta["mix"])
        direction = jax.tree_util.tree_map(lambda m: jnp.sum(m * weights, axis=-1), mom.m)
        summary.summary("direction_norm", tree_utils.tree_norm(direction))
        lr = jnp.exp(theta["log_lr"])
        params = jax.tree_util.tree_map(lambda p, d: p - lr * d, opt_state.params, direction)
        return MixMomState(params, model_state, opt_state.iteration + 1, mom)

    return _Opt()
'''

FORK_LEARNER = '''
"""A fork of gradient_learner.SingleMachineGradientLearner with this project's own namedtuples."""
import collections

import jax
import jax.numpy as jnp
from learned_optimization import tree_utils

WorkerWeights = collections.namedtuple("WorkerWeights", ["theta", "theta_model_state", "outer_state"])
OuterState = collections.namedtuple("OuterState", ["outer_iteration"])
ForkState = collections.namedtuple("ForkState", ["theta_opt_state", "estimator_states", "outer_iteration"])


class ForkedSingleMachineGradientLearner:

  def __init__(self, meta_init, gradient_estimators, theta_opt):
    self.meta_init = meta_init
    self.gradient_estimators = gradient_estimators
    self.theta_opt = theta_opt

  def _weights(self, state):
    theta = self.theta_opt.get_params(state.theta_opt_state)
    return WorkerWeights(theta, None, OuterState(state.outer_iteration))

  def init(self, key):
    key1, key2 = jax.random.split(key)
    theta_opt_state = self.theta_opt.init(self.meta_init.init(key1))
    state = ForkState(theta_opt_state, None, 0)
    weights = self._weights(state)
    keys = jax.random.split(key2, len(self.gradient_estimators))
    states = [est.init_worker_state(weights, k) for est, k in zip(self.gradient_estimators, keys)]
    return state._replace(estimator_states=states)

  def update(self, state, key):
    weights = self._weights(state)
    keys = jax.random.split(key, len(self.gradient_estimators))
    grads, losses, new_states = [], [], []
    for est, est_state, k in zip(self.gradient_estimators, state.estimator_states, keys):
      out, _ = est.compute_gradient_estimate(weights, k, est_state, with_summary=False)
      grads.append(out.grad)
      losses.append(out.mean_loss)
      new_states.append(out.unroll_state)
    grad = tree_utils.tree_div(jax.tree_util.tree_map(lambda *g: sum(g), *grads), float(len(grads)))
    loss = jnp.mean(jnp.asarray(losses))
    theta_opt_state = self.theta_opt.update(state.theta_opt_state, grad, loss=loss)
    return ForkState(theta_opt_state, new_states, state.outer_iteration + 1), loss

  def get_meta_params(self, state):
    return self.theta_opt.get_params(state.theta_opt_state)
'''

TRAIN = '''
"""Meta-trains MixMomLOpt on the Fashion-MNIST image MLP and prints a JSON summary."""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as onp
from learned_optimization import summary
from learned_optimization import training
from learned_optimization.optimizers import optax_opts
from learned_optimization.outer_trainers import lopt_truncated_step
from learned_optimization.outer_trainers import truncated_pes
from learned_optimization.outer_trainers import truncation_schedule
from learned_optimization.tasks import base as tasks_base
from learned_optimization.tasks.fixed import image_mlp

import fork_gradient_learner
import my_lopt

NUM_META_STEPS = int(sys.argv[1])
EVAL_STEPS = 40
task = image_mlp.ImageMLP_FashionMnist8_Relu32()
lopt = my_lopt.MixMomLOpt()


def inner_train(theta, key, batches):
  opt = lopt.opt_fn(theta)
  opt_state = opt.init(task.init(key), num_steps=EVAL_STEPS)

  def body(opt_state, batch):
    loss, grad = jax.value_and_grad(task.loss)(opt.get_params(opt_state), key, batch)
    summary.summary("inner_loss", loss)
    return opt.update(opt_state, grad, loss=loss), loss

  _, losses = jax.lax.scan(body, opt_state, batches)
  return losses


evaluate = jax.jit(summary.with_summary_output_reduced(inner_train))
eval_batches = [training.vec_get_batch(task, EVAL_STEPS, split="train") for _ in range(8)]


def final_losses(theta):
  """Mean loss of the last 10 of 40 steps, for 8 seeds (each with its own batches); also the summaries' mean."""
  out = []
  for seed, batches in enumerate(eval_batches):
    losses, metrics = evaluate(theta, jax.random.PRNGKey(100 + seed), batches)
    metrics = summary.aggregate_metric_list([metrics])
    assert abs(float(metrics["mean||inner_loss"]) - float(jnp.mean(losses))) < 1e-4, metrics
    assert "mean||direction_norm" in metrics, sorted(metrics)
    out.append(float(jnp.mean(losses[-10:])))
  return out


family = tasks_base.single_task_to_family(task)
step = lopt_truncated_step.VectorizedLOptTruncatedStep(
    family, lopt, truncation_schedule.ConstantTruncationSchedule(40), num_tasks=8,
    random_initial_iteration_offset=40)
estimator = truncated_pes.TruncatedPES(step, trunc_length=10, std=0.01, steps_per_jit=10)
learner = fork_gradient_learner.ForkedSingleMachineGradientLearner(lopt, [estimator], optax_opts.Adam(0.1))

state = learner.init(jax.random.PRNGKey(0))
before = final_losses(learner.get_meta_params(state))
meta_losses = []
key = jax.random.PRNGKey(1)
for _ in range(NUM_META_STEPS):
  key, sub = jax.random.split(key)
  state, loss = learner.update(state, sub)
  meta_losses.append(float(loss))
theta = learner.get_meta_params(state)
print(json.dumps({"meta_losses": meta_losses, "before": before, "after": final_losses(theta),
                  "log_lr": float(theta["log_lr"])}))
'''


@pytest.mark.slow
def test_lo_research_project_runs_with_the_prefix_rewrite_and_meta_training_helps(tmp_path):
  for name, source in (("my_lopt.py", MY_LOPT), ("fork_gradient_learner.py", FORK_LEARNER), ("train.py", TRAIN)):
    assert "metafam" not in source  # written for LO
    rewritten = lo_test_suite.rewrite_imports(textwrap.dedent(source))
    assert "from learned_optimization" not in rewritten
    (tmp_path / name).write_text(rewritten)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, "train.py", "60"], cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  meta = result["meta_losses"]
  assert len(meta) == 60 and all(v == v for v in meta)  # finite (no NaN)
  # The meta-loss (the lanes' train loss over a truncation) falls: the mean of the last 15 meta-steps is below
  # the first 15's by 10% (measured: 1.01 -> 0.66; each is a mean of 15 noisy truncation losses of 8 lanes).
  assert sum(meta[-15:]) / 15 < 0.9 * sum(meta[:15]) / 15, meta
  # The learned step size grew, and on 8 fixed evaluation seeds the final training loss fell on at least 7
  # (a sign test: 7 or more of 8 by chance has probability 9/256 under "no effect") and by 10% on average
  # (measured: 2.30 -> 0.79, all 8 seeds; log_lr -5.8 -> 1.25).
  assert result["log_lr"] > math.log(3e-3) + 0.5, result["log_lr"]
  before, after = result["before"], result["after"]
  assert sum(a < b for a, b in zip(after, before)) >= 7, (before, after)
  assert sum(after) < 0.9 * sum(before), (before, after)


SUBCLASS_TASK = '''"""A research task family: the reference's MLP image task on 12x12 Fashion-MNIST."""
from learned_optimization.tasks.datasets import image
from learned_optimization.tasks.fixed import image_mlp


class FashionMnist12_Relu16(image_mlp._MLPImageTask):

  def __init__(self):
    super().__init__(image.fashion_mnist_datasets(batch_size=64, image_size=(12, 12)), [16])
'''

SUBCLASS_LOPT = '''"""MLPLOpt with decoupled weight decay, as a fork writes it: its own init of LO's MLPLOptState."""
import jax
import jax.numpy as jnp
from learned_optimization.learned_optimizers import common
from learned_optimization.learned_optimizers import mlp_lopt
from learned_optimization.optimizers import base as opt_base

DECAYS = jnp.asarray([0.1, 0.5, 0.9, 0.99, 0.999, 0.9999])


class DecayedMLPLOpt(mlp_lopt.MLPLOpt):

  def __init__(self, weight_decay=1e-4, **kwargs):
    super().__init__(**kwargs)
    self.weight_decay = weight_decay

  def opt_fn(self, theta, is_training=False):
    inner = super().opt_fn(theta, is_training)
    weight_decay = self.weight_decay

    class _Opt(opt_base.Optimizer):

      def init(self, params, model_state=None, num_steps=None, key=None):
        return mlp_lopt.MLPLOptState(
            params=params, rolling_features=common.vec_rolling_mom(DECAYS).init(params),
            iteration=jnp.asarray(0, dtype=jnp.int32), state=model_state)

      def update(self, opt_state, grad, loss=None, model_state=None, key=None, **kwargs):
        assert isinstance(opt_state, mlp_lopt.MLPLOptState), type(opt_state)
        new = inner.update(opt_state, grad, loss=loss, model_state=model_state, key=key)
        assert isinstance(new, mlp_lopt.MLPLOptState), type(new)
        return new.replace(params=jax.tree_util.tree_map(lambda p: p * (1 - weight_decay), new.params))

    return _Opt()
'''

SUBCLASS_TRAIN = '''"""Meta-trains DecayedMLPLOpt on the project's task with PES and prints a JSON summary."""
import json
import sys

import jax
import jax.numpy as jnp
from learned_optimization import training
from learned_optimization.optimizers import optax_opts
from learned_optimization.outer_trainers import gradient_learner
from learned_optimization.outer_trainers import lopt_truncated_step
from learned_optimization.outer_trainers import truncated_pes
from learned_optimization.outer_trainers import truncation_schedule
from learned_optimization.tasks import base as tasks_base

import my_lopt
import my_task

NUM_META_STEPS = int(sys.argv[1])
EVAL_STEPS = 60
task = my_task.FashionMnist12_Relu16()
lopt = my_lopt.DecayedMLPLOpt()


@jax.jit
def inner_train(theta, key, batches):
  opt = lopt.opt_fn(theta)
  opt_state = opt.init(task.init(key), num_steps=EVAL_STEPS)

  def body(opt_state, batch):
    loss, grad = jax.value_and_grad(task.loss)(opt.get_params(opt_state), key, batch)
    return opt.update(opt_state, grad, loss=loss), loss

  return jax.lax.scan(body, opt_state, batches)[1]


eval_batches = [training.vec_get_batch(task, EVAL_STEPS, split="train") for _ in range(6)]


def final_losses(theta):
  return [float(jnp.mean(inner_train(theta, jax.random.PRNGKey(100 + s), b)[-10:])) for s, b in enumerate(eval_batches)]


family = tasks_base.single_task_to_family(task)
step = lopt_truncated_step.VectorizedLOptTruncatedStep(
    family, lopt, truncation_schedule.ConstantTruncationSchedule(60), num_tasks=8,
    random_initial_iteration_offset=60)
estimator = truncated_pes.TruncatedPES(step, trunc_length=10, std=0.01, steps_per_jit=10)
learner = gradient_learner.SingleMachineGradientLearner(lopt, [estimator], optax_opts.Adam(3e-3))
state = learner.init(jax.random.PRNGKey(0))
theta0 = learner.get_meta_params(state)
before = final_losses(theta0)
meta_losses = []
key = jax.random.PRNGKey(1)
for _ in range(NUM_META_STEPS):
  key, sub = jax.random.split(key)
  state, loss, _ = learner.update(state, sub)
  meta_losses.append(float(loss))
after = final_losses(learner.get_meta_params(state))
print(json.dumps({"meta_losses": meta_losses, "before": before, "after": after}))
'''


def _run_project(tmp_path, files, *args):
  for name, source in files:
    assert "metafam" not in source  # written for LO
    rewritten = lo_test_suite.rewrite_imports(textwrap.dedent(source))
    assert "from learned_optimization" not in rewritten
    (tmp_path / name).write_text(rewritten)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, "train.py", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_lo_research_project_subclassing_mlp_image_task_with_its_own_mlplopt_state_meta_trains(tmp_path):
  result = _run_project(tmp_path, (("my_task.py", SUBCLASS_TASK), ("my_lopt.py", SUBCLASS_LOPT),
                                   ("train.py", SUBCLASS_TRAIN)), "60")
  meta = result["meta_losses"]
  assert len(meta) == 60 and all(v == v for v in meta)
  # Measured: the meta-loss fell from 2.03 (mean of the first 15 meta-steps) to 1.57 (last 15); the final training
  # loss on 6 fixed evaluation seeds from 1.62 to 1.00 on average, on all 6.
  assert sum(meta[-15:]) / 15 < 0.95 * sum(meta[:15]) / 15, meta
  before, after = result["before"], result["after"]
  assert sum(a < b for a, b in zip(after, before)) >= 5, (before, after)
  assert sum(after) < 0.9 * sum(before), (before, after)
