"""Task augmentations: wrappers that change how a task looks to the optimizer while keeping it a `Task`.

Every wrapper holds the inner task as ``.task``, shares its ``datasets`` and appends a suffix to its ``name``. Wrappers
override ``init_with_state`` and ``loss_with_state_and_aux``, so every loss variant of the base `Task` works, and they
forward ``normalizer`` so normalized losses stay comparable with the unwrapped task. Hyper-parameters (scales, noise
levels) may be traced arrays, so families can sample them per instance (`metafam.taskfamilies.augmentations`).

* `ReparamWeights`: the optimizer sees ``q`` with params ``p = q * scale`` (changes the gradient scale per leaf).
* `ReducedBatchSize`: the loss uses only the first ``batch_size`` examples of each batch.
* `LowPrecision` / `BF16Params`: params stored and computed in a low-precision dtype, loss returned in float32.
* `LossScale`: the loss times a constant; ``normalizer`` divides it back out.
* `NoisyGradients`, `ClipGradients`: ``jax.grad`` of the loss sees modified gradients (a `jax.custom_vjp` on the
  params; the loss value is unchanged). Reverse-mode only: `jax.jvp` through them raises.
* `ESGradients`: ``jax.grad`` of the loss w.r.t. the params is an antithetic evolution-strategies estimate
  (`antithetic_es_value_and_grad`) instead of backpropagation; loss values unchanged.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from metafam._checks import check_positive_int
from metafam.tasks.base import Task

# fold_in tag that derives the gradient-noise key from the loss key, independent of what the inner task draws.
_NOISE_TAG = 0x6E6F6973


def _is_float(x: Any) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


class TaskWrapper(Task):
  """Base of the augmentations: forwards everything to ``task``; subclasses override what they change.

  Args:
    task: the inner `Task`.
    suffix: appended to the inner name as ``f"{task.name}_{suffix}"``.
  """

  def __init__(self, task: Task, suffix: str):
    if not isinstance(task, Task):
      raise TypeError(f"{type(self).__name__} wraps a Task, got {type(task).__name__}.")
    self.task = task
    self.datasets = task.datasets
    self.name = f"{task.name}_{suffix}"

  def init_with_state(self, key):
    return self.task.init_with_state(key)

  def loss_with_state_and_aux(self, params, state, key, batch):
    return self.task.loss_with_state_and_aux(params, state, key, batch)

  def normalizer(self, loss):
    return self.task.normalizer(loss)


def _map_with_scales(fn: Callable, scales: Any, params: Any) -> Any:
  """``fn(p, s)`` for every float leaf ``p`` of ``params`` under the leaf ``s`` of ``scales`` (a prefix tree)."""
  try:
    return jax.tree.map(lambda s, sub: jax.tree.map(lambda p: fn(p, s) if _is_float(p) else p, sub), scales, params)
  except ValueError as e:
    raise ValueError("ReparamWeights: scales must be a scalar or a pytree whose structure is a prefix of the params' "
                     f"({e})") from None


class ReparamWeights(TaskWrapper):
  """Reparameterized weights: the optimizer sees ``q`` and the inner task sees ``p = q * scale``.

  ``init`` returns ``q0 = p0 / scale``, and ``loss(q) = task.loss(q * scale)``, so the loss values are those of the
  inner task at ``p`` while ``grad_q = scale * grad_p``: plain SGD with learning rate ``lr`` on ``q`` is SGD on ``p``
  with learning rate ``lr * scale**2``.

  Args:
    task: the inner task.
    scales: a positive scalar, or a pytree whose structure is a prefix of the params' (e.g. one scale per leaf, per
      module, or per element) with leaves broadcastable against the params they cover. May be traced. Integer param
      leaves are left alone; float leaves keep their dtype.
  """

  def __init__(self, task: Task, scales: Any):
    super().__init__(task, "reparam")
    if scales is None:
      raise ValueError("ReparamWeights needs scales (a positive scalar or a pytree like the params), got None.")
    if isinstance(scales, (int, float)) and not scales > 0:
      raise ValueError(f"ReparamWeights scales must be positive, got {scales!r}.")
    self.scales = scales

  def to_inner(self, q: Any) -> Any:
    """The inner task's params ``p = q * scale``."""
    return _map_with_scales(lambda x, s: (x * s).astype(x.dtype), self.scales, q)

  def from_inner(self, p: Any) -> Any:
    """The optimizer's params ``q = p / scale``."""
    return _map_with_scales(lambda x, s: (x / s).astype(x.dtype), self.scales, p)

  def init_with_state(self, key):
    params, state = self.task.init_with_state(key)
    return self.from_inner(params), state

  def loss_with_state_and_aux(self, params, state, key, batch):
    return self.task.loss_with_state_and_aux(self.to_inner(params), state, key, batch)


class ReducedBatchSize(TaskWrapper):
  """The loss sees only the first ``batch_size`` examples of every batch leaf (sliced along axis 0).

  The datasets are unchanged: iterators and `DeviceData.sample` still produce (and gather) full batches, which are
  then sliced, so the saving is in the loss computation only. ``batch=None`` (data-free tasks) passes through.
  """

  def __init__(self, task: Task, batch_size: int):
    super().__init__(task, f"bs{batch_size}")
    batch_size = check_positive_int("batch_size", batch_size)
    if task.datasets is not None:
      full = {x.shape[0] for x in jax.tree.leaves(task.datasets.abstract_batch)}
      if any(batch_size > n for n in full):
        raise ValueError(f"batch_size {batch_size} exceeds the datasets' batch size {max(full)}.")
    self.batch_size = batch_size

  def slice_batch(self, batch: Any) -> Any:
    return jax.tree.map(lambda x: x[:self.batch_size], batch)

  def loss_with_state_and_aux(self, params, state, key, batch):
    batch = None if batch is None else self.slice_batch(batch)
    return self.task.loss_with_state_and_aux(params, state, key, batch)


def _cast_floats(tree: Any, dtype: Any) -> Any:
  return jax.tree.map(lambda x: jnp.asarray(x).astype(dtype) if _is_float(x) else x, tree)


class LowPrecision(TaskWrapper):
  """Params stored in ``dtype`` (cast at init) and the forward pass in ``dtype``; the loss comes back as float32.

  ``loss`` casts the float params and float batch leaves to ``dtype`` (so updates promoted to float32 by an optimizer
  are rounded again), calls the inner task, and casts the loss and float aux values to float32. Gradients w.r.t.
  the params therefore have dtype ``dtype``. The model state keeps its dtypes (the returned state is cast back to
  the dtypes of the given state).
  """

  def __init__(self, task: Task, dtype: Any = jnp.bfloat16):
    self.dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(self.dtype, jnp.floating):
      raise ValueError(f"LowPrecision needs a floating dtype, got {self.dtype}.")
    super().__init__(task, self.dtype.name)

  def init_with_state(self, key):
    params, state = self.task.init_with_state(key)
    return _cast_floats(params, self.dtype), state

  def loss_with_state_and_aux(self, params, state, key, batch):
    loss, new_state, aux = self.task.loss_with_state_and_aux(_cast_floats(params, self.dtype), state, key,
                                                             _cast_floats(batch, self.dtype))
    if state is not None and new_state is not None:
      new_state = jax.tree.map(lambda new, old: jnp.asarray(new).astype(jnp.result_type(old)), new_state, state)
    return loss.astype(jnp.float32), new_state, _cast_floats(aux, jnp.float32)


class BF16Params(LowPrecision):
  """`LowPrecision` with ``dtype = bfloat16``."""

  def __init__(self, task: Task):
    super().__init__(task, jnp.bfloat16)


class LossScale(TaskWrapper):
  """``loss * scale`` (so gradients are scaled too); ``normalizer(loss) = task.normalizer(loss / scale)``.

  ``scale`` is a nonzero scalar and may be traced (a family config leaf). Aux values are unchanged.
  """

  def __init__(self, task: Task, scale: Any):
    super().__init__(task, "lossscale")
    if isinstance(scale, (int, float)) and scale == 0:
      raise ValueError("LossScale needs a nonzero scale.")
    self.scale = scale

  def loss_with_state_and_aux(self, params, state, key, batch):
    loss, state, aux = self.task.loss_with_state_and_aux(params, state, key, batch)
    return loss * self.scale, state, aux

  def normalizer(self, loss):
    return self.task.normalizer(loss / self.scale)


# -- gradient modifiers ------------------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def gradient_hook(transform: Callable, params: Any, key: jax.Array, hparams: Any) -> Any:
  """Identity on ``params`` whose backward pass returns ``transform(grads, key, hparams)``.

  ``transform`` must be a pure function closing over no traced values (pass them in ``hparams``). No cotangent
  flows to ``key`` or ``hparams``. The backward pass is itself differentiable (for meta-gradients through an
  inner step); forward mode (`jax.jvp`) is not supported.
  """
  return params


def _hook_fwd(transform, params, key, hparams):
  return params, (key, hparams)


def _hook_bwd(transform, residuals, grads):
  key, hparams = residuals
  return transform(grads, key, hparams), None, None


gradient_hook.defvjp(_hook_fwd, _hook_bwd)


def add_gradient_noise(grads: Any, key: jax.Array, noise_std: jax.Array) -> Any:
  """``g + noise_std * N(0, 1)`` per float leaf, with independent noise per leaf; dtypes kept."""
  leaves, treedef = jax.tree.flatten(grads)
  keys = jax.random.split(key, max(len(leaves), 1))
  noisy = [g + (noise_std * jax.random.normal(k, jnp.shape(g), jnp.float32)).astype(g.dtype) if _is_float(g) else g
           for g, k in zip(leaves, keys)]
  return jax.tree.unflatten(treedef, noisy)


def clip_gradients_by_global_norm(grads: Any, key: jax.Array, max_norm: jax.Array) -> Any:
  """``g * min(1, max_norm / ||g||)`` with ``||g||`` the global L2 norm over all float leaves (key unused)."""
  del key
  floats = [g for g in jax.tree.leaves(grads) if _is_float(g)]
  if not floats:
    return grads
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in floats))
  factor = jnp.minimum(1.0, max_norm / jnp.maximum(norm, 1e-30))
  return jax.tree.map(lambda g: (g * factor).astype(g.dtype) if _is_float(g) else g, grads)


class GradientModifier(TaskWrapper):
  """``jax.grad`` of the loss sees ``transform(grad, noise_key, hparams)`` instead of ``grad``; loss values unchanged.

  The key handed to ``transform`` is ``fold_in(loss_key, tag)``: a fresh key per loss call, independent of the
  randomness the inner task draws from the same loss key (which it still receives unchanged).

  *Every* reverse-mode derivative through this loss w.r.t. the params is modified, including a meta-gradient that
  backpropagates through a meta-loss computed with the wrapped task (for noise: an unbiased perturbation; for
  clipping: a bias). Evaluate the meta-loss with the unwrapped ``.task`` where exact meta-gradients matter.

  Args:
    task: the inner task.
    transform: a pure function ``(grads, key, hparams) -> grads`` (see `gradient_hook`).
    hparams: its (possibly traced) hyper-parameters.
    suffix: name suffix.
  """

  def __init__(self, task: Task, transform: Callable, hparams: Any, suffix: str = "gradmod"):
    super().__init__(task, suffix)
    self.transform, self.hparams = transform, hparams

  def loss_with_state_and_aux(self, params, state, key, batch):
    params = gradient_hook(self.transform, params, jax.random.fold_in(key, _NOISE_TAG), self.hparams)
    return self.task.loss_with_state_and_aux(params, state, key, batch)


class NoisyGradients(GradientModifier):
  """Adds i.i.d. ``N(0, noise_std^2)`` noise to every gradient entry (a new draw per loss key); unbiased."""

  def __init__(self, task: Task, noise_std: Any):
    if isinstance(noise_std, (int, float)) and noise_std < 0:
      raise ValueError(f"noise_std must be >= 0, got {noise_std!r}.")
    super().__init__(task, add_gradient_noise, noise_std, suffix="gradnoise")
    self.noise_std = noise_std


class ClipGradients(GradientModifier):
  """Rescales the whole gradient to global L2 norm at most ``max_norm``."""

  def __init__(self, task: Task, max_norm: Any):
    if isinstance(max_norm, (int, float)) and not max_norm > 0:
      raise ValueError(f"max_norm must be positive, got {max_norm!r}.")
    super().__init__(task, clip_gradients_by_global_norm, max_norm, suffix="gradclip")
    self.max_norm = max_norm


# -- evolution-strategies gradients ------------------------------------------------------------------------------
def sample_perturbation(params: Any, key: jax.Array, std: Any) -> Any:
  """``std * N(0, I)`` shaped like ``params`` (one key per leaf, split from ``key``; dtypes kept)."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(key, max(len(leaves), 1))
  return jax.tree.unflatten(treedef, [jax.random.normal(k, jnp.shape(x), jnp.result_type(x)) * std
                                      for k, x in zip(keys, leaves)])


def antithetic_es_value_and_grad(loss_fn: Callable, params: Any, key: jax.Array, std: Any, n_pairs: int = 1,
                                 has_aux: bool = False):
  """An antithetic ES estimate of ``loss_fn``'s value and gradient at ``params``.

  With ``e_i = std * N(0, I)`` for ``i < n_pairs`` (key ``split(key, n_pairs)[i]``, `sample_perturbation`):
  value ``= mean_i (f(p + e_i) + f(p - e_i)) / 2`` and gradient ``= mean_i e_i (f(p + e_i) - f(p - e_i)) / (2
  std^2)``, an unbiased estimate of the gradient of the Gaussian-smoothed loss (exact in expectation for
  quadratics). The ``2 * n_pairs`` evaluations run under one `jax.vmap`. With ``has_aux`` the loss returns
  ``(loss, aux)`` and the result is ``((value, aux), grad)`` with every evaluation's aux stacked as
  ``[n_pairs, 2 (plus, minus), ...]``.
  """
  n_pairs = check_positive_int("n_pairs", n_pairs)
  eps = jax.vmap(lambda k: sample_perturbation(params, k, std))(jax.random.split(key, n_pairs))
  signs = jnp.asarray([1.0, -1.0])
  thetas = jax.tree.map(lambda p, e: p + signs.reshape((1, 2) + (1,) * jnp.ndim(p)).astype(e.dtype) * e[:, None],
                        params, eps)
  out = jax.vmap(jax.vmap(loss_fn))(thetas)
  losses, aux = out if has_aux else (out, None)
  diff = (losses[:, 0] - losses[:, 1]) / (2.0 * std ** 2)
  grad = jax.tree.map(lambda e: jnp.mean(e * diff.reshape((-1,) + (1,) * (e.ndim - 1)).astype(e.dtype), axis=0),
                      eps)
  value = jnp.mean(losses)
  return ((value, aux), grad) if has_aux else (value, grad)


class ESGradients(TaskWrapper):
  """``jax.grad`` w.r.t. the params is `antithetic_es_value_and_grad` of the inner loss (same state, key and
  batch) times the incoming cotangent; the loss, state and aux returned are the inner task's.

  The ES key is the loss key, as in the reference. Only the params get a cotangent (state, key and batch get
  zeros); reverse mode only.

  Args:
    task: the inner task.
    std: standard deviation of the perturbations (> 0).
    n_pairs: antithetic pairs per estimate.
  """

  def __init__(self, task: Task, std: float = 0.01, n_pairs: int = 8):
    super().__init__(task, f"es{int(n_pairs)}")
    if not (isinstance(std, (int, float)) and std > 0 and jnp.isfinite(std)):
      raise ValueError(f"std must be a positive finite number, got {std!r}.")
    self.std, self.n_pairs = float(std), check_positive_int("n_pairs", n_pairs)
    inner = task.loss_with_state_and_aux

    @jax.custom_vjp
    def loss(params, state, key, batch):
      return inner(params, state, key, batch)

    def fwd(params, state, key, batch):
      return inner(params, state, key, batch), (params, state, key, batch)

    def bwd(residuals, cotangents):
      params, state, key, batch = residuals
      fn = lambda p: inner(p, state, key, batch)[0]
      _, grad = antithetic_es_value_and_grad(fn, params, key, self.std, self.n_pairs)
      zeros = lambda tree: jax.tree.map(jnp.zeros_like, tree)
      return jax.tree.map(lambda g: g * cotangents[0], grad), zeros(state), None, zeros(batch)

    loss.defvjp(fwd, bwd)
    self._loss = loss

  def loss_with_state_and_aux(self, params, state, key, batch):
    return self._loss(params, state, key, batch)
