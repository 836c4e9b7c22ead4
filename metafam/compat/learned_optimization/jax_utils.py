"""`learned_optimization.jax_utils`: small control-flow helpers LO code imports.

``maybe_static_cond`` (a Python branch when the predicate is concrete, else ``lax.cond``), ``maybe_do`` (``do_fn``
applied when ``pred``, traceable), ``in_jit``, ``scan`` (``lax.scan`` under jit, a Python loop with the same
outputs otherwise, so eager code can print), ``cached_jit`` (``jax.jit``: JAX already caches compilations per
function, so no second cache is kept) and the ``print_arg_shapes`` debugging decorator.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Tuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as onp
from jax.extend import core as jex_core

__all__ = ["maybe_static_cond", "cached_jit", "maybe_do", "in_jit", "Carry", "X", "Y", "scan", "print_arg_shapes"]

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")


def maybe_static_cond(pred, true_fn, false_fn, val):
  """``true_fn(val) if pred else false_fn(val)``, decided in Python when ``pred`` is a concrete bool / array."""
  if isinstance(pred, (bool, onp.ndarray, onp.bool_)):
    return true_fn(val) if pred else false_fn(val)
  return jax.lax.cond(pred, true_fn, false_fn, val)


def cached_jit(fn, *args, **kwargs):
  """``jax.jit(fn, *args, **kwargs)``."""
  return jax.jit(fn, *args, **kwargs)


def maybe_do(pred, do_fn, operand):
  """``do_fn(operand)`` if ``pred`` else ``operand`` (traceable; ``do_fn`` must keep the operand's structure)."""
  return jax.lax.cond(jnp.asarray(pred, bool), do_fn, lambda x: x, operand)


def in_jit() -> bool:
  """Whether the caller is being traced under ``jax.jit``."""
  return jex_core.unsafe_am_i_under_a_jit_DO_NOT_USE()


def scan(f: Callable[[Carry, X], Tuple[Carry, Y]], init: Carry, xs: X, length: Optional[int] = None,
         reverse: bool = False, unroll: int = 1) -> Tuple[Carry, Y]:
  """``jax.lax.scan`` semantics; outside jit the steps run as a Python loop (outputs stacked on axis 0)."""
  if in_jit():
    return jax.lax.scan(f, init, xs, length=length, reverse=reverse, unroll=unroll)
  leaves, treedef = jax.tree.flatten(xs)
  if length is None:
    if not leaves:
      raise ValueError("jax_utils.scan: pass length when xs has no arrays.")
    length = leaves[0].shape[0]
  carry, ys = init, []
  for i in (reversed(range(length)) if reverse else range(length)):
    carry, y = f(carry, jax.tree.unflatten(treedef, [x[i] for x in leaves]))
    ys.append(y)
  if reverse:
    ys = ys[::-1]
  return carry, jax.tree.map(lambda *y: jnp.stack(y), *ys) if ys else None


def print_arg_shapes(fn):
  """A decorator printing the function's name and the shapes / dtypes of its arguments on each call."""

  def describe(a):
    return jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) if hasattr(a, "shape") else repr(a)

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    print("Called:", fn.__name__)
    for a in args:
      print("\t\t", jax.tree.map(describe, a))
    for k, v in kwargs.items():
      print(f"\t\t {k}={jax.tree.map(describe, v)}")
    return fn(*args, **kwargs)

  return wrapped


def _stack(ys, reverse: bool = False):
  """The trees ``ys`` (in reverse order with ``reverse``) stacked leaf by leaf with ``jnp.vstack``."""
  return jax.tree.map(lambda *y: jnp.vstack(y), *(reversed(ys) if reverse else ys))


def _print_aval(a):
  """``a``'s abstract value (shape and dtype) when it is array-like, else ``str(a)``."""
  try:
    return jax.typeof(jnp.asarray(a))
  except Exception:  # pylint: disable=broad-except  # anything not array-like is printed as text
    return str(a)
