"""`MuonResidualLOpt`: Muon exactly, plus a learned residual that is zero at initialization.

A learned optimizer that starts as a weaker rule than the best hand-designed one must first relearn that rule; one
that starts *as* the rule can only move away from it where meta-training rewards it. At its initial ``theta`` this
optimizer is ``optax.contrib.muon(learning_rate)`` with its defaults, update for update
(tests/optimizers/test_muon_lopt.py checks it on matrices, vectors, conv kernels and scalars, to the rounding that
float32 Newton-Schulz amplifies):

  * a 2-D tensor (Muon's rule, as optax applies it): momentum ``mu <- beta mu + (1 - beta) g`` (``beta`` 0.95), its
    bias-corrected Nesterov look-ahead ``mu_hat``, orthogonalized by Muon's 5 quintic Newton-Schulz iterations
    (`metafam.optimizers.newton_schulz.orthogonalize`), times the shape scale ``sqrt(max(1, fan_out / fan_in))``.
    ``orthogonalization`` picks how the iteration is computed: "direct" is optax's computation; the default "auto"
    computes it in its Gram form where that needs fewer flops, the same polynomial up to float32 rounding (see that
    module; flops and accuracy: docs/performance/step-cost.md);
  * every other tensor (vectors, scalars, conv kernels): Nesterov Adam, ``optax.scale_by_adam(0.9, 0.999, 1e-8,
    nesterov=True)``, as optax's Muon pairs it; with ``conv_kernels="matrix"`` a conv kernel ``[kh, kw, c_in, c_out]``
    is instead a ``[kh * kw * c_in, c_out]`` matrix of the rule above (then the initial rule is ``optax.contrib.muon``
    with `muon_dimension_numbers("matrix")`);
  * ``step = learning_rate * u`` with ``learning_rate`` a number or an optax schedule of the update count
    (``step_mult``).

The learned part, per tensor: a per-element ReLU MLP reads features normalized to unit RMS over the tensor (the
gradient, the parameter, the momentum, and with ``residual="after"`` the rule's direction) plus a static +-1 flag
"is a matrix" (folded into the first layer's bias), and outputs ``r``; its output layer starts at zero, so ``r = 0``
at initialization and every other weight still receives a meta-gradient through the output layer. With
``center_residual`` (the default) ``r`` is centred over the tensor, ``r - mean(r)``: a residual can then reshape a
tensor's step but never push all of its entries the same way (a scalar parameter gets no residual at all). An
uncentred residual can learn a steady drift of every parameter instead (what meta-training did with it:
docs/results/ablations.md). Where ``r`` enters is the design option the dev suite chooses between:

  * ``residual="after"``: ``u = gain * (d + rms(d) * r)`` with ``d`` the rule's direction: the residual is in units
    of the direction's own RMS, so ``r`` of order 1 is a change of order 1 whatever the tensor's shape;
  * ``residual="before"`` (Celo2's placement: orthogonalize the network's output per matrix): for a 2-D tensor
    ``u = gain * NS(mu_hat + rms(mu_hat) * r) * shape scale``, so every matrix step stays orthogonalized; other
    tensors as ``"after"``.

``gain = exp(log_gain[kind])`` with one learned scalar for matrices and one for the other tensors (0 at init): the
ratio of the Adam part's step to the Muon part's, which ``optax.contrib.muon`` ties to one learning rate. A matrix's
gain also has a learned per-layer scale (µP-style): ``(fan_in / base_fan_in) ** shape_power[0] * (fan_out /
base_fan_in) ** shape_power[1]``, with ``shape_power`` starting at ``(-fan_in_power, 0)``; ``fan_in_power`` is 0 by
default, so the initial rule is exactly Muon (0.5 makes the initial step ``(base_fan_in / fan_in) ** 0.5`` times
Muon's, the untrained scaling that scored best on the dev suite for ``adafac_muon_rms_lopt``). There are no step or
horizon features.

State per tensor: Muon's momentum (matrices) or Adam's two moments (other tensors), float32 (float64 for float64
params): about as many numbers as the parameters for matrix-dominated models, no copy of the params. The MLP costs
about a hundred flops per element; the Newton-Schulz iterations (tens of thousands per element for 1,000-wide
matrices) dominate, as in Muon.

Meta-parameters (default config): 61 (``residual="after"``, registered as ``muon_residual_lopt``); with
``residual="before"`` (``muon_celo_lopt``): 53.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, TypedDict, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from metafam._checks import check_choice, check_number, check_positive_int
from metafam.optimizers import _features as F
from metafam.optimizers import contract, newton_schulz
from metafam.optimizers.contract import LearnedOptState
from metafam.optimizers.base import Optimizer
from metafam.optimizers.learned import LearnedOptimizer
from metafam.optimizers.mlp_lopt import rms_normalize

RESIDUALS = ("after", "before", "none")

BASE_SCHEDULES = ("constant", "warmup_cosine")
# The shipped baselines' warmup (metafam.benchmark.baselines; tests/optimizers/test_muon_lopt.py pins it).
WARMUP_FRACTION = 0.05


def warmup_cosine(count: jax.Array, horizon: jax.Array, warmup_fraction: float = WARMUP_FRACTION) -> jax.Array:
  """The shipped baselines' warmup+cosine multiplier at update ``count`` of a run of ``horizon`` updates: linear
  from 0 over ``w = max(1, round(warmup_fraction * horizon))`` updates, then cosine decay to 0 at ``horizon``.

  ``optax.warmup_cosine_decay_schedule(0, 1, w, horizon, 0)(count)`` (what `metafam.benchmark.baselines.unit_schedule`
  calls), term for term, but for a traced ``horizon`` (each lane's trajectory length): optax needs ``w`` and the
  horizon as Python numbers. The two agree to 2 ulps (a compiled division by a constant rounds differently).
  """
  horizon = jnp.asarray(horizon, jnp.float32)
  warmup = jnp.maximum(1.0, jnp.round(jnp.float32(warmup_fraction) * horizon))
  count = jnp.asarray(count, jnp.float32)
  rising = 1.0 - (1.0 - jnp.clip(count, 0.0, warmup) / warmup)
  decay_steps = horizon - warmup
  falling = 0.5 * (1.0 + jnp.cos(jnp.pi * jnp.minimum(count - warmup, decay_steps) / decay_steps))
  return jnp.where(count < warmup, rising, falling)


CONV_KERNELS = ("adam", "matrix")


# The accumulators of one tensor. Typed dicts, not NamedTuples: inner optimizer states are stored in meta-training
# checkpoints (the worker states), whose format records a dict as a dict, so these keep resuming runs written with
# the plain dicts of earlier versions.
class MatrixAccumulators(TypedDict):
  """A tensor Muon orthogonalizes: its momentum."""
  mu: jax.Array


class AdamAccumulators(TypedDict):
  """Every other tensor (Nesterov Adam): the first and second moments."""
  mu: jax.Array
  nu: jax.Array


Accumulators = Union[MatrixAccumulators, AdamAccumulators]


def matrix_fans(x: Any, conv_kernels: str = "adam") -> Optional[tuple]:
  """The ``(fan_in, fan_out)`` Muon orthogonalizes a tensor as, or None for a tensor Muon leaves to Adam.

  A 2-D tensor is its own matrix (optax's Muon by default). A 4-D conv kernel (haiku's ``[kh, kw, c_in, c_out]``) is
  left to Adam with ``conv_kernels="adam"`` (optax's default) or, with ``"matrix"``, orthogonalized as the
  ``[kh * kw * c_in, c_out]`` matrix it multiplies the image patches by, as Muon's authors run conv nets (optax:
  `muon_dimension_numbers`).
  """
  shape = jnp.shape(x)
  if len(shape) == 2:
    return tuple(shape)
  if len(shape) == 4 and conv_kernels == "matrix":
    return (int(np.prod(shape[:3])), shape[3])
  return None


def muon_dimension_numbers(conv_kernels: str = "adam"):
  """``optax.contrib.muon``'s ``muon_weight_dimension_numbers`` for the same rule as `matrix_fans` (None: optax's
  default, exactly the 2-D tensors)."""
  check_choice("conv_kernels", conv_kernels, CONV_KERNELS)
  if conv_kernels == "adam":
    return None
  dims = optax.contrib.MuonDimensionNumbers
  return lambda params: jax.tree.map(
      lambda x: None if matrix_fans(x, conv_kernels) is None else
      dims(reduction_axis=tuple(range(jnp.ndim(x) - 1)), output_axis=jnp.ndim(x) - 1), params)


def shape_scale(shape: Sequence[int]) -> jax.Array:
  """Muon's width-transfer scale of a ``[fan_in, fan_out]`` matrix: ``sqrt(max(1, fan_out / fan_in))`` (optax)."""
  return jnp.sqrt(jnp.maximum(1, shape[1] / shape[0]))


class MuonResidualLOpt(LearnedOptimizer):
  """Muon on matrices and Nesterov Adam elsewhere, plus a learned residual zero at init; see the module docstring.

  Args:
    hidden_sizes: widths of the residual MLP's ReLU hidden layers.
    residual: ``"after"`` (added to the rule's direction), ``"before"`` (added to the momentum before the
      Newton-Schulz orthogonalization of a matrix: Celo2's placement) or ``"none"`` (no residual MLP: only the gains
      and the schedule are learned).
    step_mult: the learning rate, a number or an optax schedule of the update count.
    beta: Muon's momentum decay; adam_b1, adam_b2, eps: the Adam part's (optax's Muon defaults).
    fan_in_power, base_fan_in: a matrix's step starts multiplied by ``(base_fan_in / fan_in) ** fan_in_power``
      (0: the initial rule is exactly Muon); the exponents of fan-in and fan-out are learned from there.
    norm_eps: the ``eps`` of the per-tensor RMS normalization of the features.
    orthogonalization: "direct", "gram" or "auto" (the cheaper per matrix shape), see
      `metafam.optimizers.newton_schulz`.
    lr_spread: s >= 1. While meta-training (``opt_fn(theta, is_training=True)``, as `TruncatedStep` calls it),
      each trajectory's steps are multiplied by one factor drawn log-uniformly in ``[1/s, s]`` at its start, so that
      theta is trained for the learning rates around ``step_mult`` a user's tuning grid tries (s = sqrt(10) spans
      one point of the half-decade grid each way). Evaluation and the optax face are unaffected. 1: off.
    center_residual: subtract the residual's mean over each tensor (see the module docstring; the output layer's
      bias then has no effect); False leaves it uncentred.
    conv_kernels: "adam" (optax's Muon: conv kernels get the Adam part) or "matrix" (orthogonalized as their
      ``[kh * kw * c_in, c_out]`` matrix, see `matrix_fans`).
    schedule_knots: K >= 2 adds a learned schedule over the fraction of training done, ``f = count / num_steps``:
      every step is multiplied by ``exp(s(f))``, ``s`` the piecewise-linear interpolation of ``theta["log_schedule"]``
      (K values, 0 at init) at K knots evenly spaced in [0, 1]. The optimizer then needs the run's length:
      ``init(..., num_steps=T)``, ``as_optax(theta, num_steps=T)``. 0 (the default): no schedule.
    learn_fan_exponents: False keeps a matrix's fan exponents at ``(-fan_in_power, 0)`` instead of learning them
      (theta then has no ``shape_power``): the width rule stays Muon's shape scale (times ``fan_in_power``'s), the
      one that transfers to widths meta-training never saw.
    base_schedule: "constant" (the step is ``step_mult``) or "warmup_cosine": the step is also multiplied by the
      shipped baselines' warmup+cosine schedule over the run (`warmup_cosine`; 5% linear warmup, cosine to 0), so
      that at the initial theta the optimizer is Muon with warmup+cosine, the best single-setting rule of the dev
      suite, and a learned schedule (``schedule_knots``) is a residual on it. Needs the run's length, as the knots do.
  """

  low_rank_weights = True  # its 2-D meta-parameters are read by F.mlp_columns / F.mlp_bias0 only

  @property
  def lane_chunk(self):
    """Vectorized training updates its lanes in blocks of `newton_schulz.lane_chunk` (1 on a CPU)."""
    return newton_schulz.lane_chunk()

  def __init__(self, hidden_sizes: Sequence[int] = (8,), residual: str = "after", step_mult: Any = 1e-2,
               beta: float = 0.95, adam_b1: float = 0.9, adam_b2: float = 0.999, eps: float = 1e-8,
               fan_in_power: float = 0.0, base_fan_in: int = 64, norm_eps: float = 1e-12, lr_spread: float = 1.0,
               orthogonalization: str = "auto", center_residual: bool = True, conv_kernels: str = "adam",
               schedule_knots: int = 0, learn_fan_exponents: bool = True, base_schedule: str = "constant"):
    self.hidden_sizes = F.check_sizes("hidden_sizes", hidden_sizes)
    self.residual = check_choice("residual", residual, RESIDUALS)
    self.step_mult = step_mult if callable(step_mult) else F.check_positive_float("step_mult", step_mult)
    self.beta = F.check_unit_interval("beta", beta)
    self.adam_b1 = F.check_unit_interval("adam_b1", adam_b1)
    self.adam_b2 = F.check_unit_interval("adam_b2", adam_b2)
    self.eps = F.check_positive_float("eps", eps)
    self.fan_in_power = F.check_positive_float("fan_in_power", fan_in_power, allow_zero=True)
    self.base_fan_in = check_positive_int("base_fan_in", base_fan_in)
    self.norm_eps = F.check_positive_float("norm_eps", norm_eps)
    self.lr_spread = float(check_number("lr_spread", lr_spread, low=1.0))
    self.orthogonalization = check_choice("orthogonalization", orthogonalization, newton_schulz.FORMS)
    if not isinstance(center_residual, bool):
      raise ValueError(f"center_residual must be True or False, got {center_residual!r}.")
    self.center_residual = center_residual
    self.conv_kernels = check_choice("conv_kernels", conv_kernels, CONV_KERNELS)
    self.schedule_knots = int(check_number("schedule_knots", schedule_knots, low=0, integer=True))
    if not isinstance(learn_fan_exponents, bool):
      raise ValueError(f"learn_fan_exponents must be True or False, got {learn_fan_exponents!r}.")
    self.learn_fan_exponents = learn_fan_exponents
    self.base_schedule = check_choice("base_schedule", base_schedule, BASE_SCHEDULES)
    if self.schedule_knots == 1:
      raise ValueError("schedule_knots must be 0 (no schedule) or >= 2 (a knot at the start and one at the end), "
                       "got 1.")

  @property
  def uses_horizon(self) -> bool:
    """Whether the step depends on the run's length (``schedule_knots``, ``base_schedule``): init then needs
    ``num_steps``."""
    return self.schedule_knots > 0 or self.base_schedule != "constant"

  @property
  def name(self) -> str:
    options = f", residual {self.residual}"
    if self.fan_in_power:
      options += f", fan-in^-{self.fan_in_power:g} from {self.base_fan_in}"
    if self.lr_spread != 1.0:
      options += f", lr spread {self.lr_spread:g}"
    if self.orthogonalization != "auto":
      options += f", {self.orthogonalization} Newton-Schulz"
    if not self.center_residual:
      options += ", uncentred"
    if self.conv_kernels != "adam":
      options += ", conv kernels as matrices"
    if self.schedule_knots:
      options += f", {self.schedule_knots}-knot schedule"
    if not self.learn_fan_exponents:
      options += ", fixed fan exponents"
    if self.base_schedule != "constant":
      options += f", {self.base_schedule.replace('_', '+')} base"
    if self.residual == "none":  # no MLP: no widths to name
      return f"MuonResidualLOpt({options[2:]})"
    return f"MuonResidualLOpt({'x'.join(map(str, self.hidden_sizes))}{options})"

  @property
  def num_leaf_features(self) -> int:
    """Per-element features: gradient, parameter, momentum (+ the rule's direction with ``residual="after"``)."""
    return 3 + int(self.residual == "after")

  def init(self, key: jax.Array) -> dict:
    theta = {"log_gain": jnp.zeros((2,), jnp.float32)}
    if self.learn_fan_exponents:
      theta["shape_power"] = self.initial_fan_exponents()
    if self.residual != "none":
      sizes = (self.num_leaf_features + 1,) + self.hidden_sizes + (1,)  # + the static "is a matrix" flag
      theta["mlp"] = F.init_mlp(key, sizes, out_scale=0.0)
    if self.schedule_knots:
      theta["log_schedule"] = jnp.zeros((self.schedule_knots,), jnp.float32)
    return theta

  def opt_fn(self, theta: dict, is_training: bool = False) -> Optimizer:
    """The optimizer for ``theta``; with ``is_training`` (meta-training) it applies ``lr_spread``."""
    return contract.ThetaOptimizer(self, theta, lr_spread=self.lr_spread if is_training else 1.0)

  # -- one tensor ---------------------------------------------------------------------------------------------
  def init_accumulators(self, p: jax.Array) -> Accumulators:
    """Zero accumulators of one tensor: `MatrixAccumulators` for a matrix, `AdamAccumulators` otherwise."""
    if matrix_fans(p, self.conv_kernels) is None:
      return AdamAccumulators(mu=F.zeros_like_in(p), nu=F.zeros_like_in(p))
    return MatrixAccumulators(mu=F.zeros_like_in(p))

  def step_scale(self, count: jax.Array) -> Any:
    return self.step_mult(count) if callable(self.step_mult) else self.step_mult

  def leaf_step(self, theta: dict, count: jax.Array, horizon: Optional[jax.Array] = None):
    """``(p, g, accumulators) -> (step, new accumulators)`` for the update at ``count`` (0-based) with ``theta``
    (the contract, `metafam.optimizers.contract`, subtracts the step); ``horizon``: the run's number of
    updates, for the learned schedule (``schedule_knots``) only."""
    scale = self.step_scale(count)
    if self.uses_horizon and horizon is None:
      raise ValueError(f"{self.name} reads the run's length: leaf_step needs horizon= (the run's number of updates).")
    if self.base_schedule == "warmup_cosine":
      scale = scale * warmup_cosine(count, horizon)
    if self.schedule_knots:
      scale = scale * jnp.exp(self.log_schedule(theta, count, horizon))

    def step(p, g, acc):
      u, new_acc = self.leaf_direction(theta, count, p, g, acc)
      return jnp.asarray(scale, u.dtype) * u, new_acc
    return step

  def leaf_direction(self, theta: dict, count: jax.Array, p: jax.Array, g: jax.Array, acc: Accumulators):
    """``(u, new accumulators)`` for one tensor at update ``count``: the step is ``step_scale * u``."""
    dt = acc["mu"].dtype
    g, p_c, fans = g.astype(dt), p.astype(dt), matrix_fans(p, self.conv_kernels)
    matrix = fans is not None
    if matrix:
      mu = optax.tree.update_moment(g, acc["mu"], self.beta, 1)  # optax.contrib.scale_by_muon, term for term
      count_inc = optax.safe_increment(count)
      m = (self.beta * optax.tree.bias_correction(mu, self.beta, optax.safe_increment(count_inc))
           + (1 - self.beta) * optax.tree.bias_correction(g, self.beta, count_inc))
      new_acc = MatrixAccumulators(mu=mu)
    else:
      adam = optax.scale_by_adam(self.adam_b1, self.adam_b2, self.eps, nesterov=True)
      d, state = adam.update(g, optax.ScaleByAdamState(count=count, mu=acc["mu"], nu=acc["nu"]))
      m, new_acc = state.mu, AdamAccumulators(mu=state.mu, nu=state.nu)
    features = [g, p_c, m]
    r = None
    if self.residual == "none":
      d = self._orthogonalize(m, fans) * shape_scale(fans) if matrix else d
    elif self.residual == "before" and matrix:
      r = self._residual(theta, features, matrix)
      d = self._orthogonalize(m + _rms(m, self.norm_eps) * r, fans) * shape_scale(fans)
    else:
      if matrix:
        d = self._orthogonalize(m, fans) * shape_scale(fans)
      r = self._residual(theta, features + [d] if self.residual == "after" else features, matrix)
      d = d + _rms(d, self.norm_eps) * r
    log_gain = theta["log_gain"][0 if matrix else 1]
    if matrix and (self.learn_fan_exponents or self.fan_in_power):
      # exp(0 * log(...)) is exactly 1: at shape_power = 0 the gain is exactly exp(log_gain)
      log_fans = np.log(np.asarray(fans, np.float64) / self.base_fan_in).astype(np.float32)
      power = theta["shape_power"] if self.learn_fan_exponents else self.initial_fan_exponents()
      log_gain = log_gain + jnp.dot(power, log_fans)
    return (jnp.exp(log_gain).astype(dt) * d).astype(dt), new_acc

  def initial_fan_exponents(self) -> jax.Array:
    """``f32[2]``: the exponents of ``fan_in / base_fan_in`` and ``fan_out / base_fan_in`` at init."""
    return jnp.asarray([-self.fan_in_power, 0.0], jnp.float32)

  def log_schedule(self, theta: dict, count: jax.Array, horizon: jax.Array) -> jax.Array:
    """The learned log step multiplier at update ``count`` of ``horizon``: ``theta["log_schedule"]`` interpolated
    linearly at ``count / horizon`` (clipped to [0, 1]) between knots evenly spaced in [0, 1]."""
    fraction = jnp.clip(jnp.asarray(count, jnp.float32) / jnp.asarray(horizon, jnp.float32), 0.0, 1.0)
    knots = jnp.linspace(0.0, 1.0, self.schedule_knots, dtype=jnp.float32)
    return jnp.interp(fraction, knots, theta["log_schedule"])

  def _orthogonalize(self, m: jax.Array, fans: Sequence[int]) -> jax.Array:
    """``m`` orthogonalized as its ``fans`` matrix, in ``m``'s shape."""
    return newton_schulz.orthogonalize(m.reshape(fans), self.orthogonalization).reshape(jnp.shape(m))

  def _residual(self, theta: dict, features: list, matrix: bool) -> jax.Array:
    x = jnp.stack(features, axis=0)
    x = rms_normalize(x, range(1, x.ndim), self.norm_eps)
    flag = jnp.asarray([1.0 if matrix else -1.0], x.dtype)
    bias0 = F.mlp_bias0(theta["mlp"], flag, self.num_leaf_features)
    r = F.mlp_columns(theta["mlp"], x.reshape(x.shape[0], -1), bias0, len(self.hidden_sizes) + 1)[0]
    if self.center_residual:
      r = r - jnp.mean(r)
    return r.reshape(jnp.shape(features[0])).astype(features[0].dtype)


def _rms(x: jax.Array, eps: float) -> jax.Array:
  return jnp.sqrt(jnp.mean(jnp.square(x)) + eps)


MuonResidualOptaxState = LearnedOptState  # the optax state of `MuonResidualLOpt.as_optax` (no params: ``as_optax``
# returns ``-step`` itself, so at the initial theta its updates are optax.contrib.muon's; ``num_steps`` needed with
# ``schedule_knots``)
