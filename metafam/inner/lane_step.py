"""One inner step of every lane of a `TruncatedStep`: the lanes' state, a fresh lane, the step and its outputs.

`LaneState` holds each lane's config, optimizer state, iteration and trajectory length; `fresh_lane` starts a lane;
`step_lanes` runs one step of every lane: the single-lane pieces of `metafam.inner.step` mapped over the lanes
(`jax.vmap`) around the theta-free computations that may go non-finite, which are wrapped in
`masking.cut_unless_finite`; `UnrollOutput` is what each step reports. `TruncatedStep` scans these steps and resets
the lanes whose trajectory ended with fresh ones.

Timeline of a lane (the contract the outer-gradient estimators rely on). A trajectory of length ``L`` consists of
exactly ``L`` steps with ``iteration = 0, 1, ..., L - 1``. In the step at iteration ``t`` the lane

  1. computes the train loss and gradient at its current params on a fresh train batch (``loss``: *before* the
     update) and applies the optimizer update;
  2. computes ``meta_loss``: the loss of the *updated* params on the meta-loss data (``meta_loss_split``);
  3. if ``t == L - 1`` or anything went non-finite, resets at the end of the same step: samples a new config from
     the family, new params, a new optimizer state and a new length from the schedule, with ``iteration = 0``.

So every step's outputs belong to exactly one trajectory and every output is valid (no wasted reset steps):
``is_new_trajectory`` is True exactly for the first step (iteration 0) of a trajectory, and that step belongs to the
*new* trajectory; ``is_done`` is True exactly for a trajectory's last step, which belongs to the *old* one. A step
whose loss, gradient, meta-loss or updated params are non-finite has ``mask = 0`` (its losses are reported as 0) and
ends its trajectory, so one diverging lane never poisons the others: not in the forward pass, and not in reverse
mode either, where a masked step sends exact zeros back into theta and into its lane's earlier steps (see
`masking.cut_unless_finite`), so the meta-gradient of a truncation is that of its masked loss.
``UnrollOutput.nonfinite`` says what went non-finite first in each masked step (`NONFINITE_CAUSES`), and
`TruncatedStep.unroll` reports masked steps (``on_nonfinite``, `metafam.nonfinite`): a warning naming the causes,
the lanes, the first step and the fraction of steps masked.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from metafam.inner import masking
from metafam.inner import step as step_lib
from metafam.optimizers.base import Optimizer
from metafam.taskfamilies.base import TaskFamily
from metafam.tasks.base import check_array_leaves

# What `UnrollOutput.nonfinite` codes 1, 2, 3, 4 name: the first non-finite value of a masked step.
NONFINITE_CAUSES = ("loss", "gradient", "meta-loss", "updated params")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LaneState:
  """Per-lane inner state; every leaf has a leading ``num_tasks`` axis.

  Attributes:
    cfg: the family config of the current task instance.
    opt_state: the inner optimizer state (it carries the params and the model state).
    iteration: int32, the step index within the current trajectory.
    length: int32, the current trajectory's length.
  """
  cfg: Any
  opt_state: Any
  iteration: jax.Array
  length: jax.Array

  @property
  def inner_step(self) -> jax.Array:
    """``iteration`` under learned_optimization's name (`metafam.compat.learned_optimization`)."""
    return self.iteration


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class UnrollOutput:
  """Per-step outputs, each of shape ``[num_steps, num_tasks]``.

  Attributes:
    loss: train-batch loss before the step's update (0 where ``mask == 0``).
    normalized_loss: ``task.normalizer(loss)``.
    meta_loss: loss of the updated params on the meta-loss data (0 where ``mask == 0``).
    normalized_meta_loss: ``task.normalizer(meta_loss)``.
    mask: float32, 1 for a finite step, 0 for a step that went non-finite (loss, gradient, meta-loss or params).
    iteration: int32, the step's index within its trajectory.
    is_new_trajectory: bool, this step is the first (iteration 0) of its trajectory.
    is_done: bool, this step is the last of its trajectory (length reached or non-finite); the lane resets after it.
    cfg: the family config of the trajectory the step belongs to (leaves ``[num_steps, num_tasks, ...]``), only when
      the unroll was asked for it (``with_cfg=True``); None otherwise, so it costs nothing by default.
    nonfinite: int8, 0 for a finite step, else what went non-finite first: 1 the loss, 2 the gradient (the loss
      being finite), 3 the meta-loss, 4 the updated params (`NONFINITE_CAUSES`); ``mask == 0`` exactly where it is
      not 0.
  """
  loss: jax.Array
  normalized_loss: jax.Array
  meta_loss: jax.Array
  normalized_meta_loss: jax.Array
  mask: jax.Array
  iteration: jax.Array
  is_new_trajectory: jax.Array
  is_done: jax.Array
  cfg: Any = None
  nonfinite: Any = None


class StepDraws(NamedTuple):
  """One inner step's random draws, per lane (leading lane axis): the `step_lib.StepKeys`, the train batch's example
  indices (None without data), the meta-loss batch's (None unless ``meta_loss_split`` names a split) and the key a
  lane resets with."""
  keys: step_lib.StepKeys
  batch: Optional[jax.Array]
  meta_batch: Optional[jax.Array]
  reset: jax.Array


def fresh_lane(family: TaskFamily, schedule: Any, opt_fn: Callable[[Any], Optimizer], theta: Any, key: jax.Array,
               random_offset: bool) -> LaneState:
  """A fresh lane: a config sampled from ``family``, its params and model state, a trajectory length from
  ``schedule`` and the optimizer state of ``opt_fn(theta)``; with ``random_offset`` it starts at a uniform iteration
  of that trajectory."""
  k_cfg, k_init, k_len, k_off, k_opt = jax.random.split(key, 5)
  cfg = family.sample(k_cfg)
  task = family.task_fn(cfg)
  params, model_state = task.init_with_state(k_init)
  check_array_leaves(f"task {getattr(task, 'name', type(task).__name__)!r}", "params", params)
  length = schedule.sample(k_len)
  iteration = jnp.asarray(0, jnp.int32)
  if random_offset:
    iteration = jax.random.randint(k_off, (), 0, jnp.maximum(length, 1), jnp.int32)
  # The optimizer is told the updates it will make: a lane started at a random offset runs the rest of its length.
  opt_state = opt_fn(theta).init(params, model_state=model_state, num_steps=length - iteration, key=k_opt)
  return LaneState(cfg=cfg, opt_state=opt_state, iteration=iteration, length=length)


def step_lanes(family: TaskFamily, opt_fn: Callable[[Any], Optimizer], theta: Any, lanes: LaneState,
               draws: StepDraws, data: Any, theta_axis: Any, *, meta_loss_split: Optional[str],
               lane_chunk: Optional[int], with_cfg: bool = False):
  """One step of every lane in ``lanes`` (leading lane axis) with the step's per-lane random ``draws``; theta is
  shared (``theta_axis=None``), or per lane (``theta_axis``: `low_rank.lane_axes`).

  Per-lane pieces (`jax.vmap`) around the two theta-free computations that may go non-finite, which are wrapped
  in `masking.cut_unless_finite` over all lanes; see the module docstring for the step's timeline.
  """
  per_lane = lambda fn, *in_axes: jax.vmap(fn, in_axes=in_axes)

  def inputs(th, lane, draw):
    opt = opt_fn(th)
    take = lambda name, idx: None if data is None else data[name].take(idx)  # data-free tasks get batch None
    batch = take("train", draw.batch)
    meta_batch = batch if draw.meta_batch is None else take(meta_loss_split, draw.meta_batch)
    diff = (opt.get_params(lane.opt_state), opt.get_state(lane.opt_state))
    return diff, (draw.keys.loss, batch), (draw.keys.meta, meta_batch), draw.keys.opt

  params_and_state, loss_data, meta_data, k_opt = per_lane(inputs, theta_axis, 0, 0)(theta, lanes, draws)

  def loss_and_grad(diff, rest):
    (p, s), (cfg, (k, b)) = diff, rest
    loss, new_s, grad = step_lib.loss_and_grad(family.task_fn(cfg), p, s, k, b)
    # The params leave through the cut too, for the update: so their cotangents add up in the order of plain
    # reverse mode (the update's, then the loss's).
    return (loss, new_s, grad, p), jnp.isfinite(loss) & step_lib.all_finite(grad)

  (loss, new_model_state, grad, params), grad_ok = masking.cut_unless_finite(loss_and_grad)(
      params_and_state, (lanes.cfg, loss_data))

  def update(th, opt_state, params, grad, loss, new_model_state, key):
    opt = opt_fn(th)
    # The state with the params that passed through the cut (the leaves get_params returns, replaced).
    by_id = {id(p): q for p, q in zip(jax.tree.leaves(opt.get_params(opt_state)), jax.tree.leaves(params))}
    opt_state = jax.tree.map(lambda x: by_id.get(id(x), x), opt_state)
    new = step_lib.apply_update(opt, opt_state, grad, loss, new_model_state, key)
    return new, (opt.get_params(new), opt.get_state(new))

  # Where the loss or gradient went non-finite the step is masked; under differentiation its update then sees a
  # zero gradient and loss, so that the update's pullback is taken at finite values and sends exact zeros back.
  grad_in, loss_in = masking.zero_unless_ok_in_reverse_mode((grad, loss), grad_ok)
  opt_state, new_params_and_state = step_lib.map_lanes(
      update, (theta_axis, 0, 0, 0, 0, 0, 0), (theta, lanes.opt_state, params, grad_in, loss_in, new_model_state,
                                                k_opt), lane_chunk)
  if meta_loss_split is None:
    meta_loss = loss
  else:
    def meta_loss_fn(diff, rest):
      (p, s), (cfg, (k, b)) = diff, rest
      value = step_lib.meta_loss(family.task_fn(cfg), p, s, k, b)
      return value, jnp.isfinite(value) & step_lib.all_finite(p)

    meta_loss, _ = masking.cut_unless_finite(meta_loss_fn)(new_params_and_state, (lanes.cfg, meta_data))

  def outputs(lane, loss, meta_loss, grad_ok, new_params):
    task = family.task_fn(lane.cfg)
    meta_ok, params_ok = jnp.isfinite(meta_loss), step_lib.all_finite(new_params)
    finite = grad_ok & meta_ok & params_ok
    cause = jnp.select([~jnp.isfinite(loss), ~grad_ok, ~meta_ok, ~params_ok], [1, 2, 3, 4], 0).astype(jnp.int8)
    zero = jnp.zeros_like(loss)
    out = dict(loss=jnp.where(finite, loss, zero), meta_loss=jnp.where(finite, meta_loss, zero))
    out["normalized_loss"] = jnp.where(finite, task.normalizer(out["loss"]), zero)
    out["normalized_meta_loss"] = jnp.where(finite, task.normalizer(out["meta_loss"]), zero)
    is_done = (lane.iteration + 1 >= lane.length) | ~finite
    out.update(mask=finite.astype(jnp.float32), iteration=lane.iteration, is_new_trajectory=lane.iteration == 0,
               is_done=is_done, nonfinite=cause)
    if with_cfg:
      out["cfg"] = lane.cfg
    return UnrollOutput(**out), is_done

  out, is_done = per_lane(outputs, 0, 0, 0, 0, 0)(lanes, loss, meta_loss, grad_ok, new_params_and_state[0])
  new_lanes = LaneState(cfg=lanes.cfg, opt_state=opt_state, iteration=lanes.iteration + 1, length=lanes.length)
  return new_lanes, out, is_done
