"""Vectorized, truncated inner training: ``num_tasks`` lanes of task instances trained by one (learned) optimizer.

Each lane holds its own task config, optimizer state (which carries the params), inner iteration and trajectory
length. `TruncatedStep.unroll` runs ``num_steps`` inner steps for all lanes in one jitted `lax.scan` over a `vmap`,
with batches gathered on the device from splits handed over once.

What one step of a lane does (its timeline, the masking of non-finite steps, `LaneState` and `UnrollOutput`) is
`metafam.inner.lane_step`'s; here the steps run in a scan, lanes whose trajectory ended are reset with fresh ones,
lanes are paired or grouped, spread over devices, and masked steps are reported.

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
import numpy as np
from jax.sharding import PartitionSpec as P

from metafam._checks import check_bool, check_positive
from metafam._identity import own_program
from metafam._pytree import DataPytree
from metafam.datasets.base import SPLITS
from metafam.inner import pairs, sharding
from metafam.inner import step as step_lib
from metafam.inner.lane_step import NONFINITE_CAUSES, LaneState, StepDraws, UnrollOutput, fresh_lane, step_lanes
from metafam.inner.schedules import ConstantSchedule
from metafam.nonfinite import check_on_nonfinite, listing, percent, report
from metafam.optimizers import low_rank
from metafam.optimizers.base import Optimizer
from metafam.optimizers.learned import HandDesigned
from metafam.taskfamilies.base import TaskFamily

META_LOSS_SPLITS = ("same_batch",) + SPLITS
RESETS = ("auto", "cond", "select")


class TruncatedStep(DataPytree):
  """Trains ``num_tasks`` instances of ``family`` with ``learned_opt`` in truncated, vectorized unrolls.

  Args:
    family: the `TaskFamily`. Tasks with data need ``family.datasets`` built from `ArraySplit`s (device path).
    learned_opt: a learned optimizer (``opt_fn(theta) -> Optimizer``), or a plain `Optimizer` whose theta is ``{}``.
    num_tasks: number of lanes.
    schedule: the truncation schedule (default ``ConstantSchedule(50)``).
    random_initial_iteration: stagger lanes by starting each at a random iteration of its first trajectory.
    meta_loss_split: data for ``meta_loss``: "same_batch" (the step's training batch), a split name, or None to
      skip it (then ``meta_loss`` repeats ``loss`` at no extra cost). These three default to the bare step;
      `metafam.outer_trainers.make_estimator`, and so every `metafam.runs.Recipe`, builds meta-training's: its
      schedule, staggered lanes and ``"outer_valid"``.
    antithetic: the lanes form pairs that draw the same keys (same configs, inits, lengths and batches) and reset
      together (a non-finite step in either ends the trajectory of both), so they differ only through their theta.
      ``num_tasks`` must be even. Lanes ``2i`` and ``2i + 1`` are a pair (build per-lane thetas and read per-pair
      values with `metafam.inner.pairs`), so on several devices no pair spans two of them when the pairs divide.
    stack_antithetic: with ``antithetic``, run both halves as one vmap of ``num_tasks`` lanes (True) or as two
      vmaps of ``num_tasks // 2`` (False); the numbers are the same, only the batching differs.
    lane_groups: split the lanes into this many equal groups whose lane ``i`` draws the same keys (same instances
      and batches), e.g. to compare per-lane thetas on identical problems; unlike ``antithetic`` the groups reset
      independently. ``antithetic=True`` implies 2 groups.
    donate: donate the input state's buffers to `unroll` (the passed state must not be used afterwards).
    lane_chunk: apply the optimizer update to blocks of this many lanes in sequence (`jax.lax.map`) when there are
      more (per device); "auto" takes the learned optimizer's ``lane_chunk`` (see `LearnedOptimizer`) on CPUs, where
      a block's working set then stays in cache, and None on accelerators, where blocks would only serialize the
      update (see `step_lib.auto_lane_chunk`); None keeps one vmap over all lanes. Only float rounding differs.
    reset: how lanes that finished a trajectory get their fresh task instance at the end of a step: "cond" computes
      the fresh lanes only in steps where some lane finished (a `jax.lax.cond` on one flag: on a CPU a branch taken
      by the host at no cost; on a GPU a copy of the flag to the host and a wait for the device in every step),
      "select" computes them in every step and keeps them per lane with a select (no host round trip, at the cost of
      one sampling and initialization per lane and step), "auto" (the default) "cond" on CPUs and "select" on
      accelerators. The numbers are the same either way.
    devices: spread the lanes over several devices: a count (the first ``n`` of `jax.devices()`) or a sequence of
      devices; ``num_tasks`` must divide evenly. The lane state is sharded along its lane axis, theta (unless per
      lane), keys and data are replicated; the numbers are the same as on one device. `init_step_state`,
      `unroll` and `unroll_with_keys` place their inputs; callers of the pure `init_fn` / `unroll_fn` inside their
      own jit must pass arrays that live on these devices (see `place_theta`). See `metafam.inner.sharding`.
    is_training: whether the lanes meta-train (True, the default: ``learned_opt.opt_fn(theta, is_training=True)``,
      as learned_optimization's truncated step calls it, so a learned optimizer can add training-only randomness
      such as `MuonResidualLOpt`'s ``lr_spread``) or evaluate (False: ``opt_fn(theta)``, as `FamilyEvaluator` runs
      it).
    on_nonfinite: "warn" (default), "raise" or "ignore" (`metafam.nonfinite`): what `unroll` does when some of its
      steps were masked. It reads the unroll's mask on the host once the unroll has finished ("ignore" does not,
      and does not wait); the estimators built on the step report their estimates the same way. The pure
      `unroll_fn` never checks.
  """

  _data_fields = ("data",)

  def __init__(self, family: TaskFamily, learned_opt: Any, num_tasks: int, schedule: Any = None,
               random_initial_iteration: bool = False, meta_loss_split: Optional[str] = "same_batch",
               antithetic: bool = False, stack_antithetic: bool = True,
               lane_groups: int = 1, donate: bool = True, devices: Any = None, lane_chunk: Any = "auto",
               is_training: bool = True, reset: str = "auto", on_nonfinite: str = "warn"):
    self._args = dict(family=family, learned_opt=learned_opt, num_tasks=num_tasks, schedule=schedule,
                      random_initial_iteration=random_initial_iteration, meta_loss_split=meta_loss_split,
                      antithetic=antithetic, stack_antithetic=stack_antithetic, lane_groups=lane_groups,
                      donate=donate, devices=devices, lane_chunk=lane_chunk, is_training=is_training, reset=reset,
                      on_nonfinite=on_nonfinite)
    if not isinstance(family, TaskFamily):
      raise TypeError(f"family must be a TaskFamily, got {type(family).__name__}.")
    if isinstance(learned_opt, Optimizer):
      learned_opt = HandDesigned(learned_opt)
    if not hasattr(learned_opt, "opt_fn"):
      raise TypeError(f"learned_opt must be a learned optimizer (with opt_fn) or an Optimizer, "
                      f"got {type(learned_opt).__name__}.")
    check_positive("num_tasks", num_tasks, integer=True)
    if meta_loss_split is not None and meta_loss_split not in META_LOSS_SPLITS:
      raise ValueError(f"meta_loss_split must be None or one of {META_LOSS_SPLITS}, got {meta_loss_split!r}.")
    if antithetic and num_tasks % 2:
      raise ValueError(f"antithetic=True needs an even num_tasks (pairs of lanes), got {num_tasks}.")
    if antithetic and lane_groups not in (1, 2):
      raise ValueError(f"antithetic=True uses 2 lane groups; got lane_groups={lane_groups}.")
    if not isinstance(lane_groups, int) or isinstance(lane_groups, bool) or lane_groups < 1 or num_tasks % lane_groups:
      raise ValueError(f"lane_groups must be a positive int dividing num_tasks={num_tasks}, got {lane_groups!r}.")
    self.lane_groups = 2 if antithetic else lane_groups
    self.antithetic, self.stack_antithetic = antithetic, stack_antithetic
    self.family, self.learned_opt, self.num_tasks = family, learned_opt, num_tasks
    self.schedule = ConstantSchedule(50) if schedule is None else schedule
    if not hasattr(self.schedule, "sample"):
      raise TypeError(f"schedule must have sample(key) -> length, got {type(self.schedule).__name__}.")
    self.random_initial_iteration = random_initial_iteration
    self.is_training = check_bool("is_training", is_training)
    self.on_nonfinite = check_on_nonfinite(on_nonfinite)
    if reset not in RESETS:
      raise ValueError(f"reset must be one of {RESETS}, got {reset!r}.")
    self.meta_loss_split = meta_loss_split
    self.mesh = sharding.lane_mesh(devices, num_tasks)
    platform = sharding.platform(devices)
    self.reset = ("cond" if platform == "cpu" else "select") if reset == "auto" else reset
    if isinstance(lane_chunk, str) and lane_chunk == "auto":
      lane_chunk = step_lib.auto_lane_chunk(getattr(self.learned_opt, "lane_chunk", None), platform)
    self.lane_chunk = None if lane_chunk is None else check_positive("lane_chunk", lane_chunk, integer=True)
    self.donate = donate
    self.data = sharding.place(self._device_data(), self.mesh, lane_major=False)

  # The step's own programs (`metafam._identity.own_program`): it passes itself, a pytree whose leaves are its device
  # data, to them.
  @property
  def _unroll(self):
    return own_program(self, "_unroll_program", lambda: jax.jit(
        TruncatedStep.unroll_fn, static_argnames=("theta_is_batched",),
        donate_argnames=("state",) if self.donate else ()))

  @property
  def _init(self):
    return own_program(self, "_init_program",
                       lambda: jax.jit(TruncatedStep.init_fn, static_argnames=("theta_is_batched",)))

  def replace(self, **changes: Any) -> "TruncatedStep":
    """A new `TruncatedStep` with the same constructor arguments except ``changes`` (e.g. ``num_tasks=16``)."""
    unknown = sorted(set(changes) - set(self._args))
    if unknown:
      raise TypeError(f"TruncatedStep.replace got unknown arguments {unknown}; valid: {sorted(self._args)}.")
    return TruncatedStep(**{**self._args, **changes})

  def paired(self, stack: bool = True) -> "TruncatedStep":
    """The antithetic version of this step for ES: ``2 * num_tasks`` lanes in pairs (see `metafam.inner.pairs`):
    lanes ``2i`` and ``2i + 1`` see the same instances, batches and resets. ``stack``: run both halves
    as one vmap (True) or as two (False); the numbers are the same. Never donates (estimators call the pure
    `unroll_fn`)."""
    if self.antithetic or self.lane_groups != 1:
      raise ValueError("paired() needs a step without antithetic lanes or lane groups (it builds the pairs itself).")
    return self.replace(num_tasks=2 * self.num_tasks, antithetic=True, stack_antithetic=stack, donate=False)

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

  # -- the lanes ----------------------------------------------------------------------------------------------
  def opt_fn(self, theta: Any) -> Optimizer:
    """The inner optimizer of one lane's theta. `low_rank.Perturbed` weights (low-rank ES perturbations) reach
    the learned optimizer as they are when it reads them through `low_rank` (``low_rank_weights``), else dense."""
    if not getattr(self.learned_opt, "low_rank_weights", False):
      theta = low_rank.dense_tree(theta)
    return self.learned_opt.opt_fn(theta, is_training=True) if self.is_training else self.learned_opt.opt_fn(theta)

  def _theta_axes(self, theta: Any, theta_is_batched: bool) -> Any:
    """The vmap ``in_axes`` of theta: None when shared, else 0 per leaf except shared low-rank bases (None)."""
    return low_rank.lane_axes(theta) if theta_is_batched else None

  # -- public API ---------------------------------------------------------------------------------------------
  def _lane_keys(self, key: jax.Array) -> jax.Array:
    """One key per lane; lane ``i`` of every lane group gets the same key."""
    return pairs.lane_keys(key, self.num_tasks, self.lane_groups, paired=self.antithetic)

  def _pair_done(self, is_done: jax.Array) -> jax.Array:
    return pairs.pair_done(is_done) if self.antithetic else is_done

  @property
  def whole_pairs_per_device(self) -> bool:
    """Whether every device holds whole antithetic pairs (the pairs divide evenly over the devices), so the pair
    bookkeeping needs no cross-device traffic."""
    return self.antithetic and self.mesh is not None and (self.num_tasks // 2) % self.mesh.size == 0

  def init_fn(self, theta: Any, key: jax.Array, theta_is_batched: bool = False) -> LaneState:
    """Pure: fresh lanes (``[num_tasks]``-leading leaves); see `init_step_state`."""
    fresh = functools.partial(fresh_lane, self.family, self.schedule, self.opt_fn,
                              random_offset=self.random_initial_iteration)
    lanes = jax.vmap(fresh, in_axes=(self._theta_axes(theta, theta_is_batched), 0))(theta, self._lane_keys(key))
    return sharding.place(lanes, self.mesh)

  def init_step_state(self, theta: Any, key: jax.Array, theta_is_batched: bool = False) -> LaneState:
    """Samples ``num_tasks`` fresh task instances and initializes their params and optimizer states (jitted)."""
    return self._init(self, self.place_theta(theta, theta_is_batched),
                      sharding.place(key, self.mesh, lane_major=False), theta_is_batched=theta_is_batched)

  def place_theta(self, theta: Any, theta_is_batched: bool = False) -> Any:
    """``theta`` on this step's devices: replicated, or split by lane when batched (a no-op on one device; shared
    low-rank bases stay replicated)."""
    return sharding.place(theta, self.mesh, lane_major=self._theta_lane_major(theta, theta_is_batched))

  def _theta_lane_major(self, theta: Any, theta_is_batched: bool) -> Any:
    """A tree of bools like ``theta``: which of its leaves have a lane axis."""
    if not theta_is_batched:
      return False
    return jax.tree.map(lambda ax: ax == 0, low_rank.lane_axes(theta), is_leaf=lambda x: x is None)

  def unroll_fn(self, theta: Any, state: LaneState, step_keys: jax.Array, *, theta_is_batched: bool = False,
                with_cfg: bool = False):
    """Pure (un-jitted, differentiable w.r.t. ``theta``) unroll of ``len(step_keys)`` steps, one key per step.

    ``with_cfg=True`` also returns each step's task config in ``UnrollOutput.cfg`` (e.g. for the reference's
    ``unroll_info.task_param``); with the default False the traced program is exactly the one without the option.

    The step is a pytree whose leaves are its device data (`metafam._pytree`): pass the step itself into your jitted
    function (``jax.jit(lambda step, theta, ...: step.unroll_fn(...))(step, theta, ...)``) and the data enter the
    compiled program as inputs; a step captured by closure works too, with the data compiled in as constants.
    """
    data = self.data
    if self.mesh is None:
      return self._unroll_lanes(theta, state, step_keys, data, theta_is_batched, local=False, with_cfg=with_cfg)
    # One program per device over its own lanes: no cross-device traffic, except the pairing of lane groups.
    lane_spec = P(sharding.LANE_AXIS)
    per_device = jax.shard_map(
        functools.partial(self._unroll_lanes, theta_is_batched=theta_is_batched, local=True, with_cfg=with_cfg),
        mesh=self.mesh,
        in_specs=(jax.tree.map(lambda split: lane_spec if split else P(),
                               self._theta_lane_major(theta, theta_is_batched)), lane_spec, P(), P()),
        out_specs=(lane_spec, P(None, sharding.LANE_AXIS)))
    return per_device(theta, state, step_keys, data)

  def _unroll_lanes(self, theta, state, step_keys, data, theta_is_batched: bool, local: bool,
                    with_cfg: bool = False):
    """The unroll over the lanes in ``state``: all of them, or (``local``) this device's share inside shard_map."""
    theta_axis = self._theta_axes(theta, theta_is_batched)
    train_vmap = lambda th, lanes, keys, data: step_lanes(
        self.family, self.opt_fn, th, lanes, keys, data, theta_axis, meta_loss_split=self.meta_loss_split,
        lane_chunk=self.lane_chunk, with_cfg=with_cfg)
    fresh = jax.vmap(functools.partial(fresh_lane, self.family, self.schedule, self.opt_fn, random_offset=False),
                     in_axes=(theta_axis, 0))
    num_local = jax.tree.leaves(state)[0].shape[0]

    def lane_keys(key):
      keys = self._lane_keys(key)
      if not local:
        return keys
      return jax.lax.dynamic_slice_in_dim(keys, jax.lax.axis_index(sharding.LANE_AXIS) * num_local, num_local)

    def pair_done(is_done):  # only the two lanes of an antithetic pair need each other's flags
      if not local or not self.antithetic:
        return self._pair_done(is_done)
      if self.whole_pairs_per_device:  # neighbouring lanes are pairs: no other device is needed
        return pairs.pair_done(is_done)
      everyone = self._pair_done(jax.lax.all_gather(is_done, sharding.LANE_AXIS, tiled=True))
      return jax.lax.dynamic_slice_in_dim(everyone, jax.lax.axis_index(sharding.LANE_AXIS) * num_local, num_local)

    def draws_of(step_key):
      """Every random number a step draws outside a reset: its per-lane keys and batch indices."""
      k_train, k_reset = jax.random.split(step_key)
      keys = jax.vmap(functools.partial(step_lib.split_step_key, with_meta_loss=True))(lane_keys(k_train))
      indices = lambda name, ks: None if data is None else jax.vmap(data[name].indices)(ks)
      meta = None if self.meta_loss_split in (None, "same_batch") else indices(self.meta_loss_split, keys.meta_batch)
      return StepDraws(keys=keys, batch=indices("train", keys.batch), meta_batch=meta, reset=lane_keys(k_reset))

    def train(lanes, draws):
      if not self.antithetic or self.stack_antithetic or local:
        return train_vmap(theta, lanes, draws, data)
      half = lambda i, tree: jax.tree.map(lambda x: pairs.halves(x)[i], tree)
      theta_half = lambda i: (low_rank.map_lane_leaves(lambda x: pairs.halves(x)[i], theta) if theta_is_batched
                              else theta)
      return pairs.join(*[train_vmap(theta_half(i), half(i, lanes), half(i, draws), data) for i in (0, 1)])

    def step(lanes, draws):
      lanes, out, is_done = train(lanes, draws)
      is_done = pair_done(is_done)
      out = dataclasses.replace(out, is_done=is_done)

      def reset(lanes):
        return jax.vmap(lambda done, new, old: jax.tree.map(lambda a, b: jnp.where(done, a, b), new, old))(
            is_done, fresh(theta, draws.reset), lanes)

      if self.reset == "select":  # no host round trip; the fresh lanes are computed in every step
        return reset(lanes), out
      # A scalar predicate: the (batched) reset runs only in steps where some lane (of this device) finishes.
      return jax.lax.cond(jnp.any(is_done), reset, lambda l: l, lanes), out

    # Each step's random numbers are drawn before the loop, for a block of steps at once (same numbers).
    return step_lib.scan_with_draws(lambda lanes, key_and_draws: step(lanes, key_and_draws[1]), state, step_keys,
                                    draws_of)

  def unroll(self, theta: Any, state: LaneState, key: jax.Array, num_steps: int,
             theta_is_batched: bool = False):
    """Runs ``num_steps`` inner steps of every lane; returns ``(new state, UnrollOutput [num_steps, num_tasks])``.

    ``theta`` is shared by all lanes, or per lane (leading ``num_tasks`` axis) with ``theta_is_batched=True``.
    Step ``i`` uses ``jax.random.split(key, num_steps)[i]`` (see `unroll_with_keys`). Jitted once per
    (num_steps, theta_is_batched); the state's buffers are donated unless ``donate=False``.
    """
    check_positive("num_steps", num_steps, integer=True)
    return self._unroll_checked(theta, state, jax.random.split(key, num_steps), theta_is_batched)

  def unroll_with_keys(self, theta: Any, state: LaneState, step_keys: jax.Array, theta_is_batched: bool = False):
    """Like `unroll`, with the per-step keys given explicitly (``step_keys``: ``[num_steps]`` keys)."""
    return self._unroll_checked(theta, state, step_keys, theta_is_batched)

  def _unroll_checked(self, theta, state, step_keys, theta_is_batched):
    state, step_keys = sharding.place(state, self.mesh), sharding.place(step_keys, self.mesh, lane_major=False)
    state, out = self._unroll(self, self.place_theta(theta, theta_is_batched), state, step_keys,
                              theta_is_batched=theta_is_batched)
    if self.on_nonfinite != "ignore":
      message = self.nonfinite_message(out)
      if message is not None:
        report(message, self.on_nonfinite, stacklevel=3)  # the warning points at the caller of unroll
    return state, out

  def nonfinite_message(self, out: UnrollOutput, where: str = "this unroll") -> Optional[str]:
    """The report of the masked steps of ``out`` (one unroll's outputs, read to the host), or None if none was."""
    if not getattr(out.nonfinite, "is_fully_addressable", True):  # lanes of other processes: not read from here
      return None
    codes = np.asarray(jax.device_get(out.nonfinite))
    bad = codes != 0
    if not bad.any():
      return None
    kinds = ", ".join(f"the {name} in {int(np.sum(codes == c))}" for c, name in enumerate(NONFINITE_CAUSES, 1)
                      if np.any(codes == c))
    step, lane = (int(i[0]) for i in np.nonzero(bad))
    lanes = np.flatnonzero(bad.any(axis=0))
    return (f"TruncatedStep on family {self.family.name!r}: {percent(int(bad.sum()), bad.size, 'steps')} of {where} "
            f"({codes.shape[0]} steps x {codes.shape[1]} lanes) were masked because a value went non-finite ({kinds}); "
            f"lanes {listing(lanes)} ({len(lanes)} of {codes.shape[1]}), the first at step {step} of lane {lane}. "
            "A masked step reports loss 0 and mask 0 (UnrollOutput.nonfinite says what went non-finite) and ends "
            "its lane's trajectory; the other lanes are unaffected. on_nonfinite='raise' raises, 'ignore' skips "
            "this check.")
