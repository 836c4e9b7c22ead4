"""`learned_optimization.outer_trainers.common`: the reference's unroll helpers.

* `sample_perturbations(variables, rng, std)`: Gaussian ``N(0, std^2)`` noise shaped like ``variables`` (one key
  per leaf); `vector_sample_perturbations(theta, key, std, num_samples) -> (eps, theta + eps, theta - eps)`, each
  with a leading ``num_samples`` axis.
* `truncated_unroll(truncated_step, unroll_length, theta_is_vector, theta, key, state, datas, outer_state, ...)
  -> ((state, outs), metrics)`: ``unroll_length`` steps, step ``i`` with key ``jax.random.split(key,
  unroll_length)[i]``. On metafam's truncated step (`lopt_truncated_step.VectorizedLOptTruncatedStep`) this is one
  call of metafam's jitted ``unroll_with_keys`` (``datas`` unused: batches are sampled on the device), and ``outs`` is
  a `truncated_step.TruncatedUnrollOut` of ``[unroll_length, num_tasks]`` arrays (``task_param`` None). Any other
  step (a user's `truncated_step.TruncatedStep`) runs its ``unroll_step`` in a ``lax.scan`` over ``(keys, datas)``.
  ``metrics`` is ``{}`` (no oryx summaries).
* `maybe_stacked_es_unroll(...)`: the antithetic pair of unrolls, stacked into one (``stack_antithetic_samples``) or
  run one after the other; returns ``(p_state, n_state, p_outs, n_outs, metrics)``. metafam's truncated step has a
  fixed number of lanes, so on it the two unrolls always run one after the other (the same numbers: both use
  ``key``).
"""

from __future__ import annotations

from typing import Any, Optional, TypeVar

import jax
import jax.numpy as jnp

from metafam.compat.learned_optimization import tree_utils
from metafam.compat.learned_optimization.outer_trainers.truncated_step import TruncatedUnrollOut
from metafam.inner.truncated_step import TruncatedStep as _MFTruncatedStep
from metafam.outer_trainers import base as _mf_base

__all__ = ["sample_perturbations", "vector_sample_perturbations", "truncated_unroll", "maybe_stacked_es_unroll"]

# The reference's type aliases.
MetaParams = Any
OuterState = Any
UnrollState = Any
T = TypeVar("T")
G = TypeVar("G")


def sample_perturbations(variables: Any, rng: jax.Array, std: float) -> Any:
  """One draw of the engine's perturbations (`metafam.outer_trainers.base.sample_perturbations`)."""
  return jax.tree.map(lambda x: x[0], _mf_base.sample_perturbations(variables, rng, 1, std))


def vector_sample_perturbations(theta: Any, key: jax.Array, std: float, num_samples: int):
  def one(k):
    eps = sample_perturbations(theta, k, std)
    return eps, tree_utils.tree_add(theta, eps), tree_utils.tree_sub(theta, eps)
  return jax.vmap(one)(jax.random.split(key, num_samples))


def truncated_unroll(truncated_step: Any, unroll_length: int, theta_is_vector: bool, theta: Any, key: jax.Array,
                     state: Any, datas: Any, outer_state: Any, override_num_steps: Optional[int] = None,
                     with_summary: bool = False, wrap_step_fn: Optional[Any] = None, **unused: Any):
  if override_num_steps is not None:
    raise NotImplementedError("override_num_steps: metafam's truncated step has no per-call step override.")
  if jax.tree.leaves(datas) and tree_utils.first_dim(datas) != unroll_length:
    raise ValueError(f"got a mismatch in data size. Expected to have data of size: {unroll_length} but got data of "
                     f"size {tree_utils.first_dim(datas)}")
  keys = jax.random.split(key, unroll_length)
  if isinstance(truncated_step, _MFTruncatedStep) and wrap_step_fn is None:
    state, out = truncated_step.unroll_with_keys(theta, state, keys, theta_is_batched=theta_is_vector)
    return (state, TruncatedUnrollOut(loss=out.loss, is_done=out.is_done, task_param=None,
                                      iteration=out.iteration, mask=out.mask)), {}

  def step_fn(carry, xs):
    k, data = xs
    return truncated_step.unroll_step(theta, carry, k, data, outer_state=outer_state,
                                      theta_is_vector=theta_is_vector)

  if wrap_step_fn is not None:
    step_fn = wrap_step_fn(step_fn)
  return jax.lax.scan(step_fn, state, (keys, datas)), {}


# The reference's layout of stacked antithetic lanes: all positive lanes, then all negative ones (contiguous
# halves). metafam's `inner.pairs.halves` / `join` use the interleaved layout of its own estimators, so these two
# reference helpers stay here.
def _stack(a: Any, b: Any, axis: int = 0) -> Any:
  """``a`` and ``b`` concatenated along ``axis``, leaf by leaf."""
  return jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=axis), a, b)


def _split_tree(tree: Any, axis: int = 0):
  """The first and second halves of ``tree`` along ``axis`` (0 or 1), leaf by leaf."""
  if axis not in (0, 1):
    raise ValueError(f"axis must be 0 or 1, got {axis!r}.")
  size = jax.tree.leaves(tree)[0].shape[axis] // 2
  first = jax.tree.map(lambda x: jax.lax.slice_in_dim(x, 0, size, axis=axis), tree)
  second = jax.tree.map(lambda x: jax.lax.slice_in_dim(x, size, None, axis=axis), tree)
  return first, second


def maybe_stacked_es_unroll(truncated_step: Any, unroll_length: int, stack_antithetic_samples: bool,
                            vec_p_theta: Any, vec_n_theta: Any, p_state: Any, n_state: Any, key: jax.Array,
                            datas: Any, outer_state: Any, with_summary: bool = False,
                            sample_rng_key: Optional[jax.Array] = None, override_num_steps: Optional[int] = None):
  args = (truncated_step, unroll_length, True)
  if stack_antithetic_samples and not isinstance(truncated_step, _MFTruncatedStep):
    stacked_datas = _stack(datas, datas, axis=1) if jax.tree.leaves(datas) else datas
    (state, outs), metrics = truncated_unroll(*args, _stack(vec_p_theta, vec_n_theta), key,
                                              _stack(p_state, n_state), stacked_datas, outer_state,
                                              override_num_steps)
    p_state, n_state = _split_tree(state)
    p_outs, n_outs = _split_tree(outs, axis=1)
    return p_state, n_state, p_outs, n_outs, metrics
  (p_state, p_outs), metrics = truncated_unroll(*args, vec_p_theta, key, p_state, datas, outer_state,
                                                override_num_steps)
  (n_state, n_outs), _ = truncated_unroll(*args, vec_n_theta, key, n_state, datas, outer_state, override_num_steps)
  return p_state, n_state, p_outs, n_outs, metrics
