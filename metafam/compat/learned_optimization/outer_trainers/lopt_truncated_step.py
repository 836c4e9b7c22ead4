"""`learned_optimization.outer_trainers.lopt_truncated_step`: `VectorizedLOptTruncatedStep`, the reference's
constructor for metafam's `metafam.inner.TruncatedStep`, and `SimpleVecLOptTruncatedStep`.

The object *is* a `TruncatedStep` (a subclass that only translates the arguments), so metafam's estimators and
`MetaTrainer` take it directly. Translations:

* ``trunc_sched``: a schedule of `truncation_schedule` (or a metafam schedule).
* ``meta_loss_split=None``: the meta-loss is the train-batch loss of each step, as in the reference (metafam's
  ``meta_loss_split=None``); a split name (e.g. ``"outer_valid"``) scores the updated params on that split, and
  ``"same_data"`` (metafam: ``"same_batch"``) on the step's own training batch.
* ``random_initial_iteration_offset``: 0 starts every lane at iteration 0; a positive value staggers the lanes'
  first trajectories. metafam draws each lane's start uniformly in ``[0, length)`` of its first trajectory; the
  reference draws it in ``[0, random_initial_iteration_offset)``.
* ``outer_data_split``: only ``"train"`` (the inner training data).
* ``meta_loss_with_aux_key``: the meta-loss is that aux value of the task (unnormalized), scored on the updated
  params with the step's own batch when ``meta_loss_split`` is None (the reference: the train batch's aux).

Other keyword arguments (``devices``, ``lane_chunk``, ...) go to `TruncatedStep` unchanged; ``donate`` defaults to
False (the reference's calls never consume their input state).

The reference's lower-level calls work on the same object: ``outer_init(key)``, ``init_step_state(theta,
outer_state, key, theta_is_vector=False)`` (metafam's ``init_step_state(theta, key, theta_is_batched)`` keeps
working: the call is told apart by its second argument, a key for metafam), ``unroll_step(theta, state, key, data,
outer_state, theta_is_vector=False) -> (state, TruncatedUnrollOut)`` (one step of metafam's `unroll`; ``data`` is
not used: metafam samples each lane's batch on the device from the family's datasets, with the step's key),
``meta_loss_batch(theta, state, key, data, outer_state, theta_is_vector=False) -> f32[num_tasks]`` (each lane's
loss at its current params on ``data[i]``), ``get_batch(steps=None)`` / ``get_outer_batch(steps=None)`` (host
batches ``[num_tasks, ...]`` or ``[steps, num_tasks, ...]`` of the train split / the meta-loss split), ``task_name()``
and ``cfg_name()``. The state's ``inner_step`` is its per-lane ``iteration``.

The reference's per-lane functions (``init_truncation_state``, ``truncated_unroll_one_step``, ...) and
``SimpleLOptTruncatedStep`` are here too, for code that drives inner training itself (`_lopt_functions`).
"""

from __future__ import annotations

import functools
from typing import Any, Optional, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from metafam.compat.learned_optimization import training
from metafam.compat.learned_optimization.outer_trainers import truncation_schedule
from metafam.compat.learned_optimization.outer_trainers._lopt_functions import (  # noqa: F401  LO names
    TruncatedUnrollState, _init_truncation_state, _truncated_unroll_one_step, init_truncation_state,
    init_truncation_state_vec_theta, progress_or_reset_inner_opt_state, truncated_unroll_one_step, truncated_unroll_one_step_vec_theta, vectorized_loss_and_aux)
from metafam.compat.learned_optimization.outer_trainers import truncated_step as truncated_step_lib
from metafam.compat.learned_optimization.outer_trainers.truncated_step import TruncatedUnrollOut
from metafam.compat.learned_optimization.tasks import base as tasks_base
from metafam.inner.truncated_step import TruncatedStep

__all__ = ["VectorizedLOptTruncatedStep", "SimpleVecLOptTruncatedStep", "SimpleLOptTruncatedStep",
           "TruncatedUnrollState", "init_truncation_state", "init_truncation_state_vec_theta",
           "progress_or_reset_inner_opt_state", "truncated_unroll_one_step", "truncated_unroll_one_step_vec_theta",
           "vectorized_loss_and_aux"]

# The reference's type aliases.
PRNGKey = jax.Array
MetaParams = Any
InnerState = Any
InnerBatch = Any
OuterBatch = Any
OuterState = Any
T = TypeVar("T")
G = TypeVar("G")


def _looks_like_key(x: Any) -> bool:
  if not hasattr(x, "dtype") or not hasattr(x, "shape"):
    return False
  return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) or (x.dtype == np.uint32 and x.shape[-1:] == (2,))


@functools.partial(jax.jit, static_argnames=("step", "theta_is_vector", "batched_data"))
def _meta_losses(step, theta, lanes, key, data, theta_is_vector, batched_data):
  def one(th, cfg, opt_state, k, batch):
    opt = step.learned_opt.opt_fn(th)
    task = step.family.task_fn(cfg)
    loss, _ = task.loss_with_state(opt.get_params(opt_state), opt.get_state(opt_state), k, batch)
    return loss

  keys = jax.random.split(key, step.num_tasks)
  return jax.vmap(one, in_axes=(0 if theta_is_vector else None, 0, 0, 0, 0 if batched_data else None))(
      theta, lanes.cfg, lanes.opt_state, keys, data)


class VectorizedLOptTruncatedStep(TruncatedStep):
  """``num_tasks`` instances of ``task_family`` trained by ``learned_opt`` in truncated, vectorized unrolls."""

  def __init__(self, task_family: Any, learned_opt: Any, trunc_sched: Any, num_tasks: int,
               meta_loss_split: Optional[str] = None, random_initial_iteration_offset: int = 0,
               outer_data_split: str = "train", meta_loss_with_aux_key: Optional[str] = None,
               task_name: Optional[str] = None, **metafam_kwargs: Any):
    offset = random_initial_iteration_offset
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)) or offset < 0:
      raise ValueError(f"random_initial_iteration_offset must be a non-negative int, got {offset!r}.")
    if outer_data_split != "train":
      raise NotImplementedError(f"outer_data_split={outer_data_split!r}: metafam's inner step trains on the train "
                                "split only.")
    if meta_loss_split == "same_data":  # the reference's name for scoring on the step's own batch
      meta_loss_split = "same_batch"
    if meta_loss_with_aux_key is not None:
      task_family = _AuxMetaLossFamily(task_family, meta_loss_with_aux_key)
      if meta_loss_split is None:
        meta_loss_split = "same_batch"
    metafam_kwargs.setdefault("donate", False)  # the reference's calls are pure: a state stays usable
    # The reference reports masked steps in its outputs only; unroll_step runs one step per call, and a host check
    # of each would wait for the device every step (pass on_nonfinite="warn" to have them reported).
    metafam_kwargs.setdefault("on_nonfinite", "ignore")
    super().__init__(task_family, learned_opt, num_tasks, schedule=truncation_schedule.as_metafam_schedule(trunc_sched),
                     random_initial_iteration=offset > 0, meta_loss_split=meta_loss_split, **metafam_kwargs)
    self.task_family, self.trunc_sched = getattr(task_family, "family", task_family), trunc_sched
    self.meta_loss_with_aux_key = meta_loss_with_aux_key
    self.random_initial_iteration_offset = int(offset)
    self._task_name = task_name if task_name else self.task_family.name

  def task_name(self) -> str:
    return self._task_name

  def cfg_name(self) -> str:
    return self._task_name

  # -- the reference's lower-level calls --------------------------------------------------------------------------
  def outer_init(self, key: jax.Array) -> Any:
    return self.learned_opt.init(key)

  def init_step_state(self, theta: Any, *args: Any, **kwargs: Any):
    """LO: ``(theta, outer_state, key, theta_is_vector=False)``; metafam: ``(theta, key, theta_is_batched=False)``."""
    if "outer_state" in kwargs or (args and not _looks_like_key(args[0])) or (not args and "key" in kwargs
                                                                              and "theta_is_vector" in kwargs):
      names = ("outer_state", "key", "theta_is_vector")
      given = dict(zip(names, args), **kwargs)
      return super().init_step_state(theta, given["key"], theta_is_batched=bool(given.get("theta_is_vector", False)))
    return super().init_step_state(theta, *args, **kwargs)

  def unroll_step(self, theta: Any, unroll_state: Any, key: jax.Array, data: Any = None, outer_state: Any = None,
                  theta_is_vector: bool = False):
    cfg = unroll_state.cfg
    state, out = self.unroll(theta, unroll_state, key, 1, theta_is_batched=theta_is_vector)
    first = lambda x: x[0]  # noqa: E731
    return state, TruncatedUnrollOut(loss=first(out.loss), is_done=first(out.is_done), task_param=cfg,
                                     iteration=first(out.iteration), mask=first(out.mask))

  def meta_loss_batch(self, theta: Any, unroll_state: Any, key: jax.Array, data: Any, outer_state: Any = None,
                      theta_is_vector: bool = False):
    batched = bool(jax.tree.leaves(data))
    return _meta_losses(self, theta, unroll_state, key, data, theta_is_vector=theta_is_vector,
                        batched_data=batched)

  def _get(self, split: str, steps: Optional[int]) -> Any:
    shape = [self.num_tasks] if steps is None else [steps, self.num_tasks]
    return training.get_batches(self.task_family, shape, split=split)

  def get_batch(self, steps: Optional[int] = None) -> Any:
    return self._get("train", steps)

  def get_outer_batch(self, steps: Optional[int] = None) -> Any:
    split = self.meta_loss_split if self.meta_loss_split not in (None, "same_batch") else "train"
    return self._get(split, steps)


class _AuxMetaLossTask(tasks_base.Task):
  """Trains on ``task``'s loss; its meta-loss (``loss_with_state_and_aux``'s first value, what metafam's step scores
  the updated params with) is the aux value ``key``, unnormalized."""

  def __init__(self, task: Any, key: str):
    self.task, self.key = task, key
    self.datasets, self.name = task.datasets, task.name

  def init_with_state(self, key):
    return self.task.init_with_state(key)

  def loss_with_state(self, params, state, key, batch):
    loss, state, _ = self.task.loss_with_state_and_aux(params, state, key, batch)
    return loss, state

  def loss_with_state_and_aux(self, params, state, key, batch):
    _, state, aux = self.task.loss_with_state_and_aux(params, state, key, batch)
    return jnp.asarray(aux[self.key], jnp.float32), state, aux

  def normalizer(self, loss):
    return loss


class _AuxMetaLossFamily(tasks_base.TaskFamily):
  """``family`` whose tasks' meta-loss is the aux value ``key`` (`VectorizedLOptTruncatedStep`'s
  ``meta_loss_with_aux_key``)."""

  def __init__(self, family: Any, key: str):
    super().__init__()
    self.family, self.key = family, key
    self.datasets, self.name = family.datasets, family.name

  def sample(self, key):
    return self.family.sample(key)

  def task_fn(self, cfg):
    return _AuxMetaLossTask(self.family.task_fn(cfg), self.key)


class SimpleVecLOptTruncatedStep(VectorizedLOptTruncatedStep):
  """``num_tasks`` copies of one ``task`` trained by ``lopt`` in trajectories of ``unroll_length`` steps."""

  def __init__(self, task: Any, lopt: Any, num_tasks: int, unroll_length: int = 5, **kwargs: Any):
    super().__init__(tasks_base.single_task_to_family(task), lopt,
                     truncation_schedule.ConstantTruncationSchedule(unroll_length), num_tasks, **kwargs)
    self.task, self.unroll_length = task, unroll_length


class SimpleLOptTruncatedStep(truncated_step_lib.TruncatedStep):
  """One copy of ``task`` trained by ``lopt`` in trajectories of ``unroll_length`` steps, as a user-level
  `truncated_step.TruncatedStep` (one lane; `truncated_step.VectorizedTruncatedStep` maps it over lanes). A lane
  past ``unroll_length`` steps is re-initialized (that step has ``mask=False``, ``is_done=True``)."""

  def __init__(self, task: Any, lopt: Any, unroll_length: int = 5):
    self.task, self.lopt, self.unroll_length = task, lopt, unroll_length

  def outer_init(self, key):
    return self.lopt.init(key)

  def init_step_state(self, theta, outer_state, key):
    return self.lopt.opt_fn(theta).init(self.task.init(key))

  def unroll_step(self, theta, unroll_state, key, data, outer_state):
    opt = self.lopt.opt_fn(theta)

    def train(opt_state):
      loss, grad = jax.value_and_grad(self.task.loss)(opt.get_params(opt_state), key, data)
      opt_state = opt.update(opt_state, grad, loss=loss)
      return opt_state, TruncatedUnrollOut(loss=jnp.asarray(loss, jnp.float32), is_done=jnp.asarray(False),
                                           task_param=None, iteration=opt_state.iteration, mask=jnp.asarray(True))

    def reset(opt_state):
      opt_state = opt.init(self.task.init(key))
      return opt_state, TruncatedUnrollOut(loss=jnp.asarray(0.0, jnp.float32), is_done=jnp.asarray(True),
                                           task_param=None, iteration=opt_state.iteration, mask=jnp.asarray(False))

    return jax.lax.cond(unroll_state.iteration < self.unroll_length, train, reset, unroll_state)

  def meta_loss_batch(self, theta, unroll_state, key, data, outer_state):
    return self.task.loss(self.lopt.opt_fn(theta).get_params(unroll_state), key, data)

  def get_batch(self, steps=None):
    return training.vec_get_batch(self.task, steps, split="train")

  def get_outer_batch(self, steps=None):
    return training.vec_get_batch(self.task, steps, split="train")
