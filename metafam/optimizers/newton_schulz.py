"""Muon's orthogonalization: optax's quintic Newton-Schulz iteration, in its direct form or its Gram form.

Muon replaces a matrix ``X_0`` (Frobenius-normalized, transposed to ``m x n`` with ``m <= n``) by ``X_5``, where
``X_{k+1} = a X_k + (b A_k + c A_k^2) X_k`` and ``A_k = X_k X_k^T`` (optax's coefficients ``a, b, c``, 5 iterations).

* ``"direct"`` is that recurrence as ``optax.contrib.scale_by_muon`` computes it (this module calls optax). Per
  iteration it multiplies ``m x m`` by ``m x n`` twice: ``20 m^2 n + 10 m^3`` flops for the 5 iterations.
* ``"gram"`` computes the same polynomial without touching the ``n`` side inside the loop. Every ``X_k`` is
  ``P_k X_0`` with ``P_k`` a polynomial in the Gram matrix ``G = X_0 X_0^T`` (``P_0 = I``), so ``P_k`` commutes with
  ``G``, ``A_k = P_k G P_k`` and ``P_{k+1} = a P_k + (b A_k + c A_k^2) P_k``; the result is ``P_5 X_0``. That is
  ``4 m^2 n`` flops for ``G`` and the final product plus ``40 m^3`` for the loop: fewer once ``n > 1.875 m``, e.g.
  2.1x fewer for a 784 x 128 layer, 1.4x for 192 x 640, none for a square one.
* ``"auto"`` takes whichever needs fewer flops for the matrix's shape (a static choice per tensor).

The two forms are equal in exact arithmetic. In float32 the Gram form squares the matrix's condition number once
up front, so directions with small singular values carry more rounding: measured against a float64 reference
(``tests/test_newton_schulz.py``), the relative error of the result is about 2e-6 for Gaussian matrices in both
forms and up to 1e-3 (Gram) against 2e-5 (direct) for a rank-4 matrix plus 1% noise. Muon is commonly run with the
iteration in bfloat16, whose rounding (4e-3) is larger than either.

Many models at once: under `jax.vmap` these products become batched matrix products, which XLA's CPU backend runs
well below the speed of the same products one member at a time. `lane_chunk` is what vectorized training of an
optimizer built on this iteration should use.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import jax
import jax.numpy as jnp
import optax

from metafam._checks import check_choice

FORMS = ("direct", "gram", "auto")
NS_STEPS = 5  # optax.contrib.muon's default
EPS = 1e-8  # added to the Frobenius norm, as optax does


def _coefficients():
  """optax's default quintic coefficients ``(a, b, c)``, read from its signature (not restated here)."""
  return tuple(float(c) for c in inspect.signature(optax.contrib.scale_by_muon).parameters["ns_coeffs"].default)


def matrix_shape(shape: Sequence[int]) -> tuple:
  """The ``(m, n)`` with ``m <= n`` that a tensor of ``shape`` (rank >= 2) is orthogonalized as: the matrix
  ``[prod(shape[:-1]), shape[-1]]``, transposed when it is tall."""
  rows = 1
  for s in shape[:-1]:
    rows *= int(s)
  return tuple(sorted((rows, int(shape[-1]))))


def flops(shape: Sequence[int], form: str) -> int:
  """Multiply-add flops (2 per multiply-add) of the 5 iterations of ``form`` ("direct" or "gram") on ``shape``."""
  m, n = matrix_shape(shape)
  if check_choice("form", form, FORMS[:2]) == "direct":
    return NS_STEPS * (4 * m * m * n + 2 * m ** 3)
  return 4 * m * m * n + NS_STEPS * 8 * m ** 3


def cheaper_form(shape: Sequence[int]) -> str:
  """"gram" where it needs fewer flops than "direct" for ``shape``, else "direct"."""
  return "gram" if flops(shape, "gram") < flops(shape, "direct") else "direct"


def lane_chunk():
  """Members per block for a vmapped update dominated by this iteration (`metafam.inner.step.map_lanes`): 1 on a
  CPU, where 21 MLPs 784-128-128-10 updated one at a time took 0.60x the time of one vmap with optax's Muon and
  0.64x for 784-192-192-10 (docs/performance/step-cost.md); None (one vmap) on accelerators, whose batched matrix
  products are efficient."""
  return 1 if jax.default_backend() == "cpu" else None


def _direct(x: jax.Array) -> jax.Array:
  tx = optax.contrib.scale_by_muon(beta=0.0, nesterov=False)  # with beta = 0 its momentum is the input itself
  return tx.update(x, tx.init(x))[0]


def _gram(x: jax.Array) -> jax.Array:
  a, b, c = _coefficients()
  tall = x.shape[0] > x.shape[1]
  if tall:
    x = x.T
  x = x / (jnp.linalg.norm(x) + EPS)
  g = x @ x.T
  p = jnp.eye(x.shape[0], dtype=x.dtype)
  for _ in range(NS_STEPS):
    ak = p @ (g @ p)
    p = a * p + (b * ak + c * (ak @ ak)) @ p
  out = p @ x
  return out.T if tall else out


def orthogonalize(m: jax.Array, form: str = "direct") -> jax.Array:
  """Muon's direction for a tensor of rank >= 2: ``m`` as the matrix ``[prod(shape[:-1]), shape[-1]]``, Frobenius-
  normalized and orthogonalized by optax's 5 quintic Newton-Schulz iterations (singular values near 1), in ``m``'s
  shape; ``form`` is "direct" (optax's computation), "gram" or "auto" (see the module docstring). An all-zero ``m``
  gives zeros, with a zero (not NaN) derivative."""
  form = check_choice("form", form, FORMS)
  shape = jnp.shape(m)
  if form == "auto":
    form = cheaper_form(shape)
  matrix = jnp.reshape(m, (-1, shape[-1]))
  nonzero = jnp.any(matrix != 0)
  safe = jnp.where(nonzero, matrix, jnp.ones_like(matrix))  # the norm's derivative is NaN at 0: never evaluate it
  out = (_direct if form == "direct" else _gram)(safe)
  return jnp.reshape(jnp.where(nonzero, out, 0.0), shape).astype(m.dtype)
