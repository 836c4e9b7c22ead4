"""`learned_optimization.outer_trainers.gradient_learner`: the reference's meta-training interfaces over metafam.

* `SingleMachineGradientLearner(learned_opt, gradient_estimators, theta_opt)` with ``init(key)``,
  ``update(state, key, with_metrics=False) -> (state, loss, metrics)`` and ``get_meta_params(state)``. When
  ``theta_opt`` is an optax-backed optimizer (`optax_opts`) and every estimator is a metafam estimator (all of this
  package's are), each update is one step of metafam's `MetaTrainer` (estimates, averaging and the optax update in
  one jitted program). Otherwise (a fork's estimator, or a ``theta_opt`` with its own ``update``) it runs
  `gradient_worker_compute` and `GradientLearner.update`, which is the reference's learner/worker split.
* `GradientLearner` (the meta-parameters and their optimizer) and `gradient_worker_compute` (estimates from a
  list of estimators, averaged): the reference's multi-worker split, for estimators with
  ``compute_gradient_estimate``.
* `ParameterCheckpoint` and `OptCheckpoint` (defined in `checkpoints`, which reads and writes them).
* The data classes `OuterState`, `WorkerWeights`, `GradientLearnerState`, `GradientEstimatorState`, `UnrollInfo`,
  `GradientEstimatorOut`, `AggregatedGradient`, `WorkerComputeOut`, `SingleMachineState`.

Duck typing: forks of this module define their own ``WorkerWeights`` / ``OuterState``; the estimators and
`gradient_worker_compute` accept any object with the fields ``theta``, ``theta_model_state`` and ``outer_state``
(`is_worker_weights`), and `SingleMachineGradientLearner` any ``meta_init`` with ``init(key)`` (`MetaInitializer`).

Non-finite values, as the reference: NaN and infinite entries of the averaged meta-gradient are set to 0 and the
update is applied, and a non-finite mean meta-loss is reported as 20 (``clip_nan_loss_to_value``). Both paths combine
the estimates with the engine's `metafam.outer_trainers.meta_trainer.mean_estimate` under its ``nonfinite="zero"``
policy (the `MetaTrainer` path builds its trainer with ``nonfinite="zero"``), so there is one implementation of
it; metafam's own runs skip such an update instead (the default ``nonfinite="skip"``).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam.compat.learned_optimization import checkpoints
from metafam.compat.learned_optimization.checkpoints import OptCheckpoint, ParameterCheckpoint
from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.compat.learned_optimization.optimizers import optax_opts
from metafam.optimizers import base as _mf_opt_base
from metafam.outer_trainers.base import GradientEstimator as _MFGradientEstimator
from metafam.outer_trainers.meta_trainer import MetaTrainer, MetaTrainState, mean_estimate

__all__ = ["OuterState", "WorkerWeights", "GradientLearnerState", "GradientEstimatorState", "UnrollInfo",
           "GradientEstimatorOut", "AggregatedGradient", "WorkerComputeOut", "SingleMachineState",
           "ParameterCheckpoint", "OptCheckpoint", "GradientEstimator", "GradientLearner", "gradient_worker_compute",
           "SingleMachineGradientLearner", "MetaInitializer", "PRNGKey", "MetaParams", "ThetaModelState"]

PRNGKey = jax.Array
MetaParams = Any
ThetaModelState = Any

_NAN_LOSS = 20.0  # the reference's stand-in for a non-finite meta-loss


def _pytree_dataclass(cls):
  return jax.tree_util.register_dataclass(dataclasses.dataclass(frozen=True)(cls))


@_pytree_dataclass
class OuterState:
  outer_iteration: Any


@_pytree_dataclass
class WorkerWeights:
  theta: Any
  theta_model_state: Any
  outer_state: OuterState


@_pytree_dataclass
class GradientLearnerState:
  theta_opt_state: Any


@_pytree_dataclass
class GradientEstimatorState:
  """Base of the reference's worker states (metafam's estimators use their own worker-state types)."""


@_pytree_dataclass
class UnrollInfo:
  loss: Any
  iteration: Any
  task_param: Any
  is_done: Any


@_pytree_dataclass
class GradientEstimatorOut:
  mean_loss: Any
  grad: Any
  unroll_state: Any
  unroll_info: Optional[UnrollInfo] = None


@_pytree_dataclass
class AggregatedGradient:
  theta_grads: Any
  theta_model_state: Any
  mean_loss: Any


@dataclasses.dataclass(frozen=True)
class WorkerComputeOut:
  to_put: AggregatedGradient
  unroll_states: List[Any]
  metrics: Mapping[str, Any]
  event_info: List[Any]


@_pytree_dataclass
class SingleMachineState:
  gradient_learner_state: GradientLearnerState
  gradient_estimator_states: Sequence[Any]


class GradientEstimator(abc.ABC):
  """The reference's estimator interface: ``init_worker_state(worker_weights, key)`` and
  ``compute_gradient_estimate(worker_weights, key, state, with_summary=False) -> (GradientEstimatorOut, metrics)``.

  This package's estimators (`truncated_pes.TruncatedPES`, ...) are metafam estimators registered as virtual
  subclasses; user estimators may subclass this and work with `gradient_worker_compute`.
  """

  task_family: Any = None
  learned_opt: Any = None

  @abc.abstractmethod
  def init_worker_state(self, worker_weights: WorkerWeights, key: jax.Array) -> Any:
    """The estimator's initial state."""

  @abc.abstractmethod
  def compute_gradient_estimate(self, worker_weights: WorkerWeights, key: jax.Array, state: Any,
                                with_summary: bool = False) -> Tuple[GradientEstimatorOut, Mapping[str, Any]]:
    """One estimate and the next state."""


class MetaInitializer(Protocol):
  """Anything with ``init(key) -> theta`` (a learned optimizer, or any object making the meta-parameters)."""

  def init(self, key: PRNGKey) -> MetaParams:
    ...


def is_worker_weights(obj: Any) -> bool:
  """Whether ``obj`` has the fields of `WorkerWeights` (``theta``, ``theta_model_state``, ``outer_state``): any
  such object is accepted, e.g. a user's own namedtuple or dataclass in a fork of this module."""
  return all(hasattr(obj, f) for f in ("theta", "theta_model_state", "outer_state"))


def theta_of(weights_or_theta: Any) -> Any:
  """The meta-parameters: ``worker_weights.theta`` for a `WorkerWeights`-like object, else the argument itself."""
  return weights_or_theta.theta if is_worker_weights(weights_or_theta) else weights_or_theta


def _as_metrics(metrics: Mapping[str, Any], agg: str = "mean") -> Dict[str, Any]:
  """metafam metrics under the reference's ``"aggregation||name"`` keys."""
  return {k if "||" in k else f"{agg}||{k}": v for k, v in metrics.items()}


def _event_of(info: Any, worker_weights: Any, key: jax.Array) -> Dict[str, Any]:
  """One step of an estimator's ``unroll_info`` (``[steps, lanes]`` leaves), drawn uniformly with ``key``, as the
  reference's event record: the step's losses per lane, its task params, iteration and the outer iteration."""
  idx = int(jax.random.randint(key, (), 0, len(info.loss)))
  pick = lambda x: None if x is None else np.asarray(x)[idx]
  return {"loss": np.asarray(info.loss)[idx], "task_param": jax.tree.map(pick, info.task_param),
          "iteration": pick(info.iteration), "outer_iteration": worker_weights.outer_state.outer_iteration}


# The engine's combination of estimates under the reference's policy (non-finite gradient entries set to 0).
_zeroed_mean = jax.jit(functools.partial(mean_estimate, nonfinite="zero"))


def gradient_worker_compute(worker_weights: WorkerWeights, gradient_estimators: Sequence[Any],
                            unroll_states: Sequence[Any], key: jax.Array, with_metrics: bool = False,
                            clip_nan_loss_to_value: Optional[float] = _NAN_LOSS, extra_metrics: bool = True,
                            device: Any = None) -> WorkerComputeOut:
  """Runs every estimator once on its state and averages the gradients.

  Non-finite gradient entries become 0 and a non-finite mean loss becomes ``clip_nan_loss_to_value`` (unless None
  or 0), as in the reference.
  ``device`` is not used (metafam estimators place their own lanes). ``worker_weights`` may be any object with
  `WorkerWeights`' fields; the estimators may be any objects with ``compute_gradient_estimate`` whose output has
  ``mean_loss``, ``grad`` and ``unroll_state`` (duck typing, as forks of this module rely on); an output's
  ``unroll_info`` (``[steps, lanes]`` leaves) gives one `event_info` record per estimator, at a step drawn with
  ``key``.
  """
  if not is_worker_weights(worker_weights):
    raise TypeError("gradient_worker_compute: worker_weights needs the fields theta, theta_model_state and "
                    f"outer_state (like WorkerWeights), got {type(worker_weights).__name__}.")
  if len(gradient_estimators) != len(unroll_states):
    raise ValueError(f"got {len(gradient_estimators)} gradient estimators but {len(unroll_states)} unroll states.")
  if not gradient_estimators:
    raise ValueError("gradient_worker_compute needs at least one gradient estimator.")
  grads, losses, states, metrics, events = [], [], [], {}, []
  for i, (estimator, state) in enumerate(zip(gradient_estimators, unroll_states)):
    key, sub = jax.random.split(key)
    # metafam's estimators run the unroll once, with its unroll_info (read below); a fork's gets LO's call.
    eager = {"eager_unroll_info": True} if isinstance(estimator, _MFGradientEstimator) else {}
    out, est_metrics = estimator.compute_gradient_estimate(worker_weights, sub, state, with_summary=with_metrics,
                                                           **eager)
    grads.append(out.grad)
    losses.append(out.mean_loss)
    states.append(out.unroll_state)
    info = getattr(out, "unroll_info", None)
    if info is not None:
      events.append(_event_of(info, worker_weights, jax.random.fold_in(sub, 1)))
    if with_metrics:
      family = getattr(getattr(estimator, "task_family", None), "name", f"estimator{i}")
      for k, v in est_metrics.items():
        agg, name = k.split("||", 1) if "||" in k else ("mean", k)
        metrics[f"{agg}||{name}"] = v
        metrics[f"{agg}||{family}/{name}"] = v
      if extra_metrics:
        metrics[f"mean||{family}/grad_norm"] = optax.tree.norm(out.grad)
        metrics[f"mean||{family}/mean_loss"] = out.mean_loss
  grad, loss, _, _ = _zeroed_mean(grads, [jnp.asarray(l, jnp.float32) for l in losses])
  if clip_nan_loss_to_value:  # tested for truth, as the reference does (None or 0: the loss as it is)
    loss = _nan_to_num(loss, clip_nan_loss_to_value, use_jnp=True)
  to_put = AggregatedGradient(theta_grads=grad, theta_model_state=worker_weights.theta_model_state, mean_loss=loss)
  return WorkerComputeOut(to_put=to_put, unroll_states=states, metrics=metrics, event_info=events)


class GradientLearner:
  """Holds the meta-parameters' optimizer: ``init(key)``, ``get_state_for_worker(state)``,
  ``update(state, grads_list, with_metrics=False, key=None) -> (state, metrics)``."""

  def __init__(self, meta_init: Any, theta_opt: Any, init_theta_from_path: Optional[str] = None,
               init_outer_state_from_path: Optional[str] = None, reset_outer_iteration: bool = False,
               num_steps: Optional[int] = None, init_seed: Optional[int] = None):
    if not isinstance(theta_opt, _mf_opt_base.Optimizer):
      raise ValueError(f"theta_opt must be an Optimizer instance, got {theta_opt!r}.")
    self._lopt, self._theta_opt, self._num_steps = meta_init, opt_base.as_lo_optimizer(theta_opt), num_steps
    self.init_theta_from_path, self.init_outer_state_from_path = init_theta_from_path, init_outer_state_from_path
    self.reset_outer_iteration, self.init_seed = bool(reset_outer_iteration), init_seed
    self._update = jax.jit(lambda s, g, l, k: self._theta_opt.update(s, g, loss=l, key=k))

  @property
  def learned_optimizer(self) -> Any:
    return self._lopt

  def init(self, key: jax.Array) -> GradientLearnerState:
    """A fresh state from ``meta_init.init(key)``; with ``init_theta_from_path`` theta is the params of that
    `ParameterCheckpoint` file, and with ``init_outer_state_from_path`` the whole state is that `OptCheckpoint`'s
    (both written by `checkpoints.save_state`; their structure, shapes and dtypes must match), its iteration reset
    to 0 with ``reset_outer_iteration``. ``init_seed`` replaces ``key`` by ``PRNGKey(init_seed)``."""
    if self.init_seed is not None:
      key = jax.random.PRNGKey(self.init_seed)
    theta = self._lopt.init(key)
    if self.init_theta_from_path:
      theta = checkpoints.load_state(self.init_theta_from_path, ParameterCheckpoint(theta, "", 0)).params
    state = GradientLearnerState(self._theta_opt.init(theta, None, num_steps=self._num_steps))
    if self.init_outer_state_from_path:
      like = OptCheckpoint(state, 0.0, 0)
      state = checkpoints.load_state(self.init_outer_state_from_path, like).gradient_learner_state
      if self.reset_outer_iteration:
        opt_state = state.theta_opt_state
        state = GradientLearnerState(dataclasses.replace(opt_state, iteration=jnp.zeros_like(opt_state.iteration)))
    return state

  def get_meta_params(self, state: GradientLearnerState) -> Any:
    return self._theta_opt.get_params(state.theta_opt_state)

  get_lopt_params = get_meta_params

  def get_meta_model_state(self, state: GradientLearnerState) -> Any:
    return self._theta_opt.get_state(state.theta_opt_state)

  get_lopt_model_state = get_meta_model_state

  def get_state_for_worker(self, state: GradientLearnerState) -> WorkerWeights:
    return WorkerWeights(theta=self.get_meta_params(state), theta_model_state=self.get_meta_model_state(state),
                         outer_state=OuterState(state.theta_opt_state.iteration))

  def update(self, state: GradientLearnerState, grads_list: Sequence[AggregatedGradient], with_metrics: bool = False,
             key: Optional[jax.Array] = None) -> Tuple[GradientLearnerState, Dict[str, Any]]:
    if not grads_list:
      raise ValueError("GradientLearner.update needs at least one AggregatedGradient.")
    grads = jax.tree.map(lambda *g: sum(g) / len(g), *[g.theta_grads for g in grads_list])
    losses = jnp.stack([jnp.asarray(g.mean_loss, jnp.float32) for g in grads_list])
    key = jax.random.key(0) if key is None else key
    theta_opt_state = self._update(state.theta_opt_state, grads, jnp.mean(losses), key)
    metrics = {"none||mean_loss": jnp.mean(losses), "none||best_of_mean_loss": jnp.min(losses)}
    if with_metrics:
      metrics["none||theta_grad_norm"] = optax.tree.norm(grads)
    return GradientLearnerState(theta_opt_state), metrics


@jax.jit
def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def _plain_optax(theta_opt: Any) -> bool:
  """Whether ``theta_opt`` is exactly its optax transformation (an `OptaxOptimizer` whose init / update are not
  overridden), so that `MetaTrainer` may apply ``theta_opt.tx`` in its place."""
  plain_init = (optax_opts.OptaxOptimizer.init, _mf_opt_base.OptaxOptimizer.init)
  plain_update = (optax_opts.OptaxOptimizer.update, _mf_opt_base.OptaxOptimizer.update)
  return (isinstance(theta_opt, _mf_opt_base.OptaxOptimizer) and type(theta_opt).init in plain_init
          and type(theta_opt).update in plain_update)


def _engine_meta_optimizer(theta_opt: Any) -> Optional[Tuple[optax.GradientTransformation, Any, Any]]:
  """``(tx, wrap, unwrap)`` when ``theta_opt``'s update is an optax transformation ``tx`` that `MetaTrainer` can
  apply in its place, else None: a plain optax-backed optimizer (`_plain_optax`), or the reference's
  `GradientClipOptimizer` around one (LO's meta-training default; its entry-wise clip is ``optax.clip``, first in a
  chain). ``wrap`` turns the optax state kept in ``theta_opt``'s state into ``tx``'s, ``unwrap`` back."""
  if _plain_optax(theta_opt):
    return theta_opt.tx, lambda s: s, lambda s: s
  if type(theta_opt) is opt_base.GradientClipOptimizer and _plain_optax(theta_opt.opt):
    clip = optax.clip(theta_opt.grad_clip)
    return optax.chain(clip, theta_opt.opt.tx), lambda s: (clip.init(None), s), lambda s: s[1]
  return None


def _tree_mean(stack: Any) -> Any:
  """The mean over the leading axis of every leaf (jax)."""
  return jax.tree.map(lambda x: jnp.mean(x, axis=0), stack)


def _tree_mean_onp(stack: Any) -> Any:
  """The mean over the leading axis of every leaf (numpy, on the host)."""
  return jax.tree.map(lambda x: np.mean(x, axis=0), stack)


@jax.jit
def _jit_nan_to_num(vals: Any, replace: Any) -> Any:
  """Every NaN and infinity of ``vals`` replaced by ``replace`` (jitted)."""
  return jax.tree.map(lambda v: jnp.nan_to_num(v, nan=replace, posinf=replace, neginf=replace), vals)


def _nan_to_num(vals: Any, replace: Any, use_jnp: bool = False) -> Any:
  """With ``use_jnp``, `_jit_nan_to_num`; otherwise numpy's ``nan_to_num`` (NaN -> 0, infinities -> the largest
  finite values; ``replace`` unused), as the reference."""
  if use_jnp:
    return _jit_nan_to_num(vals, replace)
  return jax.tree.map(np.nan_to_num, vals)


# The field holding the optax state: metafam's OptimizerState's, or the reference's OptaxState's.
_OPTAX_FIELD = {False: "opt_state", True: "optax_opt_state"}


def _key_data(key: jax.Array) -> jax.Array:
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return jnp.asarray(key, jnp.uint32)


class SingleMachineGradientLearner:
  """Meta-trains ``learned_opt`` with the average of ``gradient_estimators``' estimates and ``theta_opt``.

  The state (`SingleMachineState`) holds ``GradientLearnerState(theta_opt_state)`` (an `OptimizerState` whose
  ``params`` are theta) and one worker state per estimator. ``update`` does not consume its input state.

  Each ``update`` is one step of the engine's meta-step, `MetaTrainer.step` (``self.meta_trainer``, built with
  ``nonfinite="zero"``: the reference's treatment of a bad meta-gradient), whenever the estimators are metafam's and
  ``theta_opt`` is a plain optax-backed optimizer or a `GradientClipOptimizer` around one. Only a fork's estimator
  or a ``theta_opt`` with an update of its own (e.g. `GradientAccumulator`) takes the reference's worker/learner
  path (`gradient_worker_compute`, `GradientLearner.update`), whose combination of estimates is the engine's too.
  Like the reference's class it lives in memory: it owns no run directory, checkpoint, metrics file or lock (the
  reference's scripts save states with `checkpoints`). A run directory with resumable checkpoints is metafam's
  `MetaTrainingRun` (from a recipe) or ``metafam.runs.train(self.meta_trainer, num_steps,
  output_dir=...)``.
  """

  def __init__(self, meta_init: MetaInitializer, gradient_estimators: Sequence[Any], theta_opt: Any,
               num_steps: Optional[int] = None):
    learned_opt = meta_init
    if isinstance(gradient_estimators, (list, tuple)):
      gradient_estimators = list(gradient_estimators)
    else:
      gradient_estimators = [gradient_estimators]
    if not gradient_estimators:
      raise ValueError("SingleMachineGradientLearner needs at least one gradient estimator.")
    self.gradient_learner = GradientLearner(learned_opt, theta_opt, num_steps=num_steps)
    self.gradient_estimators = gradient_estimators
    self.learned_opt = learned_opt
    on_metafam = all(isinstance(e, _MFGradientEstimator) for e in gradient_estimators)
    self.meta_trainer: Optional[MetaTrainer] = None
    engine_opt = _engine_meta_optimizer(theta_opt) if on_metafam else None
    if engine_opt is not None:
      tx, self._wrap, self._unwrap = engine_opt
      self.meta_trainer = MetaTrainer(learned_opt, gradient_estimators, tx, nonfinite="zero")

  # -- state --------------------------------------------------------------------------------------------------
  def init(self, key: jax.Array) -> SingleMachineState:
    key1, key = jax.random.split(key)
    learner_state = self.gradient_learner.init(key1)
    weights = self.gradient_learner.get_state_for_worker(learner_state)
    keys = jax.random.split(key, len(self.gradient_estimators))
    states = [est.init_worker_state(weights, k) for est, k in zip(self.gradient_estimators, keys)]
    return SingleMachineState(gradient_learner_state=learner_state, gradient_estimator_states=states)

  def get_meta_params(self, state: SingleMachineState) -> Any:
    return self.gradient_learner.get_meta_params(state.gradient_learner_state)

  get_lopt_params = get_meta_params

  # -- one meta-step ------------------------------------------------------------------------------------------
  def update(self, state: SingleMachineState, key: jax.Array,
             with_metrics: bool = False) -> Tuple[SingleMachineState, jax.Array, Dict[str, Any]]:
    if self.meta_trainer is None:
      return self._update_with_workers(state, key, with_metrics)
    opt_state = state.gradient_learner_state.theta_opt_state
    field = _OPTAX_FIELD[type(opt_state) is optax_opts.OptaxState]
    # MetaTrainer.step donates its input: hand it copies so the caller's state stays usable.
    theta, optax_state, workers, key_data, step = _copy((
        opt_state.params, self._wrap(getattr(opt_state, field)), tuple(state.gradient_estimator_states),
        _key_data(key), jnp.asarray(opt_state.iteration, jnp.int32)))
    mts = MetaTrainState(theta=theta, opt_state=optax_state, worker_states=workers, key_data=key_data, step=step)
    new, metrics = self.meta_trainer.step(self.meta_trainer.place(mts))
    new_opt_state = dataclasses.replace(opt_state, params=new.theta, iteration=new.step,
                                        **{field: self._unwrap(new.opt_state)})
    loss = _nan_to_num(metrics["meta_loss"], _NAN_LOSS, use_jnp=True)
    out_metrics = {"none||mean_loss": loss}
    if with_metrics:
      out_metrics.update(_as_metrics(metrics))
    return (SingleMachineState(gradient_learner_state=GradientLearnerState(new_opt_state),
                               gradient_estimator_states=list(new.worker_states)), loss, out_metrics)

  def _update_with_workers(self, state, key, with_metrics):
    key1, key2 = jax.random.split(key)
    weights = self.gradient_learner.get_state_for_worker(state.gradient_learner_state)
    out = gradient_worker_compute(weights, self.gradient_estimators, state.gradient_estimator_states, key1,
                                  with_metrics=with_metrics)
    learner_state, metrics = self.gradient_learner.update(state.gradient_learner_state, [out.to_put],
                                                          with_metrics=with_metrics, key=key2)
    metrics = {**out.metrics, **metrics}
    return (SingleMachineState(gradient_learner_state=learner_state, gradient_estimator_states=out.unroll_states),
            out.to_put.mean_loss, metrics)
