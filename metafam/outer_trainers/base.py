"""The gradient-estimator interface shared by every outer trainer, and the pieces the ES family shares.

An estimator is functional (evosax-style): ``init_worker_state(theta, key) -> worker_state`` and
``estimate(theta, worker_state, key) -> (GradientEstimate, new_worker_state)``; both are pure and jittable, so a
meta-training step can fuse estimation and the meta-update in one program.

ES scaling, used by every ES estimator here: perturbations are ``eps = sigma * z`` with ``z ~ N(0, I)`` (``sigma`` is a
standard deviation), each applied antithetically (``theta + eps`` and ``theta - eps`` share keys and data), and the
estimate is ``mean_pairs((L+ - L-) * eps) / (2 sigma^2)``: unbiased for the gradient of the Gaussian-smoothed
meta-loss ``E_z[L(theta + sigma z)]``, which equals the true gradient on a quadratic.

Low-rank perturbations (``perturbation="low_rank"``, `PERTURBATIONS`): each matrix-shaped leaf ``W [m, n]`` of
theta is perturbed by ``eps = sigma * A @ B.T / sqrt(r)`` with ``A [m, r]``, ``B [n, r]`` standard normal, held as
the factors (`metafam.optimizers.low_rank.LowRank` with ``a = sigma * A / sqrt(r)``, ``b = B``); other leaves keep
full Gaussian noise. Every entry of ``A B^T / sqrt(r)`` has mean 0 and variance 1 and distinct entries are
uncorrelated, so ``E[eps eps^T] = sigma^2 I`` as for full noise and the same estimate stays unbiased for the
gradient of the smoothed loss on a quadratic (to first order in sigma elsewhere); its variance differs (the
factors' fourth moments are larger). A perturbed theta applies ``W`` once for all lanes plus a rank-r product per
lane (see `metafam.optimizers.low_rank`).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from metafam._checks import check_positive
from metafam._identity import own_program
from metafam._pytree import DataPytree
from metafam.optimizers import low_rank
from metafam.inner import sharding
from metafam.inner.lane_step import NONFINITE_CAUSES, UnrollOutput
from metafam.nonfinite import percent, report

# The metrics counting each cause of a masked step (`UnrollOutput.nonfinite`), in the order of NONFINITE_CAUSES.
NONFINITE_METRICS = ("nonfinite_loss", "nonfinite_gradient", "nonfinite_meta_loss", "nonfinite_params")

LOSS_KINDS = ("meta_loss", "normalized_meta_loss", "loss", "normalized_loss")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GradientEstimate:
  """One meta-gradient estimate.

  Attributes:
    grad: pytree like theta.
    meta_loss: f32 scalar, the mean (unperturbed or antithetic-average) meta-loss the estimate is about; NaN when
      every step (or pair) was non-finite, so the estimate carries no information (its gradient is then 0).
    metrics: dict of f32 scalars, e.g. ``num_nonfinite`` (masked steps or pairs), ``nonfinite_fraction`` (their
      fraction of the estimate's steps, pair-steps or pairs) and `NONFINITE_METRICS` (the lane-steps masked for
      each cause, both particles counted).
    unroll_info: None, unless the estimate was asked for it (``estimate(..., with_unroll_info=True)``): the
      per-step outputs of the estimate's unroll, a `metafam.inner.lane_step.UnrollOutput` of
      ``[num_steps, num_lanes]`` arrays with ``cfg`` filled (which lanes: see each estimator).
  """
  grad: Any
  meta_loss: jax.Array
  metrics: Dict[str, jax.Array]
  unroll_info: Optional[UnrollOutput] = None


class GradientEstimator(DataPytree, abc.ABC):
  """The protocol every meta-gradient estimator follows; everything `MetaTrainer` uses is declared here.

  A subclass implements the two pure, jittable functions:

  * ``init_worker_state(theta, key) -> worker_state``: the estimator's own state (inner lanes, accumulators; any
    pytree, ``{}`` for none);
  * ``estimate_fn(theta, worker_state, key) -> (GradientEstimate, new worker_state)``;

  and, to offer the per-step outputs of its unroll, set ``reports_unroll_info = True`` and accept a keyword
  ``with_unroll_info`` in ``estimate_fn`` (fill `GradientEstimate.unroll_info` when it is True, from the same
  unroll: never a second one);

  and may override ``name`` (its label in metrics), `mesh` (the devices its lanes are spread over), `lane_major`
  (which worker-state leaves have a leading lane axis), `inner_steps_per_estimate` (throughput bookkeeping) and
  ``_data_fields``: the attributes holding device arrays (e.g. its `TruncatedStep`). An estimator is a pytree with
  those attributes as leaves (`metafam._pytree.DataPytree`), and `MetaTrainer` and `estimate` pass it into their
  jitted programs, so those arrays are program inputs; anything else the estimator holds is static (arrays held
  elsewhere are compiled in as constants). `estimate` is `estimate_fn` jitted, with inputs placed on the devices.
  """

  name: str = "estimator"
  #: Whether ``estimate_fn`` takes ``with_unroll_info`` (metafam's estimators do; a user estimator may opt in).
  reports_unroll_info: bool = False
  #: What `estimate` does when its metrics' ``nonfinite_fraction`` is above 0 (`metafam.nonfinite`); metafam's
  #: estimators take their `TruncatedStep`'s.
  on_nonfinite: str = "ignore"
  #: What ``nonfinite_fraction`` is a fraction of, for the message.
  nonfinite_unit: str = "steps"

  @property
  def mesh(self) -> Optional[Mesh]:
    """The `jax.sharding.Mesh` the lanes are spread over, or None (one device)."""
    return None

  @property
  def inner_steps_per_estimate(self) -> int:
    """Inner steps (summed over lanes) one estimate runs; for throughput metrics (0 if not counted)."""
    return 0

  @abc.abstractmethod
  def init_worker_state(self, theta: Any, key: jax.Array) -> Any:
    """The initial worker state (pure)."""

  @abc.abstractmethod
  def estimate_fn(self, theta: Any, worker_state: Any, key: jax.Array):
    """Pure: ``(GradientEstimate, new worker_state)``."""

  def estimate(self, theta: Any, worker_state: Any, key: jax.Array, *, with_unroll_info: bool = False):
    """`estimate_fn` jitted (compiled once per estimator and input structure).

    ``with_unroll_info=True`` (estimators with ``reports_unroll_info``) also returns the per-step outputs of the
    estimate's unroll in ``GradientEstimate.unroll_info``; it is a separate compiled program, so the default one
    (False) is exactly the program without the option: no extra outputs, memory or time.
    """
    if not isinstance(with_unroll_info, bool):
      raise TypeError(f"with_unroll_info must be a bool, got {with_unroll_info!r}.")
    if with_unroll_info and not self.reports_unroll_info:
      raise NotImplementedError(f"with_unroll_info=True: {type(self).__name__} does not report its unroll's "
                                "per-step outputs (reports_unroll_info is False).")
    attr = "_jitted_estimate_with_info" if with_unroll_info else "_jitted_estimate"
    fn = type(self)._placed_estimate_fn_with_info if with_unroll_info else type(self)._placed_estimate_fn
    jitted = own_program(self, attr, lambda: jax.jit(fn))  # per estimator: the programs die with it
    theta, worker_state = self.place_theta(theta), self.place_worker_state(worker_state)
    estimate, worker_state = jitted(self, theta, worker_state, sharding.place(key, self.mesh, lane_major=False))
    if self.on_nonfinite != "ignore" and "nonfinite_fraction" in estimate.metrics:
      metrics = {k: float(v) for k, v in jax.device_get(estimate.metrics).items() if jnp.ndim(v) == 0}
      if metrics["nonfinite_fraction"] > 0:
        report(self.nonfinite_message(metrics, float(estimate.meta_loss)), self.on_nonfinite)
    return estimate, worker_state

  @property
  def label(self) -> str:
    """The estimator in messages: its class, and its family where it has one."""
    family = getattr(getattr(getattr(self, "step", None), "family", None), "name", None)
    return type(self).__name__ + (f" on family {family!r}" if family else "")

  def nonfinite_message(self, metrics: Dict[str, float], meta_loss: float, prefix: str = "",
                        where: str = "GradientEstimate.metrics['nonfinite_fraction']") -> str:
    """The report of an estimate whose ``metrics`` (host numbers) say that some of its steps were masked; ``where``
    names what holds the fraction."""
    causes = [f"the {name} in {metrics[k]:g}" for name, k in zip(NONFINITE_CAUSES, NONFINITE_METRICS)
              if metrics.get(k, 0) > 0]
    total = metrics.get("nonfinite_total", 0)
    share = (percent(round(metrics["nonfinite_fraction"] * total), total, self.nonfinite_unit) if total else
             f"{100 * metrics['nonfinite_fraction']:.1f}% of the {self.nonfinite_unit}")
    text = (f"{prefix}{self.label}: {share} of the estimate were masked because a value went non-finite"
            + (f" ({', '.join(causes)} lane-steps)" if causes else ""))
    if not np.isfinite(meta_loss):
      return text + ("; none was finite, so the estimate's meta_loss is NaN and its gradient 0 (MetaTrainer skips "
                     f"that meta-update; {where}).")
    return text + f"; the estimate is over the others ({where})."

  def _placed_estimate_fn(self, theta, worker_state, key):
    estimate, worker_state = self.estimate_fn(theta, worker_state, key)
    return estimate, self.place_worker_state(worker_state)

  def _placed_estimate_fn_with_info(self, theta, worker_state, key):
    estimate, worker_state = self.estimate_fn(theta, worker_state, key, with_unroll_info=True)
    return estimate, self.place_worker_state(worker_state)

  def lane_major(self, worker_state: Any) -> Any:
    """A tree of bools like ``worker_state``: which leaves have a leading lane axis (by default all of them)."""
    return jax.tree.map(lambda _: True, worker_state)

  def place_theta(self, theta: Any) -> Any:
    """``theta`` (or any tree of shared values, e.g. a meta-optimizer state) replicated on the estimator's devices."""
    return sharding.place(theta, self.mesh, lane_major=False)

  def place_worker_state(self, worker_state: Any) -> Any:
    """``worker_state`` on the estimator's devices, lane-major leaves split by lane, the rest replicated (outside
    jit it moves the arrays; inside, it keeps the output laid out like the input). See `sharding.place`."""
    if self.mesh is None:
      return worker_state
    return sharding.place(worker_state, self.mesh, self.lane_major(worker_state))


def check_loss_kind(loss_kind: str) -> str:
  if loss_kind not in LOSS_KINDS:
    raise ValueError(f"loss_kind must be one of {LOSS_KINDS}, got {loss_kind!r}.")
  return loss_kind


def step_losses(out: UnrollOutput, loss_kind: str):
  """``(losses, mask)``, both ``[num_steps, num_lanes]``; masked entries are 0."""
  return getattr(out, loss_kind), out.mask


PERTURBATIONS = ("full", "low_rank")


def check_perturbation(perturbation: str, rank: int) -> Optional[int]:
  """The factor rank of ``perturbation`` ("full": None), or ValueError naming the bad argument."""
  if perturbation not in PERTURBATIONS:
    raise ValueError(f"perturbation must be one of {PERTURBATIONS}, got {perturbation!r}.")
  check_positive("rank", rank, integer=True)
  return rank if perturbation == "low_rank" else None


def _is_low_rank(x: Any) -> bool:
  return isinstance(x, low_rank.LowRank)


def _perturbation_shapes(theta: Any, num: int, rank: Optional[int]) -> Any:
  """Per leaf of theta: the `jax.ShapeDtypeStruct` of its dense noise, or a `LowRank` of its factors' ones."""
  def one(x):
    shape, dtype = jnp.shape(x), jnp.result_type(x)
    if rank is None or len(shape) != 2:
      return jax.ShapeDtypeStruct((num,) + shape, dtype)
    return low_rank.LowRank(jax.ShapeDtypeStruct((num, shape[0], rank), dtype),
                            jax.ShapeDtypeStruct((num, shape[1], rank), dtype))
  return jax.tree.map(one, theta)


def sample_perturbations(theta: Any, key: jax.Array, num: int, sigma: float, rank: Optional[int] = None) -> Any:
  """``num`` perturbations ``sigma * z`` shaped like theta with a leading ``num`` axis (one key per leaf); with
  ``rank``, matrix leaves get low-rank noise held as `LowRank` factors (see the module docstring)."""
  leaves, treedef = jax.tree.flatten(theta)
  keys = jax.random.split(key, max(len(leaves), 1))

  def one(k, spec):
    if not _is_low_rank(spec):
      return sigma * jax.random.normal(k, spec.shape, spec.dtype)
    k_a, k_b = jax.random.split(k)
    a = (sigma / np.sqrt(spec.a.shape[-1])) * jax.random.normal(k_a, spec.a.shape, spec.a.dtype)
    return low_rank.LowRank(a, jax.random.normal(k_b, spec.b.shape, spec.b.dtype))
  specs = treedef.flatten_up_to(_perturbation_shapes(theta, num, rank))
  return jax.tree.unflatten(treedef, [one(k, spec) for k, spec in zip(keys, specs)])


def zero_perturbations(theta: Any, num: int, rank: Optional[int] = None) -> Any:
  """Zeros laid out like ``sample_perturbations(theta, key, num, sigma, rank)``."""
  return jax.tree.map(lambda spec: jnp.zeros(spec.shape, spec.dtype), _perturbation_shapes(theta, num, rank))


def dense_perturbations(noise: Any) -> Any:
  """Perturbations as dense theta-shaped arrays (`LowRank` factors multiplied out, per perturbation)."""
  return low_rank.dense_tree(noise)


def weighted_noise_sum(coef: jax.Array, noise: Any) -> Any:
  """``sum_i coef[i] * noise[i]`` per leaf (``coef: [N]``, noise leaves ``[N, ...]``); for `LowRank` factors
  ``sum_i coef[i] a_i b_i^T`` as one contraction, without forming the ``N`` matrices."""
  def one(e):
    if _is_low_rank(e):
      return jnp.einsum("imr,inr->mn", coef.astype(e.a.dtype)[:, None, None] * e.a, e.b)
    return jnp.tensordot(coef.astype(e.dtype), e, axes=1)
  return jax.tree.map(one, noise, is_leaf=_is_low_rank)


def nonfinite_metrics(out: UnrollOutput, masked: jax.Array) -> Dict[str, jax.Array]:
  """``nonfinite_fraction`` (the mean of ``masked``: 1 where a step, pair-step or pair of the estimate was left out,
  else 0), ``nonfinite_total`` (their number) and the count of each cause of ``out``'s masked lane-steps
  (`NONFINITE_METRICS`)."""
  metrics = {"nonfinite_fraction": jnp.mean(masked).astype(jnp.float32),
             "nonfinite_total": jnp.asarray(masked.size, jnp.float32)}
  for code, name in enumerate(NONFINITE_METRICS, 1):
    metrics[name] = jnp.sum(out.nonfinite == code).astype(jnp.float32)
  return metrics


def count_nonfinite(tree: Any) -> jax.Array:
  """The number of non-finite entries of ``tree`` (int32)."""
  leaves = jax.tree.leaves(tree)
  return sum(jnp.sum(~jnp.isfinite(x)) for x in leaves) if leaves else jnp.asarray(0)


def zero_nonfinite(tree: Any):
  """Replaces non-finite entries by 0; returns ``(tree, number of replaced entries)``."""
  return jax.tree.map(lambda x: jnp.where(jnp.isfinite(x), x, 0.0), tree), count_nonfinite(tree)
