"""`learned_optimization.tasks.fixed.lopt`: tasks whose parameters are a learned optimizer's meta-parameters.

* `unrolled_loss(task, opt, key, datas, num_steps)`: initialize ``task``, train it ``num_steps`` steps with ``opt``
  (one step of metafam's inner step, `metafam.inner.step.train_step`, per batch of ``datas``, rematerialized) and
  return the mean of the task's normalized losses before each update. Differentiable in ``opt``'s meta-parameters.
* `LOptTask(task, lopt, num_steps)`: params are ``lopt.init(key)``, the loss is `unrolled_loss` of
  ``lopt.opt_fn(params)``; a batch is ``num_steps`` stacked batches of ``task``.
* `LOptTaskFamilyTask(task_family, lopt, num_steps, outer_batch_size)`: the mean of `unrolled_loss` over
  ``outer_batch_size`` tasks sampled from the family (under `jax.vmap`); a batch is ``[outer_batch_size, num_steps]``
  stacked batches.
* `TruncGradEstTask(lopt, grad_estimator)`: a task whose model state is the estimator's worker state (from
  ``init_with_state``) and whose loss and gradient are one estimate of a metafam estimator (`TruncatedPES`, ...)
  through a `jax.custom_vjp`; successive calls carry the state, so its gradients are correlated in time.
* The reference's named tasks: ``TASKS`` (name -> configuration) with ``build(name)`` and one zero-argument function
  per name, ``LOptPES_Adafac_*`` included (`_make_grad_est_lopt`).

Differences from the reference: the keys of the unroll are split the way metafam's inner step splits them;
`TruncGradEstTask` is data-free (``datasets`` is None: metafam's estimators draw their batches on the device, so
they have no ``get_datas``). Building a task never reads data; CIFAR-based tasks raise `DatasetUnavailableError`
when a batch is requested.

The unrolled losses and the estimator-as-gradient ``custom_vjp`` here define *tasks* (a loss to be minimized by an
outer optimizer), not a meta-training engine: each step is the engine's `metafam.inner.step.train_step`, and the
estimate is a metafam estimator's.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization import training
from metafam.compat.learned_optimization.learned_optimizers import adafac_mlp_lopt, mlp_lopt
from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.compat.learned_optimization.outer_trainers import gradient_learner, lopt_truncated_step
from metafam.compat.learned_optimization.outer_trainers import truncated_pes, truncation_schedule
from metafam.compat.learned_optimization.tasks import base, es_wrapper
from metafam.compat.learned_optimization.tasks.fixed import conv, image_mlp
from metafam.datasets.base import Datasets
from metafam.inner import step as _step
from metafam.taskfamilies.base import TaskFamily as _TaskFamily
from metafam.compat.learned_optimization.tasks.fixed._named import named_task_functions

__all__ = ["unrolled_loss", "LOptTask", "LOptTaskFamilyTask", "TruncGradEstTask", "TASKS", "build", "stacked_datasets"]


def _positive_int(value: Any, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{name} must be a positive int, got {value!r}.")
  return value


def _check_lopt(lopt: Any, owner: str) -> None:
  if not (callable(getattr(lopt, "init", None)) and callable(getattr(lopt, "opt_fn", None))):
    raise TypeError(f"{owner}: lopt must be a learned optimizer (with init(key) and opt_fn(theta)), got "
                    f"{type(lopt).__name__}.")


def stacked_datasets(source: Any, shape: Sequence[int]) -> Any:
  """``source``'s datasets with each batch ``shape`` batches stacked on new leading axes (`training.get_batches`);
  None for data-free sources. The abstract batch is derived, so nothing is read until a batch is requested."""
  inner = source.datasets
  if inner is None:
    return None
  shape = tuple(int(s) for s in shape)

  def split(name):
    while True:
      yield training.get_batches(source, list(shape), split=name, numpy=True)

  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(shape + tuple(s.shape), s.dtype), inner.abstract_batch)
  return Datasets(train=split("train"), inner_valid=split("inner_valid"), outer_valid=split("outer_valid"),
                  test=split("test"), extra_info=inner.extra_info, abstract_batch=abstract)


def unrolled_loss(task, opt, key, datas, num_steps):
  """Mean over ``num_steps`` updates of ``task.normalizer`` of the training loss before each update of ``opt``
  (started from ``task.init_with_state``); ``datas`` holds one batch per step on its leading axis (``()`` or None
  for a data-free task)."""
  num_steps = _positive_int(num_steps, "num_steps")
  opt = opt_base.as_lo_optimizer(opt)
  init_key, unroll_key = jax.random.split(key)
  params, model_state = task.init_with_state(init_key)
  opt_state = opt.init(params, model_state, num_steps=num_steps)
  keys = jax.random.split(unroll_key, num_steps)
  batches = None if datas is None or not jax.tree.leaves(datas) else datas

  @jax.checkpoint
  def one_step(state, xs):
    step_key, batch = xs
    return _step.train_step(task, opt, state, step_key, batch=batch)

  _, losses = jax.lax.scan(one_step, opt_state, (keys, batches), length=num_steps)
  return jnp.mean(jax.vmap(task.normalizer)(losses))


class LOptTask(base.Task):
  """The meta-objective of ``lopt`` on ``task``: `unrolled_loss` over full unrolls of ``num_steps`` steps."""

  def __init__(self, task: base.Task, lopt: lopt_base.LearnedOptimizer, num_steps: int = 10):
    if not isinstance(task, base.Task):
      raise TypeError(f"LOptTask: task must be a Task, got {type(task).__name__}.")
    _check_lopt(lopt, "LOptTask")
    self.task, self.lopt = task, lopt
    self.num_steps = _positive_int(num_steps, "num_steps")
    self.normalizer = task.normalizer
    self.datasets = stacked_datasets(task, [self.num_steps])

  def init(self, key):
    return self.lopt.init(key)

  def loss(self, params, key, datas):
    return unrolled_loss(self.task, self.lopt.opt_fn(params), key, datas, self.num_steps)


class LOptTaskFamilyTask(base.Task):
  """The meta-objective of ``lopt`` on ``task_family``: the mean of `unrolled_loss` over ``outer_batch_size``
  sampled tasks."""

  def __init__(self, task_family: base.TaskFamily, lopt: lopt_base.LearnedOptimizer, num_steps: int = 10,
               outer_batch_size: int = 2):
    if not isinstance(task_family, _TaskFamily):
      raise TypeError(f"LOptTaskFamilyTask: task_family must be a TaskFamily, got {type(task_family).__name__}.")
    _check_lopt(lopt, "LOptTaskFamilyTask")
    self.task_family, self.lopt = task_family, lopt
    self.num_steps = _positive_int(num_steps, "num_steps")
    self.outer_batch_size = _positive_int(outer_batch_size, "outer_batch_size")
    with jax.ensure_compile_time_eval():
      self.normalizer = task_family.sample_task(jax.random.PRNGKey(0)).normalizer
    self.datasets = stacked_datasets(task_family, [self.outer_batch_size, self.num_steps])

  def init(self, key):
    return self.lopt.init(key)

  def loss(self, params, key, datas):
    opt = self.lopt.opt_fn(params)

    def one_task(task_datas, task_key):
      sample_key, unroll_key = jax.random.split(task_key)
      task = self.task_family.task_fn(self.task_family.sample(sample_key))
      return unrolled_loss(task, opt, unroll_key, task_datas, self.num_steps)

    keys = jax.random.split(key, self.outer_batch_size)
    if datas is None or not jax.tree.leaves(datas):
      return jnp.mean(jax.vmap(lambda k: one_task(None, k))(keys))
    return jnp.mean(jax.vmap(one_task)(datas, keys))


def _estimated_loss(grad_estimator: Any):
  """``f(theta, worker_state, key, data) -> (mean meta-loss, new worker_state)`` of one estimate, whose vjp
  w.r.t. theta is the estimated gradient times the loss cotangent (nothing flows to the other arguments)."""

  def forward(theta, worker_state, key, data):
    weights = gradient_learner.WorkerWeights(theta=theta, theta_model_state=None, outer_state=None)
    datas_list = None if data is None or not jax.tree.leaves(data) else data
    out, _ = grad_estimator.compute_gradient_estimate(weights, key, worker_state, with_summary=False,
                                                      datas_list=datas_list)
    return (out.mean_loss, out.unroll_state), out.grad

  @jax.custom_vjp
  def loss_fn(theta, worker_state, key, data):
    return forward(theta, worker_state, key, data)[0]

  def backward(grad, cotangent):
    d_loss, _ = cotangent
    return jax.tree.map(lambda g: g * d_loss, grad), None, None, None

  loss_fn.defvjp(forward, backward)
  return loss_fn


class TruncGradEstTask(base.Task):
  """``lopt``'s meta-parameters as a task whose gradients come from ``grad_estimator`` (a metafam estimator with
  the reference's ``init_worker_state`` / ``compute_gradient_estimate``); the model state is its worker state."""

  def __init__(self, lopt: lopt_base.LearnedOptimizer, grad_estimator: gradient_learner.GradientEstimator):
    _check_lopt(lopt, "TruncGradEstTask")
    if not callable(getattr(grad_estimator, "compute_gradient_estimate", None)):
      raise TypeError("TruncGradEstTask: grad_estimator must have compute_gradient_estimate (TruncatedPES, "
                      f"TruncatedES, ...), got {type(grad_estimator).__name__}.")
    self.lopt, self.grad_estimator = lopt, grad_estimator
    self._loss_fn = _estimated_loss(grad_estimator)
    self.datasets = None

  def init_with_state(self, key):
    theta_key, state_key = jax.random.split(key)
    theta = self.lopt.init(theta_key)
    weights = gradient_learner.WorkerWeights(theta=theta, theta_model_state=None, outer_state=None)
    return theta, self.grad_estimator.init_worker_state(weights, state_key)

  def init(self, key):
    raise ValueError("TruncGradEstTask has a model state (the estimator's worker state): use init_with_state.")

  def loss(self, params, key, data):
    raise ValueError("TruncGradEstTask has a model state (the estimator's worker state): use loss_with_state.")

  def loss_with_state(self, params, model_state, key, data):
    return self._loss_fn(params, model_state, key, data)

  def loss_with_state_and_aux(self, params, model_state, key, data):
    loss, model_state = self._loss_fn(params, model_state, key, data)
    return loss, model_state, {}


_INNER_TASKS = {"ImageMLP_FashionMnist8_Relu32": image_mlp.build, "ImageMLP_Cifar10BW8_Relu32": image_mlp.build,
                "Conv_Cifar10_16_32x64x64": conv.build, "Conv_Cifar10_8_16x32": conv.build}
_LOPTS = {"MLPLOpt": mlp_lopt.MLPLOpt, "AdafacMLPLOpt": adafac_mlp_lopt.AdafacMLPLOpt,
          "LearnableAdam": lopt_base.LearnableAdam}
_PES_INNER = {"Fashion": "ImageMLP_FashionMnist8_Relu32", "Cifar": "ImageMLP_Cifar10BW8_Relu32"}

# name -> ("LOptTask", inner task, learned optimizer, num_steps) | ("ES", LOptTask name, pairs)
#       | ("PES", "Fashion" or "Cifar", num_inner_tasks, total_length, unroll_length)
TASKS = {
    "LOpt_MLPLOpt_FahionMnist_100": ("LOptTask", "ImageMLP_FashionMnist8_Relu32", "MLPLOpt", 100),
    "LOpt_MLPLOpt_FahionMnist_50": ("LOptTask", "ImageMLP_FashionMnist8_Relu32", "MLPLOpt", 50),
    "LOpt_MLPLOpt_FahionMnist_10": ("LOptTask", "ImageMLP_FashionMnist8_Relu32", "MLPLOpt", 10),
    "LOpt_MLPLOpt_Cifar10_16_10": ("LOptTask", "Conv_Cifar10_16_32x64x64", "MLPLOpt", 10),
    "LOpt_MLPLOpt_Cifar10_8_50": ("LOptTask", "Conv_Cifar10_8_16x32", "MLPLOpt", 50),
    "LOpt_AdafacMLPLOpt_Cifar10_8_10": ("LOptTask", "Conv_Cifar10_8_16x32", "AdafacMLPLOpt", 10),
    "LOpt_AdafacMLPLOpt_FashionMnist_50": ("LOptTask", "ImageMLP_FashionMnist8_Relu32", "AdafacMLPLOpt", 50),
    "LOpt_AdafacMLPLOpt_FashionMnist_20": ("LOptTask", "ImageMLP_FashionMnist8_Relu32", "AdafacMLPLOpt", 20),
    "LOpt_LearnableAdam_Cifar10_8_50": ("LOptTask", "Conv_Cifar10_8_16x32", "LearnableAdam", 50),
    "LOpt_LearnableAdam_Cifar10_8_200": ("LOptTask", "Conv_Cifar10_8_16x32", "LearnableAdam", 200),
    "LOpt_ES4_AdafacMLPLOpt_FashionMnist_20": ("ES", "LOpt_AdafacMLPLOpt_FashionMnist_20", 4),
    "LOpt_ES4_LOpt_MLPLOpt_FahionMnist_50": ("ES", "LOpt_MLPLOpt_FahionMnist_50", 4),
    "LOpt_ES4_LOpt_MLPLOpt_Cifar10_16_10": ("ES", "LOpt_MLPLOpt_Cifar10_16_10", 4),
    **{f"LOptPES_Adafac_{inner}_OuterBS{bs}_Length{length}_Trunc{trunc}": ("PES", inner, bs, length, trunc)
       for inner in ("Fashion", "Cifar")
       for bs, length, trunc in ((16, 50, 10), (16, 200, 10), (8, 50, 5), (4, 50, 10), (4, 50, 5))},
}


def _make_grad_est_lopt(task_name: str, num_inner_tasks: int, total_length: int, unroll_length: int) -> base.Task:
  """`TruncGradEstTask` of `AdafacMLPLOpt` trained by `TruncatedPES` (truncations of ``unroll_length``) on
  ``num_inner_tasks`` copies of the 8x8 image MLP of ``task_name`` ("Fashion" or "Cifar", the latter black and
  white CIFAR-10) in trajectories of ``total_length`` steps."""
  if task_name not in _PES_INNER:
    raise ValueError(f"task_name must be one of {sorted(_PES_INNER)}, got {task_name!r}.")
  task = image_mlp.build(_PES_INNER[task_name])
  num_inner_tasks = _positive_int(num_inner_tasks, "num_inner_tasks")
  total_length = _positive_int(total_length, "total_length")
  unroll_length = _positive_int(unroll_length, "unroll_length")
  lopt = adafac_mlp_lopt.AdafacMLPLOpt()

  def estimator():
    trunc_step = lopt_truncated_step.VectorizedLOptTruncatedStep(
        base.single_task_to_family(task), lopt, truncation_schedule.ConstantTruncationSchedule(total_length),
        num_inner_tasks, random_initial_iteration_offset=total_length)
    return truncated_pes.TruncatedPES(trunc_step, unroll_length, steps_per_jit=unroll_length)

  eager = not getattr(task.datasets, "reads_on_use", False) and task.datasets.has_device_data
  return TruncGradEstTask(lopt, estimator() if eager else _BuiltOnFirstUse(estimator, task))


class _BuiltOnFirstUse:
  """The estimator ``build_fn()`` builds, built on its first use (a metafam truncated step places its data on the
  device when built); a batch of ``task`` is requested first, so missing data raise `DatasetUnavailableError`."""

  def __init__(self, build_fn: Any, task: base.Task):
    self._build_fn, self._task, self._estimator = build_fn, task, None

  def _built(self) -> Any:
    if self._estimator is None:
      next(self._task.datasets.train)
      self._estimator = self._build_fn()
    return self._estimator

  def init_worker_state(self, worker_weights, key):
    return self._built().init_worker_state(worker_weights, key)

  def compute_gradient_estimate(self, worker_weights, key, state, with_summary=False, datas_list=None):
    return self._built().compute_gradient_estimate(worker_weights, key, state, with_summary=with_summary,
                                                   datas_list=datas_list)

def build(name: str) -> base.Task:
  """The task ``name`` of ``TASKS``."""
  if name not in TASKS:
    raise ValueError(f"Unknown LOpt task {name!r}; expected one of {sorted(TASKS)}.")
  kind, *cfg = TASKS[name]
  if kind == "LOptTask":
    inner, lopt_name, num_steps = cfg
    task = LOptTask(_INNER_TASKS[inner](inner), _LOPTS[lopt_name](), num_steps)
  elif kind == "ES":
    inner, n_pairs = cfg
    task = es_wrapper.ESTask(build(inner), 0.01, n_pairs)
  else:
    task = _make_grad_est_lopt(*cfg)
  task.name = name
  return task


globals().update(named_task_functions(TASKS, build))
__all__ += list(TASKS)
