"""`metafam.pretrained`: the shipped weights load safely, and the optax transformation trains models it has never
seen (a Haiku CNN defined here beats tuned Adam), on any params pytree, dtype, jit and sharding; generalist_v2 is
Muon with its learned gains and schedule, computed independently here."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from optax_runs import optax_updates as run_optax  # tx's updates along a gradient sequence

import metafam.pretrained as pretrained
from metafam._registry import UnknownNameError
from metafam.datasets import mnist_digits_datasets
from metafam.optimizers.adafac_mlp_lopt import AdafacOptaxState
from metafam.optimizers.muon_lopt import muon_dimension_numbers

# The run length every call passes: generalist_v2 needs it, generalist_v1 checks and ignores it.
NUM_STEPS = 100


def test_list_and_unknown_names():
  assert pretrained.list() == sorted(pretrained.PRETRAINED) and "generalist_v1" in pretrained.list()
  with pytest.raises(UnknownNameError,
                     match="unknown pretrained optimizer 'nope'; valid names: generalist_v1, generalist_v2"):
    pretrained.load("nope")


@pytest.mark.parametrize("rate", [0, -1e-3, float("nan"), float("inf"), "0.01", True, None,
                                  jnp.float32(-1e-3), jnp.float32(float("nan"))])
@pytest.mark.parametrize("name", sorted(pretrained.PRETRAINED))
def test_bad_learning_rates_are_refused_by_name(rate, name):
  with pytest.raises(ValueError, match="learning_rate must be a finite number > 0 or an optax schedule"):
    pretrained.optax_transform(name, rate, num_steps=NUM_STEPS)


@pytest.mark.parametrize("num_steps", [0, -5, 2.5, 100.0, float("nan"), True, "100", jnp.float32(100), jnp.int32(0)])
@pytest.mark.parametrize("name", sorted(pretrained.PRETRAINED))
def test_bad_run_lengths_are_refused_by_name(num_steps, name):
  with pytest.raises(ValueError, match="num_steps must be an int >= 1"):
    pretrained.optax_transform(name, 1e-2, num_steps=num_steps)


def test_a_schedule_without_the_run_length_is_a_clear_error():
  assert pretrained.info("generalist_v2").uses_horizon and not pretrained.info("generalist_v1").uses_horizon
  with pytest.raises(ValueError, match=r"generalist_v2 has a learned schedule .* pass num_steps="):
    pretrained.optax_transform("generalist_v2", 1e-2)
  # generalist_v1 reads no horizon: the run length changes nothing.
  params = {"w": jax.random.normal(jax.random.key(3), (4, 3))}
  grads = jax.tree.map(jnp.cos, params)
  plain, given = (pretrained.optax_transform("generalist_v1", 1e-2, **kw) for kw in ({}, {"num_steps": 7}))
  np.testing.assert_array_equal(plain.update(grads, plain.init(params), params)[0]["w"],
                                given.update(grads, given.init(params), params)[0]["w"])


def test_generalist_v2_is_muon_with_its_learned_gains_and_schedule():
  """Its theta holds two log-gains (matrices, other tensors) and 5 log-multipliers at evenly spaced fractions of the
  run; its update t of T is optax.contrib.muon's at learning rate ``lr * exp(gain) * exp(interp(t / T, knots))``
  (np.interp here), conv kernels as matrices. The learned schedule and gains are not trivial: a wrong horizon or
  swapped gains are off by tens of percent."""
  _, theta = pretrained.load("generalist_v2")
  gains, knots = np.asarray(theta["log_gain"], np.float64), np.asarray(theta["log_schedule"], np.float64)
  assert gains.shape == (2,) and knots.shape == (5,) and np.ptp(knots) > 1 and abs(gains[1] - gains[0]) > 0.5
  lr, steps = 0.02, 8
  fractions = np.linspace(0, 1, len(knots))
  rate = lambda gain: lambda count: lr * jnp.exp(gain + jnp.interp(count / steps, fractions, knots))
  ref_tx = optax.contrib.muon(rate(gains[0]), adam_learning_rate=rate(gains[1]),
                              muon_weight_dimension_numbers=muon_dimension_numbers("matrix"))
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.standard_normal((6, 10)), jnp.float32),
            "w_tall": jnp.asarray(rng.standard_normal((12, 5)), jnp.float32),
            "conv": jnp.asarray(rng.standard_normal((3, 3, 2, 4)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal(5), jnp.float32), "s": jnp.asarray(0.3, jnp.float32)}
  grads = [jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), jnp.float32), params)
           for _ in range(steps)]
  ours = run_optax(pretrained.optax_transform("generalist_v2", lr, num_steps=steps), params, grads)
  ref = run_optax(ref_tx, params, grads)
  for t, (a, b) in enumerate(zip(ours, ref)):
    for k in params:
      # float32 Newton-Schulz amplifies a one-ulp difference of its input to 2e-5 relative
      # (tests/optimizers/test_muon_lopt.py): tolerance 1e-4 of each entry and of the update's largest entry; the
      # schedule moves t to t + 1 by up to 30%.
      scale = float(np.max(np.abs(np.asarray(b[k]))))
      np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=1e-4, atol=1e-4 * scale,
                                 err_msg=f"{k} update {t}")


def _rms(x):
  return float(jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32)))))


def test_any_pytree_any_dtype_under_jit_with_unit_rms_steps():
  """Each tensor's step has RMS = the learning rate (the network sets only its direction); dtypes are kept."""
  k = jax.random.split(jax.random.key(0), 5)
  params = {"conv": {"kernel": jax.random.normal(k[0], (3, 3, 4, 8))},
            "dense": [jax.random.normal(k[1], (32, 10)).astype(jnp.bfloat16), jnp.zeros((10,), jnp.float16)],
            "scale": jnp.asarray(1.5, jnp.float32), "deep": (jax.random.normal(k[2], (2, 5, 6, 7)),)}
  keys = jax.tree.unflatten(jax.tree.structure(params), list(jax.random.split(k[3], 5)))
  grads = jax.tree.map(lambda p, kk: jax.random.normal(kk, jnp.shape(p), jnp.float32).astype(p.dtype), params, keys)
  lr = 3e-3
  tx = pretrained.optax_transform("generalist_v1", lr)
  state = tx.init(params)
  updates, state = jax.jit(tx.update)(grads, state, params)
  assert jax.tree.map(lambda u: u.dtype, updates) == jax.tree.map(lambda p: p.dtype, params)
  assert int(state.count) == 1
  # float32 tensors: RMS = lr up to rounding of (p - step) - p (steps are ~1e-3 of |p| ~ 1: relative 1e-4).
  for u in (updates["conv"]["kernel"], updates["deep"][0]):
    assert _rms(u) == pytest.approx(lr, rel=1e-3)
  # A scalar's unit-RMS step is +-lr exactly (up to float32 rounding at |p| = 1.5).
  assert abs(float(updates["scale"])) == pytest.approx(lr, rel=1e-4)
  # bf16 / f16: the step is rounded to the tensor's precision (bf16 spacing near |p| ~ 1 is 2^-7 ~ 2.6 lr).
  assert np.all(np.isfinite(np.asarray(updates["dense"][0], np.float32)))
  assert _rms(updates["dense"][1]) == pytest.approx(lr, rel=1e-2)  # f16 spacing near 0 is fine-grained


def test_state_holds_no_params_copy_and_its_size_is_as_documented():
  params = {"w": jnp.zeros((20, 30)), "b": jnp.zeros((30,)), "s": jnp.zeros(())}
  state = pretrained.optax_transform("generalist_v1", 1e-2).init(params)
  assert isinstance(state, AdafacOptaxState)
  sizes = {k: sum(np.size(x) for x in jax.tree.leaves(v)) for k, v in state.accumulators.items()}
  # Docstring: 3 momenta + 3 x (rows + columns) for matrices; 3 momenta + 3 second moments otherwise.
  assert sizes == {"w": 3 * 600 + 3 * (20 + 30), "b": 6 * 30, "s": 6}
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.accumulators))


@pytest.mark.parametrize("name", sorted(pretrained.PRETRAINED))
def test_sharded_params_give_the_unsharded_updates(name):
  mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Auto,))
  params = {"w": jax.random.normal(jax.random.key(1), (16, 8)), "b": jnp.ones((8,))}
  grads = jax.tree.map(lambda p: jnp.sin(p) + 0.1, params)
  tx = pretrained.optax_transform(name, optax.cosine_decay_schedule(1e-2, 100), num_steps=NUM_STEPS)
  plain = jax.jit(tx.update)(grads, tx.init(params), params)[0]
  shard = {"w": NamedSharding(mesh, P("x", None)), "b": NamedSharding(mesh, P())}
  sp, sg = jax.device_put(params, shard), jax.device_put(grads, shard)
  sharded = jax.jit(tx.update)(sg, tx.init(sp), sp)[0]
  # generalist_v1's updates are (p - step) - p in float32: a different reduction order in the per-tensor means may
  # move the new p by an ulp (|p| < 4 here: 2^-21 ~ 4.8e-7). generalist_v2's are -step, whose Newton-Schulz
  # iterations amplify a reordered sum's last-ulp change to 2e-5 relative (tests/optimizers/test_muon_lopt.py): 1e-4 of
  # its largest entry.
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(sharded)):
    atol = 2.0 ** -21 if name == "generalist_v1" else 1e-4 * float(np.max(np.abs(np.asarray(a))))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol)


def test_update_without_params_is_a_clear_error():
  tx = pretrained.optax_transform("generalist_v1", 1e-2)
  params = {"w": jnp.ones((2, 3))}
  with pytest.raises(ValueError, match="needs the current params"):
    tx.update(params, tx.init(params))


# -- a model it has never seen: a Haiku CNN on MNIST digits (the recipe's families are Fashion-MNIST MLPs, an
# autoencoder and a conv net of two 3x3 layers and a dense head; this one has a stride-2 layer, global average
# pooling, 3x3x{8,16}), both tuned on the same 3-point grid, half a decade apart, around Adam's best rate here.
STEPS, BATCH, GRID = 100, 32, np.asarray([1e-2, 3e-2, 1e-1])


def _cnn(images):
  x = jax.nn.relu(hk.Conv2D(8, 3)(images))
  x = jax.nn.relu(hk.Conv2D(16, 3, stride=2)(x))
  return hk.Linear(10)(jnp.mean(x, axis=(1, 2)))


def _final_test_losses(make_tx):
  """Mean test loss over 2 seeds after STEPS steps, for each rate of GRID (one vmapped program)."""
  net = hk.without_apply_rng(hk.transform(_cnn))
  ds = mnist_digits_datasets(batch_size=BATCH, image_size=8)
  train = jax.tree.map(lambda *xs: jnp.stack(xs), *[next(ds.train) for _ in range(STEPS)])
  test = jax.tree.map(lambda *xs: jnp.concatenate(xs), *[next(ds.test) for _ in range(8)])

  def loss(params, batch):
    logits = net.apply(params, batch["image"])
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]))

  def run(rate, seed):
    tx = make_tx(lambda count: rate)
    params = net.init(jax.random.key(seed), test["image"][:1])

    def step(carry, batch):
      params, state = carry
      updates, state = tx.update(jax.grad(loss)(params, batch), state, params)
      return (optax.apply_updates(params, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), train)
    return loss(params, test)

  rates = jnp.asarray(GRID, jnp.float32)
  losses = jax.jit(jax.vmap(jax.vmap(run, (None, 0)), (0, None)))(rates, jnp.arange(2))
  return np.asarray(losses).mean(axis=1)


@pytest.mark.slow  # a quality check of the shipped weights (two rate sweeps); the default tests cover its code path
@pytest.mark.parametrize("name", sorted(pretrained.PRETRAINED))
def test_trains_an_unseen_cnn_below_tuned_adam(name):
  adam = _final_test_losses(optax.adam)
  learned = _final_test_losses(lambda lr: pretrained.optax_transform(name, lr, num_steps=STEPS))
  assert np.all(np.isfinite(learned))
  # Each tuned over the same rates (Adam's best inside the grid: it is tuned); the learned optimizer's best is below
  # Adam's best (measured 2026-11-29: 1.54 for Adam at 3e-2; generalist_v1 0.89 at 3e-2; generalist_v2 0.93 at 1e-1,
  # the grid's edge: it could be better still).
  assert 0 < np.argmin(adam) < len(GRID) - 1, adam
  assert learned.min() < adam.min(), (learned, adam)


def test_learning_rate_as_an_injected_hyperparameter():
  """Under `optax.inject_hyperparams` the rate arrives as a (traced) array and can be changed in the state."""
  tx = optax.inject_hyperparams(pretrained.optax_transform, static_args=("name",))(name="generalist_v1",
                                                                                   learning_rate=1e-2)
  params = {"w": jax.random.normal(jax.random.key(2), (3, 2))}
  update = jax.jit(tx.update)
  state = tx.init(params)
  for rate in (1e-2, 3e-2):
    state.hyperparams["learning_rate"] = jnp.asarray(rate)
    updates, state = update(params, state, params)
    assert _rms(updates["w"]) == pytest.approx(rate, rel=1e-4)


def test_the_run_length_is_a_static_argument_of_an_injected_rate():
  """generalist_v2 under `optax.inject_hyperparams`, with ``num_steps`` static: the rate scales the step."""
  inject = optax.inject_hyperparams(pretrained.optax_transform, static_args=("name", "num_steps"))
  tx = inject(name="generalist_v2", learning_rate=1e-2, num_steps=NUM_STEPS)
  params = {"w": jax.random.normal(jax.random.key(2), (5, 4)), "b": jnp.zeros((4,))}
  grads = jax.tree.map(lambda p: jnp.cos(p) + 0.5, params)
  update, state = jax.jit(tx.update), tx.init(params)
  small = update(grads, state, params)[0]
  state.hyperparams["learning_rate"] = jnp.asarray(3e-2)
  large = update(grads, state, params)[0]
  for a, b in zip(jax.tree.leaves(small), jax.tree.leaves(large)):  # the same direction, 3x the size
    np.testing.assert_allclose(np.asarray(b), 3 * np.asarray(a), rtol=1e-5, atol=1e-9)
