"""The one single-lane inner step: batch, loss and gradient, optimizer update, meta-loss, finiteness.

Every inner-training engine composes these pure pieces: `metafam.inner.TruncatedStep` maps them over lanes
(`metafam.inner.lane_step`, with NaN-safe masking around `loss_and_grad` and `meta_loss`), and
`metafam.inner.runner.Runner` (fixed-length training with evaluation points, used by `train_and_evaluate`, the
learning-rate sweeps and the benchmark) runs `train_step` in its scans. A step with key ``k`` draws its randomness
from `split_step_key`; both engines make many steps' draws at once before their loops (`scan_with_draws`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp


class StepKeys(NamedTuple):
  """The keys of one inner step: the train batch, the loss, the meta-loss batch and the meta-loss, the update."""
  batch: jax.Array
  loss: jax.Array
  meta_batch: Optional[jax.Array]
  meta: Optional[jax.Array]
  opt: jax.Array


def split_step_key(key: jax.Array, with_meta_loss: bool) -> StepKeys:
  """`StepKeys` from one step key: ``split(key, 5)`` with a meta-loss, else ``split(key, 3)`` (no meta keys)."""
  if with_meta_loss:
    return StepKeys(*jax.random.split(key, 5))
  k_batch, k_loss, k_opt = jax.random.split(key, 3)
  return StepKeys(k_batch, k_loss, None, None, k_opt)


def all_finite(tree: Any) -> jax.Array:
  """True when every floating entry of ``tree`` is finite (True for a tree without floating leaves)."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def scalar_loss(task: Any, loss: Any, what: str = "loss") -> Any:
  """``loss`` if it is a scalar, else ValueError naming the task and the shape (raised while tracing: the first call
  of a program refuses a loss that returns, say, one value per example, before anything runs)."""
  shape = jnp.shape(loss)
  if shape != ():
    raise ValueError(f"task {getattr(task, 'name', type(task).__name__)!r}: its {what} must be a scalar (one number "
                     f"per batch), got an array of shape {tuple(shape)}; reduce it, e.g. with jnp.mean over the batch.")
  return loss


def loss_and_grad(task: Any, params: Any, model_state: Any, key: jax.Array, batch: Any):
  """``(loss, new model state, gradient w.r.t. params)`` of ``task.loss_with_state`` (a non-scalar loss is refused,
  `scalar_loss`)."""
  def loss_fn(p):
    loss, new_state = task.loss_with_state(p, model_state, key, batch)
    return scalar_loss(task, loss), new_state

  (loss, new_state), grad = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return loss, new_state, grad


def apply_update(opt: Any, opt_state: Any, grad: Any, loss: jax.Array, model_state: Any, key: jax.Array) -> Any:
  """The optimizer's update of ``opt_state`` (which carries the params) with ``grad``; the new model state rides
  along."""
  return opt.update(opt_state, grad, loss=loss, model_state=model_state, key=key)


def meta_loss(task: Any, params: Any, model_state: Any, key: jax.Array, batch: Any) -> jax.Array:
  """The loss of the (updated) ``params`` on ``batch``, through ``task.loss_with_state_and_aux``."""
  return scalar_loss(task, task.loss_with_state_and_aux(params, model_state, key, batch)[0])


class TrainDraws(NamedTuple):
  """The random draws of one `train_step`: its `StepKeys` (no meta keys) and, with device data, the batch's example
  indices (else None)."""
  keys: StepKeys
  batch: Optional[jax.Array]


def draw_train_step(key: jax.Array, split_data: Any = None) -> TrainDraws:
  """The draws `train_step` makes from ``key``: made apart from the step, many steps' draws can be made at once."""
  keys = split_step_key(key, with_meta_loss=False)
  return TrainDraws(keys, None if split_data is None else split_data.indices(keys.batch))


def train_step(task: Any, opt: Any, opt_state: Any, key: jax.Array, split_data: Any = None, batch: Any = None):
  """One update of one lane without a meta-loss: ``(new opt_state, loss before the update)``.

  The batch is drawn from ``split_data`` (a `DeviceData`) when given, else ``batch`` is used as is.
  """
  return train_step_drawn(task, opt, opt_state, draw_train_step(key, split_data), split_data, batch)


def loss_and_grad_drawn(task: Any, opt: Any, opt_state: Any, draws: TrainDraws, split_data: Any = None,
                        batch: Any = None):
  """The first half of `train_step_drawn`: ``(loss, new model state, grad)`` at the params in ``opt_state``."""
  if draws.batch is not None:
    batch = split_data.take(draws.batch)
  return loss_and_grad(task, opt.get_params(opt_state), opt.get_state(opt_state), draws.keys.loss, batch)


def train_step_drawn(task: Any, opt: Any, opt_state: Any, draws: TrainDraws, split_data: Any = None,
                     batch: Any = None):
  """`train_step` with its random draws made already (`draw_train_step`)."""
  loss, model_state, grad = loss_and_grad_drawn(task, opt, opt_state, draws, split_data, batch)
  return apply_update(opt, opt_state, grad, loss, model_state, draws.keys.opt), loss


def map_lanes(fn: Callable, in_axes: Any, args: Any, chunk: Optional[int]):
  """``jax.vmap(fn, in_axes)(*args)``; with ``chunk``, over blocks of ``chunk`` lanes in sequence (`jax.lax.map`
  with ``batch_size``), so one block's working set stays in cache (an optimizer update made of matrix products, like
  Muon's Newton-Schulz iteration, runs faster on a CPU lane by lane than as batched products). ``in_axes``: 0 or
  None per argument, or a tree of them (a prefix of the argument, e.g. `low_rank.lane_axes`)."""
  is_axis = lambda x: x is None or isinstance(x, int)
  mapped = jax.tree.map(lambda ax, arg: jax.tree.map(lambda _: ax == 0, arg), tuple(in_axes), tuple(args),
                        is_leaf=is_axis)
  leaves, treedef = jax.tree.flatten(tuple(args))
  flags = jax.tree.leaves(mapped)
  num = next(x.shape[0] for x, m in zip(leaves, flags) if m)
  if chunk is None or num <= chunk:
    return jax.vmap(fn, in_axes=tuple(in_axes))(*args)

  def one(values):
    it = iter(values)
    return fn(*jax.tree.unflatten(treedef, [next(it) if m else x for x, m in zip(leaves, flags)]))
  return jax.lax.map(one, [x for x, m in zip(leaves, flags) if m], batch_size=chunk)


def auto_lane_chunk(chunk: Optional[int], platform: str) -> Optional[int]:
  """The block size that "auto" means for an optimizer declaring ``chunk`` (`map_lanes`): ``chunk`` on a CPU, where
  a block's working set stays in cache, None elsewhere. On an accelerator one vmap over all lanes fills the device,
  while blocks run one after another, each too small to fill it (see docs/performance/gpu.md)."""
  return chunk if platform == "cpu" else None


DRAW_BLOCK = 50  # steps whose random draws `scan_with_draws` makes together


def scan_with_draws(body: Callable, carry: Any, xs: Any, draw: Callable, block: int = DRAW_BLOCK):
  """``lax.scan(body, carry, xs)`` where ``body(carry, (x, d))`` also gets ``d = draw(x)``, the step's random draws,
  made before the loop for blocks of up to ``block`` steps at once (``vmap(draw)`` over the block's ``xs``).

  The numbers are those of drawing inside the loop (counter-based keys), but a step's ~5-10 small threefry calls
  become a few large ones per block: on CPU every call is a loop of small kernels that costs far more than its
  draws. The blocks bound the memory of the drawn values (e.g. batch indices) for long loops.
  """
  num_steps = jax.tree.leaves(xs)[0].shape[0]

  def run(carry, xs):
    return jax.lax.scan(body, carry, (xs, jax.vmap(draw)(xs)))

  num_blocks, rest = divmod(num_steps, block)
  if num_blocks == 0 or (num_blocks == 1 and rest == 0):
    return run(carry, xs)
  head = jax.tree.map(lambda x: x[:num_blocks * block].reshape((num_blocks, block) + x.shape[1:]), xs)
  carry, ys = jax.lax.scan(run, carry, head)
  ys = jax.tree.map(lambda y: y.reshape((num_blocks * block,) + y.shape[2:]), ys)
  if rest:
    carry, tail = run(carry, jax.tree.map(lambda x: x[num_blocks * block:], xs))
    ys = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), ys, tail)
  return carry, ys
