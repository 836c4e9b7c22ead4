"""Muon's orthogonalization: the quintic Newton-Schulz iteration, in its direct form or its Gram form.

Muon replaces a matrix ``X_0`` (Frobenius-normalized, transposed to ``m x n`` with ``m <= n``) by ``X_5``, where
``X_{k+1} = a X_k + (b A_k + c A_k^2) X_k`` and ``A_k = X_k X_k^T``, with Muon's coefficients ``(a, b, c) =
NS_COEFFS`` and ``NS_STEPS = 5`` iterations (Jordan et al. 2024; the defaults of ``optax.contrib.muon``).

* ``"direct"`` is that recurrence, computed operation for operation as ``optax.contrib.scale_by_muon`` computes it,
  so its result is optax's Muon direction bit for bit (`tests/optimizers/test_newton_schulz.py`). Per iteration it
  multiplies ``m x m`` by ``m x n`` twice: ``20 m^2 n + 10 m^3`` flops for the 5 iterations.
* ``"gram"`` computes the same polynomial without touching the ``n`` side inside the loop. Every ``X_k`` is
  ``P_k X_0`` with ``P_k`` a polynomial in the Gram matrix ``G = X_0 X_0^T`` (``P_0 = I``), so ``P_k`` commutes with
  ``G``, ``A_k = P_k G P_k`` and ``P_{k+1} = a P_k + (b A_k + c A_k^2) P_k``; the result is ``P_5 X_0``. That is
  ``4 m^2 n`` flops for ``G`` and the final product plus ``40 m^3`` for the loop: fewer once ``n > 1.875 m``, none
  for a square matrix (`flops`).
* ``"auto"`` takes whichever needs fewer flops for the matrix's shape (a static choice per tensor).

The two forms are equal in exact arithmetic. In float32 the Gram form squares the matrix's condition number once
up front, so directions with small singular values carry more rounding: an ill-conditioned matrix's result is less
accurate in the Gram form than in the direct one (`tests/optimizers/test_newton_schulz.py` bounds both against a float64
reference). Muon is commonly run with the iteration in bfloat16, whose rounding is coarser than either.

Many models at once: under `jax.vmap` these products become batched matrix products, which XLA's CPU backend runs
more slowly than the same products one member at a time (docs/performance/step-cost.md). `lane_chunk` is what
vectorized training of an optimizer built on this iteration should use.

References: K. Jordan et al., "Muon: An optimizer for hidden layers in neural networks" (2024),
https://kellerjordan.github.io/posts/muon/ and https://github.com/KellerJordan/modded-nanogpt; optax's
``optax.contrib.scale_by_muon``.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from metafam._checks import check_choice

FORMS = ("direct", "gram", "auto")
# Muon's quintic coefficients (a, b, c) and iteration count (Jordan et al. 2024: modded-nanogpt; optax.contrib.muon's
# defaults, `ns_coeffs` and `ns_steps`).
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-8  # added to the Frobenius norm before dividing by it, as optax does


def iteration_shape(shape: Sequence[int]) -> tuple:
  """The ``(m, n)`` with ``m <= n`` that a tensor of ``shape`` (rank >= 2) is orthogonalized as: the matrix
  ``[prod(shape[:-1]), shape[-1]]``, transposed when it is tall."""
  rows = 1
  for s in shape[:-1]:
    rows *= int(s)
  return tuple(sorted((rows, int(shape[-1]))))


def flops(shape: Sequence[int], form: str) -> int:
  """Multiply-add flops (2 per multiply-add) of the 5 iterations of ``form`` ("direct" or "gram") on ``shape``."""
  m, n = iteration_shape(shape)
  if check_choice("form", form, FORMS[:2]) == "direct":
    return NS_STEPS * (4 * m * m * n + 2 * m ** 3)
  return 4 * m * m * n + NS_STEPS * 8 * m ** 3


def cheaper_form(shape: Sequence[int]) -> str:
  """"gram" where it needs fewer flops than "direct" for ``shape``, else "direct"."""
  return "gram" if flops(shape, "gram") < flops(shape, "direct") else "direct"


def lane_chunk():
  """Members per block for a vmapped update dominated by this iteration (`metafam.inner.step.map_lanes`): 1 on a
  CPU, whose batched matrix products are slower than the same products one member at a time; None (one vmap) on
  accelerators, whose batched matrix products are efficient. Measurements: docs/performance/step-cost.md."""
  return 1 if jax.default_backend() == "cpu" else None


def _iteration(x: jax.Array, coeffs: jax.Array) -> jax.Array:
  """One quintic step ``a X + (b A + c A^2) X`` with ``A = X X^T``, in optax's order of operations: ``c A`` is
  formed before it multiplies ``A``."""
  gram = x @ x.T
  poly = coeffs[1] * gram + coeffs[2] * gram @ gram  # (c A) @ A
  return coeffs[0] * x + poly @ x


def _direct_one(x: jax.Array) -> jax.Array:
  tall = x.shape[0] > x.shape[1]
  if tall:
    x = x.T
  x = x / (jnp.linalg.norm(x, ord="fro") + EPS)
  coeffs = jnp.asarray(NS_COEFFS).astype(x.dtype)  # float32 first (as optax stores them), then x's dtype
  x = jax.lax.fori_loop(0, NS_STEPS, lambda _, y: _iteration(y, coeffs), x, unroll=True)
  return x.T if tall else x


def _direct(x: jax.Array) -> jax.Array:
  # optax orthogonalizes [batch, m, n] under jax.vmap (here a batch of one): the same program, so the same bits
  return jnp.reshape(jax.vmap(_direct_one)(jnp.reshape(x, (1,) + x.shape)), x.shape)


def _gram(x: jax.Array) -> jax.Array:
  a, b, c = NS_COEFFS
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
  normalized and orthogonalized by Muon's 5 quintic Newton-Schulz iterations (singular values near 1), in ``m``'s
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
