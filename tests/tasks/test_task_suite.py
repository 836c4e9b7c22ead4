"""Every registered task: a vmapped, jitted init/loss/grad/Adam smoke test with value checks; the conv / autoencoder /
language-model families reproduce their fixed tasks and apply their configs.

The registry's contract for every task (its documented parameter count, the same program traced on abstract inputs)
and `metafam.taskfamilies.base.check_family` over every registered family (these included) run in the conformance
table (tests/test_conformance.py, rows TASKS and FAMILIES) and are not repeated here.
"""

import math

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.datasets.images import fashion_mnist_datasets
from metafam.optimizers.base import Adam
from metafam.taskfamilies import registry as family_registry
from metafam.taskfamilies._sampling import init_from_one_draw
from metafam.taskfamilies.conv import ConvFamily
from metafam.taskfamilies.language import TransformerLanguageModelFamily
from metafam.tasks import autoencoder, conv, language, registry, vision
from metafam.tasks._nn import num_params
from metafam.tasks.image_mlp import ImageMLPTask
from metafam.tasks.quadratic import QuadraticTask
# The registries' documented parameter counts, and the vmapped init/loss/grad/Adam program the table traces
from test_conformance import DOCUMENTED, task_program as _program, without_data as _without_data

LEARNING_RATE = 1e-3
# The test suite's tasks read small stand-in files of the full Fashion-MNIST (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("small_full_fashion_mnist")


@pytest.fixture(autouse=True)
def _fast_random_compile():
  """Compile with ``jax_threefry_partitionable=False``: on CPU, vmapped haiku initializers then compile ~5x faster
  (measured 8.0 s -> 1.7 s for a 3-layer MLP). Nothing here depends on the random stream; check_family in
  tests/test_conformance.py (row FAMILIES) covers these tasks' families under the default setting."""
  with jax.threefry_partitionable(False):
    yield


def _kind(task):
  if isinstance(task, (ImageMLPTask, conv.ConvTask, vision.MLPMixerTask)):
    return "classifier"
  if isinstance(task, language.LanguageModelTask):
    return "lm"
  for kind, cls in (("ae", autoencoder.MLPAutoencoderTask), ("vae", autoencoder.VAETask), ("quadratic", QuadraticTask)):
    if isinstance(task, cls):
      return kind
  raise AssertionError(f"no expectations written for {type(task).__name__}; add them to this test.")


# A compiled, numeric smoke test for the smallest registered task of every model class runs by default; the other
# registered tasks (larger inputs and widths of the same classes) run it under `-m slow`. The transformer LM's code
# runs by default in its family's tests below (loss, causality, activations, init range) and in
# tests/test_conformance.py (its family's vmapped value_and_grad via check_family); its 2x64 smoke test alone costs
# ~15 s of compile.
DEFAULT_SMOKE = {"quadratic_10", "fmnist_mlp_8x8_64x64_tanh", "fmnist_conv_16x16_16x32", "fmnist_ae_8x8_32x8x32",
                 "fmnist_vae_8x8_32_z4", "shakespeare_char_lstm_64"}


@pytest.mark.parametrize("name", [n if n in DEFAULT_SMOKE else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(registry.TASKS)])
def test_task_smoke(name):
  """Init from the abstract batch, loss/grad/one Adam step for 2 vmapped instances in one jitted program."""
  full = registry.get_task(name)
  batch = None if full.datasets is None else next(full.datasets.train)
  task = _without_data(registry.get_task(name))
  out = jax.device_get(jax.jit(_program(task, Adam(LEARNING_RATE)))(jax.random.split(jax.random.key(0), 2), batch))
  loss, normalized = out["loss"], out["normalized"]
  assert np.all(np.isfinite(loss)) and all(np.all(np.isfinite(g)) for g in jax.tree.leaves(out["grad"]))
  assert np.all(sum(np.sum(np.square(g), axis=tuple(range(1, g.ndim))) for g in jax.tree.leaves(out["grad"])) > 0)
  assert any(not np.array_equal(p[0], p[1]) for p in jax.tree.leaves(out["params"]))  # each instance has its init
  # Adam's first step moves every parameter by at most the learning rate (|m / sqrt(v)| = 1 at step one), and on
  # the same batch and key a step this small lowers the loss. The measured step |p_new - p| also holds float32
  # rounding: p_new's (up to an ulp of |p|, 1.2e-4 of the step at |p| ~ 1) and, under the suite's cheap compile
  # settings (conftest.py), up to 3e-4 of the step measured; 1e-3 covers both, and a wrong first step (no bias
  # correction: 3.2x; a doubled rate: 2x) is far outside.
  assert np.all(out["max_step"] <= LEARNING_RATE * (1 + 1e-3)) and np.all(out["max_step"] > 0.5 * LEARNING_RATE)
  assert np.all(out["loss_after"] < loss)
  kind = _kind(task)
  if kind == "vae":  # the reparameterization noise comes from the loss key
    assert np.all(out["loss_other_key"] != loss)
  else:
    np.testing.assert_allclose(out["loss_other_key"], loss, rtol=1e-6)

  if kind == "classifier":
    # Fan-in-scaled init gives near-zero logits of variance v < ~0.5, and CE ~ log(K) + v / 2, so the normalized CE
    # (CE / log K) starts within 0.9..1.15 (measured: 0.99..1.03).
    assert np.all((normalized > 0.9) & (normalized < 1.15))
    assert np.all((out["aux"]["accuracy"] >= 0) & (out["aux"]["accuracy"] <= 1))
  elif kind == "lm":
    # Same argument with V = 76: the LSTM's bounded outputs give ~log V, the transformer's final LayerNorm gives
    # unit-variance features and logits of variance ~1 -> + 0.5 nats (measured 1.00 and 1.08 after / log V).
    assert np.all((normalized > 0.95) & (normalized < 1.2))
    assert np.all(out["aux"]["accuracy"] < 0.2)
  elif kind == "ae":
    # sigmoid(logits ~ 0) ~ 0.5, so the MSE is near E[(x - 0.5)^2] of the batch, plus the logits' spread.
    baseline = float(np.mean((batch["image"] - 0.5) ** 2))
    assert np.all((loss > 0.8 * baseline) & (loss < baseline + 0.05)), (loss, baseline)
    np.testing.assert_allclose(normalized, loss / 0.25, rtol=1e-6)
  elif kind == "vae":
    # The decoder starts near zero logits: log 2 nats per pixel, plus a small KL -> normalized slightly above 1.
    assert np.all((normalized > 0.95) & (normalized < 1.3))
    np.testing.assert_allclose(out["aux"]["reconstruction"] + out["aux"]["kl"], loss, rtol=1e-5)
    assert np.all(out["aux"]["kl"] > 0)
  elif kind == "quadratic":
    # 0.5 * ||x||^2 with x ~ N(0, I_10): mean 5; 25 is beyond the 99.999% quantile.
    assert np.all((loss > 0) & (loss < 25))


def test_cross_entropy_helpers_match_definitions():
  logits = jnp.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
  labels = jnp.array([0, 2])
  logp = jax.nn.log_softmax(logits)
  plain = -(logp[0, 0] + logp[1, 2]) / 2
  np.testing.assert_allclose(conv.smoothed_cross_entropy(logits, labels), plain, rtol=1e-6)
  smooth = 0.3 * -jnp.mean(logp) + 0.7 * plain
  np.testing.assert_allclose(conv.smoothed_cross_entropy(logits, labels, 0.3), smooth, rtol=1e-6)
  np.testing.assert_allclose(autoencoder.sigmoid_cross_entropy(jnp.array([0.0, 3.0]), jnp.array([0.5, 1.0])),
                             [math.log(2.0), math.log1p(math.exp(-3.0))], rtol=1e-6)
  assert conv.conv_num_params(3, (16, 32, 64), 10) == 24234
  assert autoencoder.mlp_num_params((64, 32, 8, 32, 64)) == 4744


@pytest.mark.parametrize("shape,kernel,stride", [((2, 28, 28, 1), 3, 2), ((2, 7, 9, 3), 3, 1), ((1, 8, 8, 4), 5, 2),
                                                ((3, 5, 6, 2), 1, 1), ((2, 11, 10, 2), 3, 3)])
def test_conv2d_same_is_the_lax_convolution(shape, kernel, stride):
  # The same sums of products in another order: float32 rounding of sums of at most k*k*C = 100 terms is below
  # 1e-5 of the output's scale (checked on values, on the input's gradient and on the kernel's gradient).
  kx, kw, kc = jax.random.split(jax.random.key(3), 3)
  x = jax.random.normal(kx, shape)
  w = jax.random.normal(kw, (kernel, kernel, shape[-1], 5))
  cot = jax.random.normal(kc, (shape[0], -(-shape[1] // stride), -(-shape[2] // stride), 5))

  def reference(x, w):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        precision="highest")

  def ours(x, w):
    with jax.default_matmul_precision("highest"):
      return conv.conv2d_same(x, w, stride)

  want, got = reference(x, w), ours(x, w)
  assert got.shape == want.shape == cot.shape
  np.testing.assert_allclose(got, want, atol=1e-5 * float(jnp.max(jnp.abs(want))))
  for g_want, g_got in zip(jax.grad(lambda *a: jnp.sum(reference(*a) * cot), (0, 1))(x, w),
                           jax.grad(lambda *a: jnp.sum(ours(*a) * cot), (0, 1))(x, w)):
    np.testing.assert_allclose(g_got, g_want, atol=1e-5 * float(jnp.max(jnp.abs(g_want))))
  with pytest.raises(ValueError, match="w must be"):
    conv.conv2d_same(x, w[:, :-1], stride)


def test_conv2d_module_keeps_haikus_parameters():
  x = jax.random.normal(jax.random.key(0), (2, 9, 9, 3))
  ours = hk.without_apply_rng(hk.transform(lambda x: conv.Conv2D(4, 3, stride=2, name="c")(x)))
  haikus = hk.without_apply_rng(hk.transform(lambda x: hk.Conv2D(4, 3, stride=2, padding="SAME", name="c")(x)))
  params = ours.init(jax.random.key(1), x)
  jax.tree.map(np.testing.assert_array_equal, params, haikus.init(jax.random.key(1), x))
  params = jax.tree.map(lambda p: p + 0.1, params)  # a nonzero bias too
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(ours.apply(params, x), haikus.apply(params, x), rtol=1e-5, atol=1e-5)


# -- families ------------------------------------------------------------------------------------------------------

NEW_FAMILIES = ["fmnist_conv_family_16x16_16x32", "fmnist_ae_family_8x8_32x8x32", "shakespeare_lstm_family_32",
                "shakespeare_transformer_family_1x32"]


def _reference(name, family, activation):
  """The fixed task with the family's architecture, data and ``activation``."""
  if name.startswith("fmnist_conv"):
    return conv.ConvTask(family.channels, activation, datasets=family.datasets)
  if name.startswith("fmnist_ae"):
    return autoencoder.MLPAutoencoderTask(family.hidden_sizes, activation, datasets=family.datasets)
  if "lstm" in name:
    return language.LSTMLanguageModelTask(family.hidden_size, family.embed_size, datasets=family.datasets)
  return language.TransformerLanguageModelTask(family.num_layers, family.model_size, family.num_heads,
                                               activation=activation, datasets=family.datasets)


def _expected_loss(ref, logits, batch, smoothing=0.0):
  """The reference task's loss recomputed in numpy from its logits."""
  if isinstance(ref, autoencoder.MLPAutoencoderTask):
    recon = 1 / (1 + np.exp(-logits.reshape(batch["image"].shape)))
    return np.mean((recon - batch["image"]) ** 2)
  labels = batch["target"] if "target" in batch else batch["label"]
  logp = np.asarray(jax.nn.log_softmax(logits))
  nll = -np.mean(np.take_along_axis(logp, labels[..., None], axis=-1))
  return (1 - smoothing) * nll + smoothing * -np.mean(logp)


def test_new_families_are_registered_with_documented_param_counts():
  for name in NEW_FAMILIES:
    family = family_registry.get_family(name)
    params = jax.eval_shape(lambda k: family.task_fn(family.sample(k)).init(k), jax.random.key(0))
    assert num_params(params) == DOCUMENTED[name]


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_family_reproduces_fixed_task_and_applies_config(name):
  """The neutral config is the fixed task; every config leaf does what its docstring says. All family losses come
  from one forward vmapped over configs, as in vectorized meta-training."""
  family = family_registry.get_family(name)
  batch = next(family.datasets.train)
  cfg0 = jax.eval_shape(family.sample, jax.random.key(0))  # structure and dtypes of a config
  neutral = {"init_scale": 1.0, "label_smoothing": 0.0, "input_scale": 1.0, "input_shift": 0.0, "embed_scale": 1.0}
  base = {k: np.asarray(neutral.get(k, 0), v.dtype) for k, v in cfg0.items()}
  default_act = ("gelu" if "transformer" in name else "relu")
  if "activation" in base:
    base["activation"] = np.asarray(family.activations.index(default_act), np.int32)
  cfg = lambda **kw: dict(base, **{k: jnp.asarray(v, base[k].dtype) for k, v in kw.items()})
  ref = _reference(name, family, default_act)
  images = "image" in batch
  inputs = batch["image"] if images else batch["obs"]
  # Activation references: every activation for the cheap autoencoder MLP, one non-default one for the conv net and
  # the transformer (their families map indices to activations the same way).
  if "activation" not in base:
    acts = []
  elif name.startswith("fmnist_ae"):
    acts = list(enumerate(family.activations))
  else:
    other_act = "tanh" if images else "relu"
    acts = [(family.activations.index(other_act), other_act)]
  refs = [_reference(name, family, a) for _, a in acts]

  @jax.jit
  def run(key, batch):
    inits = jax.vmap(lambda s: family.task_fn(cfg(init_scale=s)).init(key))(jnp.array([1.0, 2.0]))
    params = jax.tree.map(lambda x: x[0], inits)
    cases = {"base": base}
    if "label_smoothing" in base:
      cases["smoothed"] = cfg(label_smoothing=0.2)
    if images:  # the net sees image * input_scale + input_shift; the target is unchanged
      cases["shifted"] = cfg(input_scale=1.5, input_shift=-0.25)
    if "embed_scale" in base:
      cases["embed_x2"] = cfg(embed_scale=2.0)
    for i, _ in enumerate(family.activations if "activation" in base else ()):
      cases[f"act{i}"] = cfg(activation=i)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *cases.values())
    losses = jax.vmap(lambda c: family.task_fn(c).loss(params, key, batch))(stacked)
    # Reference logits on the clean inputs and on the moved images or (transformer) a future-changed sequence.
    other = batch["image"] * 1.5 - 0.25 if images else batch["obs"].at[:, 20:].set(0)
    logits = jax.vmap(ref.net.apply, (None, 0))(params, jnp.stack([inputs, other]))
    doubled = jax.tree_util.tree_map_with_path(
        lambda p, v: 2 * v if jax.tree_util.keystr(p).endswith("['embeddings']") else v, params)
    return {"losses": dict(zip(cases, losses)), "logits": logits, "params": params, "inits": inits,
            "haiku_init": ref.init(key),
            "ref_acts": [r.loss(params, key, batch) for r in refs],
            "doubled_embeddings": ref.loss(doubled, key, batch) if "embed_scale" in base else None}

  out = jax.device_get(run(jax.random.key(0), batch))
  losses, logits = out["losses"], out["logits"]
  # The neutral config is exactly the fixed task (recomputed from the reference net's logits) and starts near
  # chance: normalized CE ~ 1 for classifiers and LMs (see test_task_smoke), MSE / 0.25 ~ 0.5-0.7 for the autoencoder.
  np.testing.assert_allclose(losses["base"], _expected_loss(ref, logits[0], batch), rtol=1e-5)
  normalized = float(family.task_fn(base).normalizer(losses["base"]))
  assert (0.3 < normalized < 0.9) if name.startswith("fmnist_ae") else (0.9 < normalized < 1.2)
  if "smoothed" in losses:
    np.testing.assert_allclose(losses["smoothed"], _expected_loss(ref, logits[0], batch, 0.2), rtol=1e-5)
  if images:
    np.testing.assert_allclose(losses["shifted"], _expected_loss(ref, logits[1], batch), rtol=1e-5)
  elif "activation" in base:  # transformer: the past does not see the future
    np.testing.assert_allclose(logits[0][:, :20], logits[1][:, :20], rtol=1e-5, atol=1e-6)
    assert np.max(np.abs(logits[0][:, 20:] - logits[1][:, 20:])) > 1e-3
  if "embed_x2" in losses:
    np.testing.assert_allclose(losses["embed_x2"], out["doubled_embeddings"], rtol=1e-5)
  for (i, _), ref_loss in zip(acts, out["ref_acts"]):  # the int32 leaf picks the named activation
    np.testing.assert_allclose(losses[f"act{i}"], ref_loss, rtol=1e-5)
  act_losses = [round(float(v), 5) for k, v in losses.items() if k.startswith("act")]
  assert len(set(act_losses)) == len(act_losses)  # and the activations really differ
  # The one-draw init has haiku's default per-parameter distributions: equal constants, and truncated normals with
  # the same scale (truncation at 2 stddev: std = 0.88 * stddev; std estimates from >= 1000 entries are within ~3%).
  assert jax.tree.structure(out["params"]) == jax.tree.structure(out["haiku_init"])
  for module, p in out["params"].items():
    for k, ours in p.items():
      theirs = out["haiku_init"][module][k]
      assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
      if k in ("b", "offset", "scale"):
        np.testing.assert_array_equal(ours, theirs)
      elif ours.size >= 1000:
        assert np.std(ours) == pytest.approx(np.std(theirs), rel=0.15), (module, k)
        assert np.max(np.abs(ours)) <= 1.1 * 2 * np.std(theirs) / 0.8796, (module, k)  # truncated at 2 stddev
  # init_scale multiplies weights ("w") and nothing else. The two inits are separate computations in one program,
  # whose truncated-normal transforms XLA may fuse (and so round) differently: agreement to 1e-6 of the tensor's
  # largest entry (~8 float32 ulps) is rounding, where a missing or misplaced scale is off by a factor of 2.
  for module, p in out["params"].items():
    for k, v in p.items():
      expected = 2 * v if k == "w" else v
      np.testing.assert_allclose(out["inits"][module][k][1], expected, rtol=0,
                                 atol=1e-6 * float(np.max(np.abs(expected))))
  # Samples stay inside the declared ranges, keep their dtypes and cover every activation. (Sampled eagerly: the
  # few scalar random ops compile once per process, where a vmapped sampler is one more multi-second compile.)
  samples = [family.sample(k) for k in jax.random.split(jax.random.key(1), 64)]
  cfgs = {k: np.stack([np.asarray(c[k]) for c in samples]) for k in samples[0]}
  assert {k: v.dtype for k, v in cfgs.items()} == {k: v.dtype for k, v in cfg0.items()}
  for leaf in ("init_scale", "label_smoothing", "input_scale", "input_shift", "embed_scale"):
    if leaf in cfgs:
      lo, hi = getattr(family, f"{leaf}_range")
      assert np.all((cfgs[leaf] >= lo) & (cfgs[leaf] <= hi)) and np.std(cfgs[leaf]) > 0.1 * (hi - lo)
  if "activation" in cfgs:
    assert cfgs["activation"].dtype == np.int32
    assert set(cfgs["activation"].tolist()) == set(range(len(family.activations)))


def test_family_and_task_argument_errors():
  with pytest.raises(ValueError, match="label_smoothing_range must be a pair low <= high with low >= 0.0"):
    ConvFamily(label_smoothing_range=(-0.1, 0.2))
  with pytest.raises(ValueError, match="unknown: \\['nope'\\]"):
    TransformerLanguageModelFamily(activations=("gelu", "nope"))
  with pytest.raises(ValueError, match="divisible by num_heads"):
    language.transformer_lm_forward(10, 8, model_size=30, num_heads=4)
  odd = hk.transform(lambda x: hk.get_parameter("gain", [3], init=jnp.ones) * x)
  with pytest.raises(ValueError, match="no rule for a parameter called 'gain'"):
    init_from_one_draw(odd, jax.random.key(0), jnp.ones(3))
  with pytest.raises(ValueError, match="pixels in \\[0, 1\\]"):
    autoencoder.VAETask(datasets=fashion_mnist_datasets(128, 8, normalization="centered"))
