"""The meta-training step: estimators -> averaged meta-gradient -> optax meta-optimizer, as a pure program.

One meta-step (estimates of every estimator, averaging, non-finite handling, clipping and the optax update) is a
single jitted program, ``MetaTrainer.step_fn``: ``state -> (state, metrics)``, like an optax transformation. Step
``i`` uses the key ``fold_in(state.key, i)`` and the whole `MetaTrainState` (theta, meta-optimizer state, worker
states, base key, step) is what a checkpoint holds, so a run resumed from a checkpoint produces exactly the numbers of
an uninterrupted run.

Estimators built with ``devices`` (all with the same devices) spread their lanes over those devices; the trainer
then keeps theta and the meta-optimizer state replicated there and each worker state split by lane (`place`), from
`init` and after a restore. When the devices belong to several processes (`metafam.distributed`), every process
runs the same meta-steps.

The trainer is the algorithm only, like an optax transformation: it has no files, no run identity and no
evaluation. The loop around it (checkpoints, the metrics file, evaluation, lock, signals, divergence, memory
pre-check) is `metafam.runs.loop.train`, the run directory and the identity stored in checkpoints
`metafam.runs.run_dir`, the meta-validation curve `metafam.runs.validation`, and a whole run
with its closing report `metafam.runs.run`. None of them is imported here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam import distributed, resources
from metafam._checks import check_positive
from metafam._identity import own_program
from metafam._pytree import DataPytree
from metafam.inner import sharding
from metafam.nonfinite import check_on_nonfinite
from metafam.outer_trainers.base import NONFINITE_METRICS, GradientEstimator, count_nonfinite, zero_nonfinite


def meta_optimizer(learning_rate: float, decay_steps: int = 0, warmup_steps: Optional[int] = None,
                   end_fraction: float = 0.1) -> optax.GradientTransformation:
  """Adam for the meta-parameters, at a constant ``learning_rate`` (``decay_steps=0``) or on a schedule.

  With ``decay_steps > 0``: a linear warmup from 0 over ``warmup_steps`` meta-steps (default ``min(100,
  decay_steps // 10)``), then a cosine decay to ``end_fraction * learning_rate`` at meta-step ``decay_steps``, constant
  after (`optax.warmup_cosine_decay_schedule`), so a run continued past ``decay_steps`` keeps the final rate. ES
  meta-gradients are noisy; the decay lets theta settle instead of jittering at the noise floor of a constant rate.
  """
  return optax.adam(meta_learning_rate_schedule(learning_rate, decay_steps, warmup_steps, end_fraction))


def meta_learning_rate_schedule(learning_rate: float, decay_steps: int = 0, warmup_steps: Optional[int] = None,
                                end_fraction: float = 0.1) -> Any:
  """`meta_optimizer`'s learning rate: the float ``learning_rate`` (``decay_steps=0``), or its warmup-cosine schedule
  (an optax schedule: meta-step -> rate); the arguments as `meta_optimizer` takes them."""
  lr = check_positive("learning_rate", learning_rate)
  if isinstance(decay_steps, bool) or not isinstance(decay_steps, (int, np.integer)) or decay_steps < 0:
    raise ValueError(f"decay_steps must be an int >= 0 (0: constant learning rate), got {decay_steps!r}.")
  if not 0 <= end_fraction <= 1:
    raise ValueError(f"end_fraction must lie in [0, 1], got {end_fraction!r}.")
  if decay_steps == 0:
    return lr
  warmup = min(100, decay_steps // 10) if warmup_steps is None else warmup_steps
  if isinstance(warmup, bool) or not isinstance(warmup, (int, np.integer)) or not 0 <= warmup < decay_steps:
    raise ValueError(f"warmup_steps must be an int in [0, decay_steps={decay_steps}), got {warmup_steps!r}.")
  return optax.warmup_cosine_decay_schedule(0.0, lr, int(warmup), int(decay_steps), end_fraction * lr)


NONFINITE_POLICIES = ("skip", "zero")


def _check_nonfinite(nonfinite: Any) -> str:
  if not isinstance(nonfinite, str) or nonfinite not in NONFINITE_POLICIES:
    raise ValueError(f"nonfinite must be one of {', '.join(map(repr, NONFINITE_POLICIES))} (what a meta-step does "
                     f"with a non-finite meta-gradient), got {nonfinite!r}.")
  return nonfinite


def mean_estimate(grads: Sequence[Any], losses: Sequence[Any], nonfinite: str = "skip"):
  """The estimators' averaged meta-gradient and meta-loss, and whether the meta-update is skipped.

  Returns ``(grad, meta_loss, nonfinite_entries, skip)``: ``grad`` and ``meta_loss`` are the means over estimators,
  ``nonfinite_entries`` counts the averaged gradient's NaN / infinite entries. With ``nonfinite="skip"``
  ``skip`` is true when such entries exist or some estimate had no finite step or pair (its meta-loss is NaN, and
  its zero gradient carries no information), and ``grad`` is returned as it is (the caller keeps theta and the
  meta-optimizer state on a skip). With ``nonfinite="zero"`` those entries of ``grad`` are set to 0 (NaN and both
  infinities) and ``skip`` is false: the finite part is applied, whatever the meta-loss, as learned_optimization's
  ``gradient_worker_compute`` does. The one meta-update (`MetaTrainer.step_fn`) and the compat layer's worker path
  both combine estimates here.
  """
  _check_nonfinite(nonfinite)
  grad = jax.tree.map(lambda *g: sum(g) / len(g), *grads)
  meta_loss = sum(losses) / len(losses)
  bad_grad = count_nonfinite(grad)
  if nonfinite == "zero":
    return zero_nonfinite(grad)[0], meta_loss, bad_grad, jnp.asarray(False)
  skip = (bad_grad > 0) | ~jnp.all(jnp.isfinite(jnp.stack(losses)))
  return grad, meta_loss, bad_grad, skip


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MetaTrainState:
  """Everything a meta-training run needs to continue.

  Attributes:
    theta: the learned optimizer's meta-parameters.
    opt_state: the optax meta-optimizer's state.
    worker_states: tuple, one worker state per estimator.
    key_data: uint32 raw data of the run's base PRNG key (``jax.random.key_data``), checkpoint-friendly.
    step: int32, meta-steps taken.
  """
  theta: Any
  opt_state: Any
  worker_states: tuple
  key_data: jax.Array
  step: jax.Array


class MetaTrainer(DataPytree):
  """Meta-trains ``learned_opt`` with the average of ``estimators``' meta-gradients.

  Args:
    learned_opt: the learned optimizer (``init(key) -> theta``, ``opt_fn(theta)``).
    estimators: one or more `GradientEstimator`s (their gradients are averaged).
    meta_optimizer: an optax transformation (or `optax.chain`) applied to the averaged gradient.
    clip_grad_norm: clip the averaged gradient to this global norm with `optax.clip_by_global_norm` before the
      meta-optimizer (None, the default: no clipping; the same as putting that clip first in a chain, without
      adding its empty state to the checkpointed meta-optimizer state). A `metafam.runs.Recipe` clips at 1.0 unless
      it says otherwise: the policy is the recipe's, the trainer applies none of its own.
    nonfinite: what a meta-step does with a bad estimate (`NONFINITE_POLICIES`, see `mean_estimate`):
      ``"skip"`` (default): a meta-step in which some estimate had no finite step or pair (its ``meta_loss`` is NaN)
      or whose averaged gradient has non-finite entries leaves theta and the meta-optimizer state unchanged; its
      metrics say ``update_skipped = 1`` (the worker states advance as usual). ``"zero"``: the non-finite entries
      of the averaged gradient are set to 0 and the update is applied (learned_optimization's semantics, for
      `metafam.compat.learned_optimization`); ``update_skipped`` is then always 0 and ``grad_norm`` is the norm of
      the gradient applied. Part of a run's default identity when not the default (`run_dir.run_identity`).
    on_nonfinite: "warn" (default), "raise" or "ignore" (`metafam.nonfinite`): what the meta-training loop
      (`metafam.runs.loop.train`) does with a meta-step whose estimates masked inner steps or whose
      update was skipped; it reads them from the step's metrics (``nonfinite_fraction``: the mean over estimators
      of each one's masked fraction, ``nonfinite_fraction/LABEL`` per estimator when there are several, the causes'
      counts `metafam.outer_trainers.base.NONFINITE_METRICS`, ``update_skipped``). The step itself never checks.
  """

  _data_fields = ("estimators",)

  def __init__(self, learned_opt: Any, estimators: Sequence[GradientEstimator],
               meta_optimizer: optax.GradientTransformation, clip_grad_norm: Optional[float] = None,
               nonfinite: str = "skip", on_nonfinite: str = "warn"):
    estimators = list(estimators) if isinstance(estimators, (list, tuple)) else [estimators]
    if not estimators:
      raise ValueError("MetaTrainer needs at least one estimator.")
    for i, est in enumerate(estimators):
      if not isinstance(est, GradientEstimator):
        raise TypeError(f"estimators[{i}] is a {type(est).__name__}, not a GradientEstimator (subclass "
                        "metafam.outer_trainers.GradientEstimator and implement init_worker_state and estimate_fn).")
    if clip_grad_norm is not None:
      check_positive("clip_grad_norm", clip_grad_norm)
    _check_nonfinite(nonfinite)
    meshes = [getattr(est, "mesh", None) for est in estimators]
    device_sets = [None if m is None else tuple(m.devices.flat) for m in meshes]
    if len(set(device_sets)) > 1:
      listing = ", ".join(f"estimators[{i}] ({type(e).__name__}): {'1 device' if d is None else list(d)}"
                          for i, (e, d) in enumerate(zip(estimators, device_sets)))
      raise ValueError(f"all estimators must run on the same devices (build them with the same devices=); "
                       f"got {listing}.")
    self.mesh = meshes[0]
    self.learned_opt, self.estimators, self.meta_optimizer = learned_opt, estimators, meta_optimizer
    self.clip_grad_norm, self.nonfinite = clip_grad_norm, nonfinite
    self.on_nonfinite = check_on_nonfinite(on_nonfinite)

  @property
  def _step(self):
    """The jitted meta-step, this trainer's own program (`metafam._identity.own_program`); the trainer passes
    itself to it (see `step_fn`)."""
    return own_program(self, "_step_program", lambda: jax.jit(MetaTrainer._step_and_pack, donate_argnums=1))

  @property
  def estimator_labels(self) -> list:
    """The estimators' names, numbered (``pes#0``, ``pes#1``) where several share one."""
    names = [est.name for est in self.estimators]
    return [f"{n}#{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]

  @property
  def inner_steps_per_meta_step(self) -> int:
    return sum(est.inner_steps_per_estimate for est in self.estimators)

  # -- state ----------------------------------------------------------------------------------------------------
  def init(self, key: jax.Array, theta: Any = None) -> MetaTrainState:
    """A fresh run: theta from ``learned_opt.init`` (unless given), worker states from each estimator."""
    k_theta, k_workers, k_run = jax.random.split(key, 3)
    theta = self.initial_theta(key) if theta is None else sharding.place(theta, self.mesh, lane_major=False)
    workers = tuple(est.init_worker_state(theta, k)
                    for est, k in zip(self.estimators, jax.random.split(k_workers, len(self.estimators))))
    return self.place(MetaTrainState(theta=theta, opt_state=self.meta_optimizer.init(theta), worker_states=workers,
                                     key_data=jax.random.key_data(k_run), step=jnp.asarray(0, jnp.int32)))

  def initial_theta(self, key: jax.Array) -> Any:
    """The theta `init` starts a run with ``key`` from (without building the worker states)."""
    return sharding.place(self.learned_opt.init(jax.random.split(key, 3)[0]), self.mesh, lane_major=False)

  def place(self, state: MetaTrainState) -> MetaTrainState:
    """``state`` on the estimators' devices: worker states split by lane, everything else replicated (outside jit
    it moves the arrays; inside the jitted step it keeps the output laid out like the input, so the next step
    reuses the compiled program). See `metafam.inner.sharding.place`."""
    if self.mesh is None:
      return state
    theta, opt_state, key_data, step = sharding.place((state.theta, state.opt_state, state.key_data, state.step),
                                                      self.mesh, lane_major=False)
    workers = tuple(est.place_worker_state(ws) for est, ws in zip(self.estimators, state.worker_states))
    return MetaTrainState(theta=theta, opt_state=opt_state, worker_states=workers, key_data=key_data, step=step)

  # -- one meta-step --------------------------------------------------------------------------------------------
  def step_fn(self, state: MetaTrainState):
    """Pure meta-step: ``state -> (new state, metrics)``.

    The trainer is a pytree whose leaves are its estimators' device data (`metafam._pytree`), so `step` jits this
    with the trainer as an argument and the data are inputs of the compiled program.
    """
    key = jax.random.fold_in(jax.random.wrap_key_data(state.key_data), state.step)
    keys = jax.random.split(key, len(self.estimators))
    grads, losses, workers, nonfinite, fractions = [], [], [], 0.0, []
    causes = {name: 0.0 for name in NONFINITE_METRICS}
    for est, ws, k in zip(self.estimators, state.worker_states, keys):
      estimate, ws = est.estimate_fn(state.theta, ws, k)
      grads.append(estimate.grad)
      losses.append(estimate.meta_loss)
      workers.append(ws)
      nonfinite = nonfinite + estimate.metrics["num_nonfinite"]
      fractions.append(jnp.asarray(estimate.metrics.get("nonfinite_fraction", 0.0), jnp.float32))
      causes = {name: total + estimate.metrics.get(name, 0.0) for name, total in causes.items()}
    grad, meta_loss, bad_grad, skip = mean_estimate(grads, losses, self.nonfinite)
    grad_norm = optax.tree.norm(grad)
    if self.clip_grad_norm is not None:  # stateless, so the meta-optimizer state is the plain optimizer's
      grad, _ = optax.clip_by_global_norm(self.clip_grad_norm).update(grad, optax.EmptyState())
    updates, opt_state = self.meta_optimizer.update(grad, state.opt_state, state.theta)
    theta = optax.apply_updates(state.theta, updates)
    theta, opt_state = optax.tree.where(skip, (state.theta, state.opt_state), (theta, opt_state))
    metrics = {"meta_loss": meta_loss, "grad_norm": grad_norm,
               "num_nonfinite": jnp.asarray(nonfinite, jnp.float32), "nonfinite_grad_entries": bad_grad,
               "update_skipped": skip.astype(jnp.float32), "nonfinite_fraction": sum(fractions) / len(fractions),
               **{name: jnp.asarray(count, jnp.float32) for name, count in causes.items()}}
    for est, loss in zip(self.estimators, losses):
      metrics[f"meta_loss/{est.name}"] = loss
    if len(self.estimators) > 1:
      for label, fraction in zip(self.estimator_labels, fractions):
        metrics[f"nonfinite_fraction/{label}"] = fraction
    new_state = MetaTrainState(theta=theta, opt_state=opt_state, worker_states=tuple(workers),
                               key_data=state.key_data, step=state.step + 1)
    return self.place(new_state), metrics

  def _step_and_pack(self, state: MetaTrainState):
    """`step_fn`, and its metrics also as one float32 vector in sorted-name order (`step_packed`)."""
    state, metrics = self.step_fn(state)
    return state, metrics, jnp.stack([jnp.asarray(metrics[k], jnp.float32) for k in sorted(metrics)])

  def step(self, state: MetaTrainState):
    """One jitted meta-step (``state`` is donated: use the returned one)."""
    state, metrics, _ = self._step(self, state)
    return state, metrics

  def step_packed(self, state: MetaTrainState):
    """`step` (the same compiled program), returning ``(state, metrics, packed)``: ``packed`` holds the metrics as
    one float32 vector in the order of ``sorted(metrics)``, so a loop fetches them in one device-to-host copy."""
    return self._step(self, state)

  # -- processes --------------------------------------------------------------------------------------------------
  @property
  def multi_process(self) -> bool:
    """Whether the lanes are spread over the devices of several processes (`metafam.distributed`)."""
    return sharding.is_multi_process(self.mesh)

  @property
  def is_main_process(self) -> bool:
    """True except on processes other than 0 of a multi-process run."""
    return not self.multi_process or distributed.is_main_process()

  # -- memory -----------------------------------------------------------------------------------------------------
  def abstract_state(self, key: jax.Array) -> MetaTrainState:
    """The `MetaTrainState` `init` would build, as ``jax.ShapeDtypeStruct``s laid out like the real one (nothing is
    allocated or computed)."""
    shapes = jax.eval_shape(self.init, key)
    if self.mesh is None:
      return shapes
    rep = sharding.replicated(self.mesh)
    workers = tuple(sharding.layout_shardings(est.lane_major(ws), self.mesh)
                    for est, ws in zip(self.estimators, shapes.worker_states))
    layout = MetaTrainState(theta=jax.tree.map(lambda _: rep, shapes.theta),
                            opt_state=jax.tree.map(lambda _: rep, shapes.opt_state), worker_states=workers,
                            key_data=rep, step=rep)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, layout)

  def memory_estimate(self, key: jax.Array) -> resources.MemoryEstimate:
    """XLA's memory analysis of the compiled meta-step (per device), from shapes alone. The program compiled here is
    the one `step` then runs (same shapes and layout), so the check costs no second compilation."""
    return resources.program_memory(self._step.lower(self, self.abstract_state(key)).compile())
