"""Vectorized, truncated inner training: ``num_tasks`` lanes of task instances trained by one (learned) optimizer.

Each lane holds its own task config, optimizer state (which carries the params), inner iteration and trajectory
length. `TruncatedStep.unroll` runs ``num_steps`` inner steps for all lanes in one jitted `lax.scan` over a `vmap`,
with batches gathered on the device from splits handed over once.

Timeline of a lane (the contract the outer-gradient estimators rely on). A trajectory of length ``L`` consists of
exactly ``L`` steps with ``iteration = 0, 1, ..., L - 1``. In the step at iteration ``t`` the lane

  1. computes the train loss and gradient at its current params on a fresh train batch (``loss``: *before* the
     update) and applies the optimizer update;
  2. computes ``meta_loss``: the loss of the *updated* params on the meta-loss data (``meta_loss_split``);
  3. if ``t == L - 1`` or anything went non-finite, resets at the end of the same step: samples a new config from
     the family, new params, a new optimizer state and a new length from the schedule, with ``iteration = 0``.

So every step's outputs belong to exactly one trajectory and every output is valid (no wasted reset steps):
``is_new_trajectory`` is True exactly for the first step (iteration 0) of a trajectory, and that step belongs to the
*new* trajectory; ``is_done`` is True exactly for a trajectory's last step, which
belongs to the *old* one. A step whose loss, gradient, meta-loss or updated params are non-finite has ``mask = 0``
(its losses are reported as 0) and ends its trajectory, so one diverging lane never poisons the others: not in the
forward pass, and not in reverse mode either, where a masked step sends exact zeros back into theta and into its
lane's earlier steps (see `_cut_unless_finite`), so the meta-gradient of a truncation is that of its masked loss.

With ``random_initial_iteration=True``, `init_step_state` starts each lane at a uniform iteration in ``[0, L)`` of
a fresh trajectory (fresh params), so resets are staggered across lanes; those first, shortened trajectories begin
at a nonzero iteration and thus have no ``is_new_trajectory`` step.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from metafam.datasets.base import SPLITS
from metafam.inner import sharding
from metafam.inner.schedules import ConstantSchedule
from metafam.optimizers.base import Optimizer
from metafam.optimizers.learned import HandDesigned
from metafam.taskfamilies.base import TaskFamily

META_LOSS_SPLITS = ("same_batch",) + SPLITS


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["cfg", "opt_state", "iteration", "length"], meta_fields=[])
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


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["loss", "normalized_loss", "meta_loss", "normalized_meta_loss", "mask", "iteration",
                                "is_new_trajectory", "is_done"], meta_fields=[])
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
  """
  loss: jax.Array
  normalized_loss: jax.Array
  meta_loss: jax.Array
  normalized_meta_loss: jax.Array
  mask: jax.Array
  iteration: jax.Array
  is_new_trajectory: jax.Array
  is_done: jax.Array


def _all_finite(tree: Any) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def _select(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def _lane_axes(batched_fn, diff, rest, residuals: list, num_lanes: int) -> Optional[list]:
  """The lane axis of each of ``residuals``, the leaves of ``jax.vjp(batched_fn, diff)``'s pullback (None: it has
  none), or None if they cannot be told.

  Found by tracing (shapes only) the same vjp for ``num_lanes`` and ``num_lanes + 1`` lanes: the axis whose size
  changes is the lane axis. None unless the first trace reproduces ``residuals`` leaf for leaf and the second
  differs from it in at most one axis per leaf.
  """
  def residual_shapes(n):
    spec = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct((n,) + tuple(x.shape[1:]), x.dtype), tree)
    leaves = lambda d, r: jax.tree.leaves(jax.vjp(lambda d: batched_fn(d, r), d, has_aux=True)[1])
    return [tuple(x.shape) for x in jax.eval_shape(leaves, spec(diff), spec(rest))]

  now, more = residual_shapes(num_lanes), residual_shapes(num_lanes + 1)
  if now != [tuple(jnp.shape(r)) for r in residuals] or len(more) != len(now):
    return None
  axes = []
  for a, b in zip(now, more):
    changed = [i for i, (x, y) in enumerate(zip(a, b)) if x != y] if len(a) == len(b) else None
    if changed is None or len(changed) > 1 or (changed and (a[changed[0]], b[changed[0]]) != (num_lanes,
                                                                                             num_lanes + 1)):
      return None
    axes.append(changed[0] if changed else None)
  return axes


def _cut_unless_finite(fn):
  """``fn(diff, rest) -> (outputs, ok)`` mapped over lanes (`jax.vmap`; every leaf has a leading lane axis),
  differentiable w.r.t. ``diff``, whose pullback sends nothing back from a lane that is not ``ok``.

  Wraps the theta-free pieces of a step that can go non-finite from finite inputs (the train loss with its gradient,
  and the meta-loss); a lane that is not ``ok`` is masked in that step. A masked step reports constants and its
  lane resets, so the cotangents reaching its outputs are exactly 0, and so must be those of its inputs. Plain
  reverse mode multiplies those zeros with partial derivatives taken at the non-finite point (``0 * NaN = NaN``):
  one such lane used to turn the whole meta-gradient into NaN (then zeroed). Here, in the lanes that are not
  ``ok``, the pullback's floating residuals are replaced by ones (the double-where pattern, applied to the
  residuals), so it maps their zero cotangents to exact zeros. Otherwise the values, residuals and pullback are
  those of plain reverse mode through `vmap` (the same operations). ``rest`` (configs, keys, batches: nothing that
  depends on theta) gets no cotangent. Reverse mode only (`jax.jvp` through an unroll raises).
  """
  batched_fn = jax.vmap(fn)

  @jax.custom_vjp
  def cut(diff, rest):
    return batched_fn(diff, rest)

  def fwd(diff, rest):
    outputs, pullback, ok = jax.vjp(lambda d: batched_fn(d, rest), diff, has_aux=True)
    leaves, treedef = jax.tree.flatten(pullback)
    axes = _lane_axes(batched_fn, diff, rest, leaves, ok.shape[0])
    if axes is None:  # residual layout unknown: select the pullback's per-lane results instead
      return (outputs, ok), (pullback, ok)

    def stand_in(r, axis):
      if axis is None or not jnp.issubdtype(r.dtype, jnp.inexact):
        return r
      return jnp.where(jnp.expand_dims(ok, [i for i in range(r.ndim) if i != axis]), r, jnp.ones_like(r))

    return (outputs, ok), (jax.tree.unflatten(treedef, [stand_in(r, a) for r, a in zip(leaves, axes)]), None)

  def bwd(residuals, cts):
    pullback, ok = residuals
    (ct_diff,) = pullback(cts[0])
    if ok is not None:
      ct_diff = _zero_bad_lanes(ct_diff, ok)
    return ct_diff, None

  cut.defvjp(fwd, bwd)
  return cut


def _zero_bad_lanes(tree: Any, ok: jax.Array) -> Any:
  """``tree`` (leading lane axis) with the floating leaves of the lanes that are not ``ok`` set to 0 (a select)."""
  zero = lambda v: (jnp.where(jnp.expand_dims(ok, tuple(range(1, v.ndim))), v, jnp.zeros_like(v))
                    if jnp.issubdtype(v.dtype, jnp.inexact) else v)
  return jax.tree.map(zero, tree)


@jax.custom_vjp
def _zero_unless_ok_in_reverse_mode(x: Any, ok: jax.Array) -> Any:
  """``x`` itself (leading lane axis); in reverse mode, zeros in the lanes that are not ``ok``.

  Feeds the update the gradient (and loss) of a step: where they are non-finite the step is masked and the lane
  resets, so the update only matters to reverse mode, whose pullback would multiply zero cotangents by the NaN
  gradient. Only the differentiated program substitutes zeros (cotangents pass unchanged), and only when some lane
  is not ``ok`` (`lax.cond`): plain forward passes (ES, evaluation) compute exactly what they computed before.
  """
  return x


def _zero_unless_ok_fwd(x, ok):
  return jax.lax.cond(jnp.all(ok), lambda x: x, lambda x: _zero_bad_lanes(x, ok), x), None


def _zero_unless_ok_bwd(_, ct):
  return ct, None


_zero_unless_ok_in_reverse_mode.defvjp(_zero_unless_ok_fwd, _zero_unless_ok_bwd)


class TruncatedStep:
  """Trains ``num_tasks`` instances of ``family`` with ``learned_opt`` in truncated, vectorized unrolls.

  Args:
    family: the `TaskFamily`. Tasks with data need ``family.datasets`` built from `ArraySplit`s (device path).
    learned_opt: a learned optimizer (``opt_fn(theta) -> Optimizer``), or a plain `Optimizer` whose theta is ``{}``.
    num_tasks: number of lanes.
    schedule: the truncation schedule (default ``ConstantSchedule(50)``).
    random_initial_iteration: stagger lanes by starting each at a random iteration of its first trajectory.
    meta_loss_split: data for ``meta_loss``: "same_batch" (the step's training batch), a split name, or None to
      skip it (then ``meta_loss`` repeats ``loss`` at no extra cost).
    meta_loss_aux: report this aux value of the task (``loss_with_state_and_aux``) as ``meta_loss`` instead of the
      loss, e.g. "accuracy".
    antithetic: lanes ``i`` and ``i + num_tasks // 2`` form a pair: they draw the same keys (same configs, inits,
      lengths and batches) and reset together (a non-finite step in either ends the trajectory of both), so they
      differ only through their theta. ``num_tasks`` must be even.
    stack_antithetic: with ``antithetic``, run both halves as one vmap of ``num_tasks`` lanes (True) or as two
      vmaps of ``num_tasks // 2`` (False); the numbers are the same, only the batching differs.
    lane_groups: split the lanes into this many equal groups whose lane ``i`` draws the same keys (same instances
      and batches), e.g. to compare per-lane thetas on identical problems; unlike ``antithetic`` the groups reset
      independently. ``antithetic=True`` implies 2 groups.
    donate: donate the input state's buffers to `unroll` (the passed state must not be used afterwards).
    devices: spread the lanes over several devices: a count (the first ``n`` of `jax.devices()`) or a sequence of
      devices; ``num_tasks`` must divide evenly. The lane state is sharded along its lane axis, theta (unless per
      lane), keys and data are replicated; the numbers are the same as on one device. `init_step_state`,
      `unroll` and `unroll_with_keys` place their inputs; callers of the pure `init_fn` / `unroll_fn` inside their
      own jit must pass arrays that live on these devices (see `place_theta`). See `metafam.inner.sharding`.
  """

  def __init__(self, family: TaskFamily, learned_opt: Any, num_tasks: int, schedule: Any = None,
               random_initial_iteration: bool = False, meta_loss_split: Optional[str] = "same_batch",
               meta_loss_aux: Optional[str] = None, antithetic: bool = False, stack_antithetic: bool = True,
               lane_groups: int = 1, donate: bool = True, devices: Any = None):
    if not isinstance(family, TaskFamily):
      raise TypeError(f"family must be a TaskFamily, got {type(family).__name__}.")
    if isinstance(learned_opt, Optimizer):
      learned_opt = HandDesigned(learned_opt)
    if not hasattr(learned_opt, "opt_fn"):
      raise TypeError(f"learned_opt must be a learned optimizer (with opt_fn) or an Optimizer, "
                      f"got {type(learned_opt).__name__}.")
    if not isinstance(num_tasks, int) or isinstance(num_tasks, bool) or num_tasks < 1:
      raise ValueError(f"num_tasks must be a positive int (not a bool), got {num_tasks!r}.")
    if meta_loss_split is not None and meta_loss_split not in META_LOSS_SPLITS:
      raise ValueError(f"meta_loss_split must be None or one of {META_LOSS_SPLITS}, got {meta_loss_split!r}.")
    if meta_loss_aux is not None and meta_loss_split is None:
      raise ValueError("meta_loss_aux needs a meta_loss_split to evaluate the aux value on.")
    if antithetic and num_tasks % 2:
      raise ValueError(f"antithetic=True needs an even num_tasks (pairs of lanes), got {num_tasks}.")
    if antithetic and lane_groups not in (1, 2):
      raise ValueError(f"antithetic=True uses 2 lane groups; got lane_groups={lane_groups}.")
    if not isinstance(lane_groups, int) or isinstance(lane_groups, bool) or lane_groups < 1 or num_tasks % lane_groups:
      raise ValueError(f"lane_groups must be a positive int dividing num_tasks={num_tasks}, got {lane_groups!r}.")
    self.lane_groups = 2 if antithetic else lane_groups
    self.antithetic, self.stack_antithetic = antithetic, stack_antithetic
    self.meta_loss_aux = meta_loss_aux
    self.family, self.learned_opt, self.num_tasks = family, learned_opt, num_tasks
    self.schedule = ConstantSchedule(50) if schedule is None else schedule
    if not hasattr(self.schedule, "sample"):
      raise TypeError(f"schedule must have sample(key) -> length, got {type(self.schedule).__name__}.")
    self.random_initial_iteration = random_initial_iteration
    self.meta_loss_split = meta_loss_split
    self.mesh = sharding.lane_mesh(devices, num_tasks)
    self.data = sharding.put_replicated(self._device_data(), self.mesh)
    self._unroll = jax.jit(self.unroll_fn, static_argnames=("theta_is_batched",),
                           donate_argnames=("state",) if donate else ())
    self._init = jax.jit(self.init_fn, static_argnames=("theta_is_batched",))

  # -- data ----------------------------------------------------------------------------------------------------
  def _device_data(self):
    datasets = self.family.datasets
    if datasets is None:
      return None
    if not datasets.has_device_data:
      raise TypeError(f"{self.family.name}: vectorized training samples batches on the device and needs every "
                      "split of family.datasets to be an ArraySplit (metafam.datasets.ArraySplit).")
    splits = {"train"} | ({self.meta_loss_split} - {None, "same_batch"})
    return {name: datasets.device_data(name) for name in sorted(splits)}

  @staticmethod
  def _sample(data, split, key):
    return None if data is None else data[split].sample(key)

  # -- the lanes ----------------------------------------------------------------------------------------------
  def _fresh_lane(self, theta, key, random_offset: bool) -> LaneState:
    k_cfg, k_init, k_len, k_off, k_opt = jax.random.split(key, 5)
    cfg = self.family.sample(k_cfg)
    params, model_state = self.family.task_fn(cfg).init_with_state(k_init)
    length = self.schedule.sample(k_len)
    opt_state = self.learned_opt.opt_fn(theta).init(params, model_state=model_state, num_steps=length, key=k_opt)
    iteration = jnp.asarray(0, jnp.int32)
    if random_offset:
      iteration = jax.random.randint(k_off, (), 0, jnp.maximum(length, 1), jnp.int32)
    return LaneState(cfg=cfg, opt_state=opt_state, iteration=iteration, length=length)

  def _train_lanes(self, theta, lanes: LaneState, keys, data, theta_axis):
    """One step of every lane in ``lanes`` (leading lane axis); theta is shared, or per lane with ``theta_axis=0``.

    Per-lane pieces (`jax.vmap`) around the two theta-free computations that may go non-finite, which are wrapped
    in `_cut_unless_finite` over all lanes; see the module docstring for the step's timeline.
    """
    per_lane = lambda fn, *in_axes: jax.vmap(fn, in_axes=in_axes)
    opt_of = self.learned_opt.opt_fn

    def inputs(th, lane, key):
      opt = opt_of(th)
      k_batch, k_loss, k_meta_batch, k_meta, k_opt = jax.random.split(key, 5)
      batch = self._sample(data, "train", k_batch)
      meta_batch = batch
      if self.meta_loss_split not in (None, "same_batch"):
        meta_batch = self._sample(data, self.meta_loss_split, k_meta_batch)
      diff = (opt.get_params(lane.opt_state), opt.get_state(lane.opt_state))
      return diff, (k_loss, batch), (k_meta, meta_batch), k_opt

    params_and_state, loss_data, meta_data, k_opt = per_lane(inputs, theta_axis, 0, 0)(theta, lanes, keys)

    def loss_and_grad(diff, rest):
      (p, s), (cfg, (k, b)) = diff, rest
      (loss, new_s), grad = jax.value_and_grad(
          lambda p: self.family.task_fn(cfg).loss_with_state(p, s, k, b), has_aux=True)(p)
      # The params leave through the cut too, for the update: so their cotangents add up in the order of plain
      # reverse mode (the update's, then the loss's).
      return (loss, new_s, grad, p), jnp.isfinite(loss) & _all_finite(grad)

    (loss, new_model_state, grad, params), grad_ok = _cut_unless_finite(loss_and_grad)(
        params_and_state, (lanes.cfg, loss_data))

    def update(th, opt_state, params, grad, loss, new_model_state, key):
      opt = opt_of(th)
      # The state with the params that passed through the cut (the leaves get_params returns, replaced).
      by_id = {id(p): q for p, q in zip(jax.tree.leaves(opt.get_params(opt_state)), jax.tree.leaves(params))}
      opt_state = jax.tree.map(lambda x: by_id.get(id(x), x), opt_state)
      new = opt.update(opt_state, grad, loss=loss, model_state=new_model_state, key=key)
      return new, (opt.get_params(new), opt.get_state(new))

    # Where the loss or gradient went non-finite the step is masked; under differentiation its update then sees a
    # zero gradient and loss, so that the update's pullback is taken at finite values and sends exact zeros back.
    grad_in, loss_in = _zero_unless_ok_in_reverse_mode((grad, loss), grad_ok)
    opt_state, new_params_and_state = per_lane(update, theta_axis, 0, 0, 0, 0, 0, 0)(
        theta, lanes.opt_state, params, grad_in, loss_in, new_model_state, k_opt)
    if self.meta_loss_split is None:
      meta_loss = loss
    else:
      def meta_loss_fn(diff, rest):
        (p, s), (cfg, (k, b)) = diff, rest
        task = self.family.task_fn(cfg)
        value, _, aux = task.loss_with_state_and_aux(p, s, k, b)
        if self.meta_loss_aux is not None:
          if self.meta_loss_aux not in aux:
            raise KeyError(f"meta_loss_aux={self.meta_loss_aux!r}, but task {task.name!r} reports aux "
                           f"{sorted(aux)}.")
          value = aux[self.meta_loss_aux]
        return value, jnp.isfinite(value) & _all_finite(p)

      meta_loss, _ = _cut_unless_finite(meta_loss_fn)(new_params_and_state, (lanes.cfg, meta_data))

    def outputs(lane, loss, meta_loss, grad_ok, new_params):
      task = self.family.task_fn(lane.cfg)
      finite = grad_ok & jnp.isfinite(meta_loss) & _all_finite(new_params)
      zero = jnp.zeros_like(loss)
      out = dict(loss=jnp.where(finite, loss, zero), meta_loss=jnp.where(finite, meta_loss, zero))
      out["normalized_loss"] = jnp.where(finite, task.normalizer(out["loss"]), zero)
      out["normalized_meta_loss"] = jnp.where(finite, task.normalizer(out["meta_loss"]), zero)
      is_done = (lane.iteration + 1 >= lane.length) | ~finite
      out.update(mask=finite.astype(jnp.float32), iteration=lane.iteration, is_new_trajectory=lane.iteration == 0,
                 is_done=is_done)
      return UnrollOutput(**out), is_done

    out, is_done = per_lane(outputs, 0, 0, 0, 0, 0)(lanes, loss, meta_loss, grad_ok, new_params_and_state[0])
    new_lanes = LaneState(cfg=lanes.cfg, opt_state=opt_state, iteration=lanes.iteration + 1, length=lanes.length)
    return new_lanes, out, is_done

  # -- public API ---------------------------------------------------------------------------------------------
  def _lane_keys(self, key: jax.Array) -> jax.Array:
    """One key per lane; lane ``i`` of every lane group gets the same key."""
    if self.lane_groups == 1:
      return jax.random.split(key, self.num_tasks)
    return jnp.concatenate([jax.random.split(key, self.num_tasks // self.lane_groups)] * self.lane_groups)

  def _pair_done(self, is_done: jax.Array) -> jax.Array:
    if not self.antithetic:
      return is_done
    h = self.num_tasks // 2
    either = is_done[:h] | is_done[h:]
    return jnp.concatenate([either, either])

  def init_fn(self, theta: Any, key: jax.Array, theta_is_batched: bool = False) -> LaneState:
    """Pure: fresh lanes (``[num_tasks]``-leading leaves); see `init_step_state`."""
    fresh = functools.partial(self._fresh_lane, random_offset=self.random_initial_iteration)
    lanes = jax.vmap(fresh, in_axes=(0 if theta_is_batched else None, 0))(theta, self._lane_keys(key))
    return sharding.constrain_lanes(lanes, self.mesh)

  def init_step_state(self, theta: Any, key: jax.Array, theta_is_batched: bool = False) -> LaneState:
    """Samples ``num_tasks`` fresh task instances and initializes their params and optimizer states (jitted)."""
    return self._init(self.place_theta(theta, theta_is_batched), sharding.put_replicated(key, self.mesh),
                      theta_is_batched=theta_is_batched)

  def place_theta(self, theta: Any, theta_is_batched: bool = False) -> Any:
    """``theta`` on this step's devices: replicated, or split by lane when batched (a no-op on one device)."""
    if self.mesh is None:
      return theta
    return sharding.put_lanes(theta, self.mesh) if theta_is_batched else sharding.put_replicated(theta, self.mesh)

  def unroll_fn(self, theta: Any, state: LaneState, step_keys: jax.Array, data: Any,
                theta_is_batched: bool = False):
    """Pure (un-jitted, differentiable w.r.t. ``theta``) unroll of ``len(step_keys)`` steps, one key per step.

    ``data`` is ``self.data`` (pass it as an argument of your jitted function so the arrays are not baked into the
    compiled program as constants).
    """
    if self.mesh is None:
      return self._unroll_lanes(theta, state, step_keys, data, theta_is_batched, local=False)
    # One program per device over its own lanes: no cross-device traffic, except the pairing of lane groups.
    lane_spec = P(sharding.LANE_AXIS)
    per_device = jax.shard_map(
        functools.partial(self._unroll_lanes, theta_is_batched=theta_is_batched, local=True), mesh=self.mesh,
        in_specs=(lane_spec if theta_is_batched else P(), lane_spec, P(), P()),
        out_specs=(lane_spec, P(None, sharding.LANE_AXIS)))
    return per_device(theta, state, step_keys, data)

  def _unroll_lanes(self, theta, state, step_keys, data, theta_is_batched: bool, local: bool):
    """The unroll over the lanes in ``state``: all of them, or (``local``) this device's share inside shard_map."""
    theta_axis = 0 if theta_is_batched else None
    train_vmap = lambda th, lanes, keys, data: self._train_lanes(th, lanes, keys, data, theta_axis)
    fresh = jax.vmap(functools.partial(self._fresh_lane, random_offset=False), in_axes=(theta_axis, 0))
    num_local = jax.tree.leaves(state)[0].shape[0]

    def lane_keys(key):
      keys = self._lane_keys(key)
      if not local:
        return keys
      return jax.lax.dynamic_slice_in_dim(keys, jax.lax.axis_index(sharding.LANE_AXIS) * num_local, num_local)

    def pair_done(is_done):  # only antithetic pairs (lanes i and i + num_tasks / 2) need each other's flags
      if not local or not self.antithetic:
        return self._pair_done(is_done)
      everyone = self._pair_done(jax.lax.all_gather(is_done, sharding.LANE_AXIS, tiled=True))
      return jax.lax.dynamic_slice_in_dim(everyone, jax.lax.axis_index(sharding.LANE_AXIS) * num_local, num_local)

    def train(lanes, keys):
      if not self.antithetic or self.stack_antithetic or local:
        return train_vmap(theta, lanes, keys, data)
      h = self.num_tasks // 2
      halves = [jax.tree.map(lambda x: x[sl], (theta if theta_is_batched else None, lanes, keys))
                for sl in (slice(None, h), slice(h, None))]
      results = [train_vmap(theta if th is None else th, ln, ks, data) for th, ln, ks in halves]
      return jax.tree.map(lambda a, b: jnp.concatenate([a, b]), *results)

    def step(lanes, step_key):
      k_train, k_reset = jax.random.split(step_key)
      lanes, out, is_done = train(lanes, lane_keys(k_train))
      is_done = pair_done(is_done)
      out = dataclasses.replace(out, is_done=is_done)

      def reset(lanes):
        return jax.vmap(_select)(is_done, fresh(theta, lane_keys(k_reset)), lanes)

      # A scalar predicate: the (batched) reset runs only in steps where some lane (of this device) finishes.
      lanes = jax.lax.cond(jnp.any(is_done), reset, lambda l: l, lanes)
      return lanes, out

    return jax.lax.scan(step, state, step_keys)

  def unroll(self, theta: Any, state: LaneState, key: jax.Array, num_steps: int,
             theta_is_batched: bool = False):
    """Runs ``num_steps`` inner steps of every lane; returns ``(new state, UnrollOutput [num_steps, num_tasks])``.

    ``theta`` is shared by all lanes, or per lane (leading ``num_tasks`` axis) with ``theta_is_batched=True``.
    Step ``i`` uses ``jax.random.split(key, num_steps)[i]`` (see `unroll_with_keys`). Jitted once per
    (num_steps, theta_is_batched); the state's buffers are donated unless ``donate=False``.
    """
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
      raise ValueError(f"num_steps must be a positive int (not a bool), got {num_steps!r}.")
    return self.unroll_with_keys(theta, state, jax.random.split(key, num_steps), theta_is_batched)

  def unroll_with_keys(self, theta: Any, state: LaneState, step_keys: jax.Array, theta_is_batched: bool = False):
    """Like `unroll`, with the per-step keys given explicitly (``step_keys``: ``[num_steps]`` keys)."""
    if self.mesh is not None:
      state = sharding.put_lanes(state, self.mesh)
      step_keys = sharding.put_replicated(step_keys, self.mesh)
    return self._unroll(self.place_theta(theta, theta_is_batched), state, step_keys, self.data,
                        theta_is_batched=theta_is_batched)
