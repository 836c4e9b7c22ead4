"""Fixed-length training of one task or of M vmapped members, with evaluation points: the `Runner` engine.

It sits below `metafam.evaluation` (`train_and_evaluate`) and `metafam.training` (`Trainer`), which both drive it,
and the compatibility layer's ``eval_training``:

* The steps between two evaluation points are one jitted `lax.scan`. When the task's datasets are all `ArraySplit`s
  (``datasets.has_device_data``) every split is moved to the device once and batches are gathered inside the scan
  from `DeviceData.sample`; otherwise the chunk's batches are pulled from the host iterators, stacked and scanned
  over. Data-free tasks (``datasets is None``) get ``batch=None``.
* The jitted functions live at module level with the task and optimizer as static arguments (hashed by identity and
  held weakly, `metafam._identity`, so the cache does not keep them alive), so a (task, optimizer, mode) triple
  compiles once per chunk length and is reused across calls.
* Randomness is a function of the step, not of the chunking: step ``t`` uses ``fold_in(train_key, t)`` split into
  (batch, loss, optimizer) keys, and the evaluation at step ``s`` uses ``fold_in(eval_key, s)``, so curves do not
  depend on ``eval_every``. On the device path (and for data-free tasks) instance ``i`` of a vectorized run with
  key ``k`` equals a single run with key ``jax.random.split(k, n)[i]``.
* Losses come from ``loss_with_state`` / ``init_with_state``; the model state travels in the optimizer state.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam._checks import check_positive_int
from metafam._identity import IdentityKey as _ByIdentity
from metafam.datasets.base import SPLITS, DeviceData
from metafam.inner.step import (all_finite, apply_update, draw_train_step, loss_and_grad_drawn, map_lanes,
                                scalar_loss, scan_with_draws, train_step_drawn)
from metafam.optimizers.base import OptaxOptimizer, Optimizer
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks.base import Task, check_array_leaves

OptimizerLike = Union[Optimizer, optax.GradientTransformation]


# -- argument checking --------------------------------------------------------------------------------------------
def check_splits(name: str, splits: Sequence[str]) -> Tuple[str, ...]:
  """A non-empty tuple of distinct split names from `SPLITS`, else a ValueError naming ``name``."""
  if isinstance(splits, str):
    splits = (splits,)
  splits = tuple(splits)
  unknown = [s for s in splits if s not in SPLITS]
  if not splits or unknown or len(set(splits)) != len(splits):
    raise ValueError(f"{name} must be distinct names from {SPLITS}, got {splits!r}"
                     + (f" (unknown: {unknown})." if unknown else "."))
  return splits


def as_optimizer(optimizer: OptimizerLike) -> Optimizer:
  """An `Optimizer` as is; a raw `optax.GradientTransformation` wrapped in `OptaxOptimizer`."""
  if isinstance(optimizer, Optimizer):
    return optimizer
  if isinstance(optimizer, optax.GradientTransformation):
    return OptaxOptimizer(optimizer)
  raise TypeError(f"optimizer must be a metafam Optimizer or an optax.GradientTransformation, "
                  f"got {type(optimizer).__name__}.")


def _is_typed_key(key: jax.Array) -> bool:
  return jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)


def as_keys(key: Optional[jax.Array], num: Optional[int] = None) -> jax.Array:
  """Normalizes ``key`` to typed keys: one key (``num=None``) or ``num`` keys.

  Accepts None (``jax.random.key(0)``), a typed key or a raw ``uint32[2]`` key; with ``num`` also a batch of
  ``num`` keys (typed ``[num]`` or raw ``[num, 2]``), used as given, while a single key is split into ``num``.
  """
  key = jax.random.key(0) if key is None else jnp.asarray(key)
  if not _is_typed_key(key):
    if key.dtype != jnp.uint32 or key.ndim < 1 or key.shape[-1] != 2:
      raise TypeError(f"key must be a jax.random.key or a raw uint32[..., 2] key, got {key.dtype}{list(key.shape)}.")
    key = jax.random.wrap_key_data(key)
  if num is None:
    if key.ndim:
      raise ValueError(f"key must be a single key, got a batch of shape {key.shape}.")
    return key
  if key.ndim == 0:
    return jax.random.split(key, num)
  if key.shape != (num,):
    raise ValueError(f"key must be one key or a batch of {num} keys, got a batch of shape {key.shape}.")
  return key


# -- keys ---------------------------------------------------------------------------------------------------------
@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RunKeys:
  """The typed keys of a run. Member fields are scalars (single run) or ``[M]`` (one per member).

  Attributes:
    cfg: samples the task config (families only).
    init: initializes params and model state.
    opt: initializes the optimizer.
    train: step ``t`` uses ``fold_in(train, t)``.
    eval: the evaluation at step ``s`` uses ``fold_in(eval, s)``.
    shared_train, shared_eval: scalar keys of batches shared by all members (ensembles with shared batches).
  """
  cfg: jax.Array
  init: jax.Array
  opt: jax.Array
  train: jax.Array
  eval: jax.Array
  shared_train: jax.Array
  shared_eval: jax.Array


def derive_keys(key: Optional[jax.Array], num_members: Optional[int] = None) -> RunKeys:
  """`RunKeys` from one key (or ``num_members`` keys); member ``i`` of ``split(key, n)`` is a single run's key."""
  if num_members is None:
    root = as_keys(key)
    per_member = jax.random.split(root, 5)
  else:
    keys = as_keys(key, num_members)
    root = keys[0]
    per_member = jax.vmap(lambda k: jax.random.split(k, 5), out_axes=1)(keys)
  shared_train, shared_eval = jax.random.split(jax.random.fold_in(root, 0x5EED), 2)
  return RunKeys(*per_member, shared_train=shared_train, shared_eval=shared_eval)


# -- jitted programs ----------------------------------------------------------------------------------------------
def _task_of(obj: Union[Task, TaskFamily], cfg: Any) -> Task:
  return obj.task_fn(cfg) if isinstance(obj, TaskFamily) else obj


def _init_member(obj, opt, num_steps, cfg_key, init_key, opt_key):
  cfg = obj.sample(cfg_key) if isinstance(obj, TaskFamily) else None
  task = _task_of(obj, cfg)
  params, model_state = task.init_with_state(init_key)
  check_array_leaves(f"task {getattr(task, 'name', type(task).__name__)!r}", "params", params)
  return cfg, opt.init(params, model_state=model_state, num_steps=num_steps, key=opt_key)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _init_program(obj, opt, vmapped, num_steps, keys):
  fn = functools.partial(_init_member, obj.value, opt.value, num_steps)
  if vmapped:
    fn = jax.vmap(fn)
  return fn(keys.cfg, keys.init, keys.opt)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5, 6))
def _train_program(obj, opt, vmapped, data_kind, shared, lane_chunk, checked, opt_state, cfg, keys, steps,
                   host_batches, device_data):
  """Scans ``len(steps)`` updates. Losses: ``f32[L]`` or ``f32[L, M]``. The members' losses and gradients are one
  vmap; their updates are one too, or blocks of ``lane_chunk`` members in sequence (`map_lanes`). With ``checked``
  the per-step outputs are ``(losses, nonfinite)``: ``nonfinite`` (int8, shaped like the losses) is 0 for a finite
  step, 1 where the loss went non-finite, 2 where the loss is finite and the gradient is not (the same updates).

  ``host_batches`` (host mode) has a leading step axis, then a member axis unless shared; ``device_data`` is the
  train `DeviceData` (device mode), sampled per member or, when shared, once per step from ``keys.shared_train``.
  """
  obj, opt = obj.value, opt.value
  per_member_device = data_kind == "device" and not (vmapped and shared)
  member_data = device_data if per_member_device else None

  def draws(xs):
    """A step's random draws: each member's keys (and batch indices), or the shared batch's indices."""
    step = xs[0]
    member_draws = lambda train_key: draw_train_step(jax.random.fold_in(train_key, step), member_data)
    shared_batch = None
    if data_kind == "device" and not per_member_device:
      shared_batch = device_data.indices(jax.random.split(jax.random.fold_in(keys.shared_train, step), 3)[0])
    return (jax.vmap(member_draws) if vmapped else member_draws)(keys.train), shared_batch

  def member_grad(opt_state, cfg, member_draws, batch):
    return loss_and_grad_drawn(_task_of(obj, cfg), opt, opt_state, member_draws, member_data, batch)

  def member_update(opt_state, grad, loss, model_state, key):
    return apply_update(opt, opt_state, grad, loss, model_state, key)

  def nonfinite(loss, grad):
    return jnp.where(jnp.isfinite(loss), jnp.where(all_finite(grad), 0, 2), 1).astype(jnp.int8)

  def body(opt_state, xs_and_draws):
    (_, batch), (member_draws, shared_batch) = xs_and_draws
    if shared_batch is not None:
      batch = device_data.take(shared_batch)
    if not vmapped:
      if not checked:
        return train_step_drawn(_task_of(obj, cfg), opt, opt_state, member_draws, member_data, batch)
      loss, model_state, grad = loss_and_grad_drawn(_task_of(obj, cfg), opt, opt_state, member_draws, member_data,
                                                    batch)
      new_state = apply_update(opt, opt_state, grad, loss, model_state, member_draws.keys.opt)
      return new_state, (loss, nonfinite(loss, grad))
    batch_axis = 0 if data_kind == "host" and not shared else None
    loss, model_state, grad = jax.vmap(member_grad, in_axes=(0, 0, 0, batch_axis))(opt_state, cfg, member_draws,
                                                                                   batch)
    args = (opt_state, grad, loss, model_state, member_draws.keys.opt)
    new_state = map_lanes(member_update, (0,) * len(args), args, lane_chunk)
    return new_state, ((loss, jax.vmap(nonfinite)(loss, grad)) if checked else loss)

  # The steps' random numbers are drawn before the loop, a block of steps at once (the same numbers).
  return scan_with_draws(body, opt_state, (steps, host_batches), draws)


def _eval_keys(eval_key, step, splits, num_batches):
  """``[S, K + 1]`` keys per evaluated split: its batch key, then K loss keys.

  One split of ``fold_in(eval_key, step)`` into ``[4, K + 1]`` keys with rows in `SPLITS` order, so a split's keys
  do not depend on which other splits are evaluated.
  """
  keys = jax.random.split(jax.random.fold_in(eval_key, step), len(SPLITS) * (num_batches + 1))
  return keys.reshape(len(SPLITS), num_batches + 1)[np.array([SPLITS.index(s) for s in splits])]


def _sample_eval_batches(device_data, splits, keys):
  """``[S * K, ...]`` batches: one draw of ``K * batch_size`` examples per split with its batch key ``keys[s, 0]``.

  That is K i.i.d. batches (sampling is with replacement), and one draw compiles much faster than K draws.
  """
  num_batches = keys.shape[1] - 1
  parts = []
  for i, s in enumerate(splits):
    data = device_data[s]
    flat = DeviceData(data.arrays, data.batch_size * num_batches).sample(keys[i, 0])
    parts.append(jax.tree.map(lambda x, b=data.batch_size: x.reshape((num_batches, b) + x.shape[1:]), flat))
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5, 6))
def _eval_program(obj, opt, vmapped, data_kind, shared, splits, num_batches, opt_state, cfg, keys, step,
                  host_batches, device_data):
  """Mean loss over ``num_batches`` batches per split: ``{split: f32[]}`` or ``{split: f32[M]}``.

  All splits' batches are stacked (``[S * K, ...]``) and go through one `lax.map` of the loss, so the loss is
  compiled once, not once per split. Host batches are shared by all members; device batches are sampled per
  member from its eval key or, when shared, from ``keys.shared_eval``.
  """
  obj, opt = obj.value, opt.value
  per_member_device = data_kind == "device" and not (vmapped and shared)

  def member(opt_state, cfg, eval_key, batches):
    task = _task_of(obj, cfg)
    params, model_state = opt.eval_params(opt_state), opt.get_state(opt_state)
    keys = _eval_keys(eval_key, step, splits, num_batches)
    if per_member_device:
      batches = _sample_eval_batches(device_data, splits, keys)

    def one(xs):
      loss_key, batch = xs
      return scalar_loss(task, task.loss_with_state(params, model_state, loss_key, batch)[0])

    loss_keys = keys[:, 1:].reshape(len(splits) * num_batches)
    losses = jax.lax.map(one, (loss_keys, batches)).reshape(len(splits), num_batches).mean(axis=1)
    return {s: losses[i] for i, s in enumerate(splits)}

  batches = host_batches
  if data_kind == "device" and not per_member_device:
    batches = _sample_eval_batches(device_data, splits, _eval_keys(keys.shared_eval, step, splits, num_batches))
  if not vmapped:
    return member(opt_state, cfg, keys.eval, batches)
  return jax.vmap(member, in_axes=(0, 0, 0, None))(opt_state, cfg, keys.eval, batches)


def _stack_host(batches):
  return jax.tree.map(lambda *xs: np.stack(xs), *batches)


# -- the engine ---------------------------------------------------------------------------------------------------
class Runner:
  """Compiled training chunks and evaluations of one task, or of M vmapped members (seeds or family samples).

  Args:
    task_or_family: a `Task`, or a `TaskFamily` (then ``num_members`` is required and each member samples a config).
    optimizer: a metafam `Optimizer` or an optax transformation.
    num_members: None for one unbatched run, else M (every state and curve gets a member axis).
    splits: the splits `evaluate` reports.
    eval_batches: batches averaged per split and evaluation.
    shared_train: members train on the same batch each step (else each member draws its own).
    shared_eval: members are evaluated on the same batches (else each member draws its own; host batches are
      always shared).
    use_device_data: None picks the device path when ``datasets.has_device_data``; True requires it; False forces
      the host iterators (then evaluating ``train`` draws from the training iterator itself).
    lane_chunk: apply the optimizer's update to blocks of this many members in sequence (`jax.lax.map`) when there
      are more; None: all members in one vmap. Only float rounding differs. On a CPU, Muon's update (Newton-Schulz
      matrix products) runs faster member by member (``benchmarks/step_cost.py --members``).
  """

  def __init__(self, task_or_family: Union[Task, TaskFamily], optimizer: OptimizerLike, *,
               num_members: Optional[int] = None, splits: Sequence[str] = SPLITS, eval_batches: int = 1,
               shared_train: bool = False, shared_eval: bool = False, use_device_data: Optional[bool] = None,
               lane_chunk: Optional[int] = None):
    if not isinstance(task_or_family, (Task, TaskFamily)):
      raise TypeError(f"task must be a metafam Task or TaskFamily, got {type(task_or_family).__name__}.")
    if isinstance(task_or_family, TaskFamily) and num_members is None:
      raise ValueError("a TaskFamily needs num_members (the number of sampled instances to train).")
    self.obj = task_or_family
    self.optimizer = as_optimizer(optimizer)
    self.num_members = None if num_members is None else check_positive_int("num_members", num_members)
    self.splits = check_splits("splits", splits)
    self.eval_batches = check_positive_int("eval_batches", eval_batches)
    self.shared_train, self.shared_eval = bool(shared_train), bool(shared_eval)
    self.lane_chunk = None if lane_chunk is None else check_positive_int("lane_chunk", lane_chunk)
    self.datasets = task_or_family.datasets
    if self.datasets is None:
      self.data_kind = "none"
    elif use_device_data is None:
      self.data_kind = "device" if self.datasets.has_device_data else "host"
    elif use_device_data:
      if not self.datasets.has_device_data:
        raise ValueError(f"use_device_data=True, but the datasets of {task_or_family.name!r} are not all "
                         "ArraySplits, so they have no device path.")
      self.data_kind = "device"
    else:
      self.data_kind = "host"
    if self.data_kind == "device":
      self.train_data = self.datasets.device_data("train")
      self.eval_data = {s: self.datasets.device_data(s) for s in self.splits}
    else:
      self.train_data, self.eval_data = None, None
    self._obj, self._opt = _ByIdentity(self.obj), _ByIdentity(self.optimizer)

  @property
  def vmapped(self) -> bool:
    return self.num_members is not None

  def keys(self, key: Optional[jax.Array]) -> RunKeys:
    return derive_keys(key, self.num_members)

  def init(self, keys: RunKeys, num_steps: Optional[int] = None) -> Tuple[Any, Any]:
    """``(cfg, opt_state)``; cfg is None for a `Task`, else the sampled configs ``[M, ...]``."""
    return _init_program(self._obj, self._opt, self.vmapped, num_steps, keys)

  def train(self, opt_state: Any, cfg: Any, keys: RunKeys, start: int, length: int, checked: bool = False):
    """Runs steps ``start .. start + length - 1``; returns ``(opt_state, losses f32[L] or f32[L, M])``, with
    ``checked`` ``(opt_state, (losses, nonfinite))``: ``nonfinite`` int8 like the losses, 0 for a finite step, 1 a
    non-finite loss, 2 a finite loss with a non-finite gradient (a separate program; the same updates)."""
    host = None
    if self.data_kind == "host":
      split = self.datasets.split("train")
      per_step = 1 if not self.vmapped or self.shared_train else self.num_members
      if per_step == 1:
        host = _stack_host([next(split) for _ in range(length)])
      else:
        host = _stack_host([_stack_host([next(split) for _ in range(per_step)]) for _ in range(length)])
    steps = jnp.arange(start, start + length, dtype=jnp.int32)
    return _train_program(self._obj, self._opt, self.vmapped, self.data_kind, self.shared_train, self.lane_chunk,
                          bool(checked), opt_state, cfg, keys, steps, host, self.train_data)

  def evaluate(self, opt_state: Any, cfg: Any, keys: RunKeys, step: int) -> Dict[str, jax.Array]:
    """``{split: mean loss}`` (scalars, or ``[M]``) over ``eval_batches`` batches per split."""
    host = None
    if self.data_kind == "host":
      host = _stack_host([next(self.datasets.split(s)) for s in self.splits for _ in range(self.eval_batches)])
    return _eval_program(self._obj, self._opt, self.vmapped, self.data_kind, self.shared_eval, self.splits,
                         self.eval_batches, opt_state, cfg, keys, jnp.asarray(step, jnp.int32), host,
                         self.eval_data)

  def params(self, opt_state: Any) -> Any:
    return jax.vmap(self.optimizer.get_params)(opt_state) if self.vmapped else self.optimizer.get_params(opt_state)

  def model_state(self, opt_state: Any) -> Any:
    return jax.vmap(self.optimizer.get_state)(opt_state) if self.vmapped else self.optimizer.get_state(opt_state)


def eval_points(num_steps: int, eval_every: int) -> np.ndarray:
  """Steps after which to evaluate: 0, eval_every, 2 * eval_every, ... and always num_steps. ``i32[E]``."""
  return np.unique(np.append(np.arange(0, num_steps, eval_every), num_steps)).astype(np.int32)
