"""NaN-safe masking of lanes in reverse mode: a masked step sends exact zeros back, never ``0 * NaN``.

Used by `metafam.inner.TruncatedStep` (its step of every lane, `metafam.inner.lane_step.step_lanes`) around the
theta-free pieces of a step that can go non-finite from finite inputs (the train loss with its gradient, and the
meta-loss); see `cut_unless_finite`.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp


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


def cut_unless_finite(fn):
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
def zero_unless_ok_in_reverse_mode(x: Any, ok: jax.Array) -> Any:
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


zero_unless_ok_in_reverse_mode.defvjp(_zero_unless_ok_fwd, _zero_unless_ok_bwd)
