"""`metafam.optimizers.newton_schulz`: both forms of Muon's iteration against a float64 recurrence written out here,
their flop counts by hand, the choice between them, zeros and gradients."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metafam.optimizers import newton_schulz as ns

COEFFS = (3.4445, -4.7750, 2.0315)  # optax.contrib.muon's defaults (checked against optax below)


def _reference(x):
  """The quintic recurrence in float64: Frobenius-normalize, transpose a tall matrix, 5 iterations."""
  x = np.asarray(x, np.float64).reshape(-1, np.shape(x)[-1])
  tall = x.shape[0] > x.shape[1]
  x = x.T if tall else x
  x = x / (np.linalg.norm(x) + 1e-8)
  a, b, c = COEFFS
  for _ in range(5):
    s = x @ x.T
    x = a * x + (b * s + c * s @ s) @ x
  return x.T if tall else x


def _matrices(shape, seed):
  rng = np.random.default_rng(seed)
  gauss = rng.standard_normal(shape)
  rows = int(np.prod(shape[:-1]))
  low_rank = (rng.standard_normal((rows, 4)) @ rng.standard_normal((4, shape[-1]))).reshape(shape)
  return {"gaussian": gauss, "rank 4 + 1% noise": low_rank + 0.01 * gauss}


def test_coefficients_are_optaxs():
  assert ns.NS_COEFFS == COEFFS
  defaults = inspect.signature(optax.contrib.scale_by_muon).parameters
  assert tuple(defaults["ns_coeffs"].default) == ns.NS_COEFFS and defaults["ns_steps"].default == ns.NS_STEPS
  assert defaults["eps"].default == ns.EPS


# Relative (Frobenius) error bounds against float64. Measured (tests' shapes and 784 x 128, 192 x 640): Gaussian
# matrices 1e-6 to 3e-6 in both forms; rank 4 + 1% noise: direct up to 2.3e-5, Gram up to 9.6e-4 (its condition number
# is squared once up front). Bounds 10x the Gaussian and ~3-5x the others; a wrong recurrence is off by O(1).
BOUNDS = {("direct", "gaussian"): 3e-5, ("gram", "gaussian"): 3e-5,
          ("direct", "rank 4 + 1% noise"): 1e-4, ("gram", "rank 4 + 1% noise"): 5e-3}


@pytest.mark.parametrize("form", ["direct", "gram"])
@pytest.mark.parametrize("shape", [(40, 12), (12, 40), (3, 3, 4, 8), (30, 1), (1, 30), (16, 16)])
def test_both_forms_compute_the_recurrence(form, shape):
  for kind, m in _matrices(shape, seed=len(shape) * 100 + shape[-1]).items():
    out = np.asarray(ns.orthogonalize(jnp.asarray(m, jnp.float32), form), np.float64)
    assert out.shape == shape
    want = _reference(m)
    got = out.reshape(-1, shape[-1])
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < BOUNDS[(form, kind)], (kind, err)


def _optax_direction(x):
  """optax's Muon direction of a matrix: `scale_by_muon` without momentum (with beta = 0 its momentum is ``x``)."""
  tx = optax.contrib.scale_by_muon(beta=0.0, nesterov=False)
  return tx.update(x, tx.init(x))[0]


def _guarded_optax_direction(x):
  """`_optax_direction` inside `orthogonalize`'s own guard against an all-zero matrix (the guard's `where`s are part
  of the compiled program, and XLA may round a program differently once they surround it)."""
  nonzero = jnp.any(x != 0)
  return jnp.where(nonzero, _optax_direction(jnp.where(nonzero, x, jnp.ones_like(x))), 0.0).astype(x.dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape", [(24, 10), (10, 24), (16, 16), (1, 30)])
def test_direct_form_is_optaxs_muon_direction_bit_for_bit(shape, dtype):
  """The explicit coefficients and iteration are optax's computation: equal bits eagerly, jitted, and vmapped over
  a batch of matrices (as vectorized training runs it)."""
  x = jnp.asarray(_matrices(shape, 0)["gaussian"], dtype)
  np.testing.assert_array_equal(np.asarray(ns.orthogonalize(x, "direct")), np.asarray(_optax_direction(x)))
  np.testing.assert_array_equal(np.asarray(jax.jit(ns.orthogonalize, static_argnums=1)(x, "direct")),
                                np.asarray(jax.jit(_guarded_optax_direction)(x)))
  batch = jnp.stack([x, 2 * x + 1, -x])
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(lambda y: ns.orthogonalize(y, "direct")))(batch)),
                                np.asarray(jax.jit(jax.vmap(_guarded_optax_direction))(batch)))


def test_flop_counts_by_hand_and_the_cheaper_form():
  # 784 x 128 (transposed to m = 128, n = 784): direct 5 (4 m^2 n + 2 m^3), Gram 4 m^2 n + 40 m^3.
  assert ns.flops((784, 128), "direct") == 5 * (4 * 128 * 128 * 784 + 2 * 128 ** 3) == 277_872_640
  assert ns.flops((784, 128), "gram") == 4 * 128 * 128 * 784 + 40 * 128 ** 3 == 135_266_304
  assert ns.flops((128, 784), "gram") == ns.flops((784, 128), "gram")
  assert ns.flops((3, 3, 16, 32), "direct") == ns.flops((144, 32), "direct")  # the matrix [prod(shape[:-1]), -1]
  # They tie at n = 1.875 m (m = 16, n = 30): a tie stays direct; one column more and Gram is cheaper.
  assert ns.flops((16, 30), "gram") == ns.flops((16, 30), "direct")
  assert ns.cheaper_form((16, 30)) == "direct" and ns.cheaper_form((16, 31)) == "gram"
  assert ns.cheaper_form((1024, 1024)) == "direct" and ns.cheaper_form((784, 128)) == "gram"


def test_auto_takes_the_cheaper_form_per_shape():
  for shape in [(40, 12), (16, 16)]:
    x = jnp.asarray(_matrices(shape, 1)["gaussian"], jnp.float32)
    np.testing.assert_array_equal(np.asarray(ns.orthogonalize(x, "auto")),
                                  np.asarray(ns.orthogonalize(x, ns.cheaper_form(shape))))


@pytest.mark.parametrize("form", ["direct", "gram"])
def test_zero_input_gives_zeros_and_a_zero_gradient(form):
  zero = jnp.zeros((5, 3))
  assert not np.any(np.asarray(ns.orthogonalize(zero, form)))
  grad = jax.grad(lambda x: jnp.sum(ns.orthogonalize(x, form) * jnp.arange(15.0).reshape(5, 3)))(zero)
  assert np.all(np.isfinite(np.asarray(grad))) and not np.any(np.asarray(grad))


def test_gram_forms_gradient_is_the_direct_forms():
  """The same function, so the same derivative: vector-Jacobian products agree to float32 rounding (measured
  relative difference ~1e-6 on this well-conditioned matrix; bound 1e-4)."""
  x = jnp.asarray(_matrices((20, 7), 2)["gaussian"], jnp.float32)
  w = jnp.asarray(np.random.default_rng(3).standard_normal((20, 7)), jnp.float32)
  grads = [np.asarray(jax.grad(lambda y: jnp.sum(ns.orthogonalize(y, f) * w))(x)) for f in ("direct", "gram")]
  assert np.linalg.norm(grads[0] - grads[1]) / np.linalg.norm(grads[0]) < 1e-4


def test_bad_form_is_refused_by_name():
  with pytest.raises(ValueError, match="form"):
    ns.orthogonalize(jnp.ones((3, 2)), "svd")
  with pytest.raises(ValueError, match="form"):
    ns.flops((3, 2), "auto")
