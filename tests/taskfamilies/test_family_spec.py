"""FamilySpec (plain-data family configs) and FamilyMixture (host-side choice among families)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.taskfamilies import augmentations as faug
from metafam.taskfamilies.base import TaskFamily, check_family
from metafam.taskfamilies.image_mlp import ImageMLPFamily
from metafam.taskfamilies.quadratic import NoisyQuadraticFamily, QuadraticFamily
from metafam.taskfamilies.registry import AUGMENTATIONS, FAMILY_KINDS, LazyConstructor
from metafam.taskfamilies.spec import FamilyMixture, FamilySpec

MLP_KWARGS = {"hidden_sizes": (8,), "image_size": 8, "batch_size": 16, "activations": ["relu", "tanh"]}


def test_json_round_trip_and_canonical_form():
  spec = (FamilySpec("image_mlp", MLP_KWARGS)
          .augment("reparam", log_scale_range=[-1.0, 1.0], per_leaf=True)
          .augment("low_precision"))
  assert spec.kwargs["activations"] == ("relu", "tanh")  # lists are stored as tuples
  assert spec.augmentations == (("reparam", {"log_scale_range": (-1.0, 1.0), "per_leaf": True}),
                                ("low_precision", {}))
  text = spec.to_json()
  assert json.loads(text) == {"kind": "image_mlp",
                              "kwargs": {"hidden_sizes": [8], "image_size": 8, "batch_size": 16,
                                         "activations": ["relu", "tanh"]},
                              "augmentations": [["reparam", {"log_scale_range": [-1.0, 1.0], "per_leaf": True}],
                                                ["low_precision", {}]]}
  back = FamilySpec.from_json(text)
  assert back == spec and hash(back) == hash(spec) and back.to_json() == text
  assert FamilySpec.from_dict(spec.to_dict()) == spec
  assert "image_mlp" in str(spec) and "low_precision" in str(spec)
  assert FamilySpec("quadratic", {}, ["reparam"]).augmentations == (("reparam", {}),)  # bare names allowed
  assert FamilySpec("quadratic", {"dim": np.int64(3)}).kwargs["dim"] == 3  # numpy scalars unboxed


def test_build_applies_kwargs_and_augmentations_in_order():
  spec = FamilySpec("image_mlp", MLP_KWARGS).augment("reparam", log_scale_range=(-1.0, 1.0)).augment("loss_scale")
  family = spec.build()
  assert isinstance(family, faug.LossScaleFamily) and isinstance(family.family, faug.ReparamFamily)
  inner = family.family.family
  assert isinstance(inner, ImageMLPFamily)
  assert inner.hidden_sizes == (8,) and inner.activations == ("relu", "tanh")
  assert inner.datasets.abstract_batch["image"].shape == (16, 8, 8, 1)
  assert family.family.log_scale_range == (-1.0, 1.0)
  assert set(family.sample(jax.random.key(0))) == {"inner", "log_loss_scale"}
  built = FamilySpec("noisy_quadratic", {"dim": 3, "noise_std": 0.2, "batch_size": 4}).build()
  assert isinstance(built, NoisyQuadraticFamily) and built.dim == 3 and built.noise_std == 0.2
  one_task = FamilySpec("task", {"name": "quadratic_10"}).build()
  assert one_task.task_fn(one_task.sample(jax.random.key(0))).name == "Quadratic10"
  assert isinstance(FamilySpec("registered", {"name": "quadratic_family_10"}).build(), QuadraticFamily)


def test_every_kind_and_augmentation_resolves_to_a_class():
  for table in (FAMILY_KINDS, AUGMENTATIONS):
    for name, ctor in table.items():
      target = ctor.load() if isinstance(ctor, LazyConstructor) else ctor
      assert callable(target), name
  assert {"quadratic", "noisy_quadratic", "image_mlp", "conv", "autoencoder", "lstm_lm", "transformer_lm"} <= set(
      FAMILY_KINDS)
  assert issubclass(FAMILY_KINDS["conv"].load(), TaskFamily)


def test_built_augmented_spec_passes_check_family():
  spec = FamilySpec("noisy_quadratic", {"dim": 3, "batch_size": 4, "scale_range": (0.5, 2.0)})
  for name in ("reparam", "loss_scale", "noisy_gradients", "clip_gradients"):
    spec = spec.augment(name)
  spec = spec.augment("reduced_batch_size", batch_size=2)
  check_family(FamilySpec.from_json(spec.to_json()).build(), jax.random.key(0), num_samples=2)


def test_clear_errors():
  with pytest.raises(ValueError, match=r"unknown family kind 'mlp'; valid names: .*image_mlp.*quadratic"):
    FamilySpec("mlp").build()
  with pytest.raises(ValueError, match=r"family kind 'quadratic' got unknown kwargs \['size'\]; accepted kwargs: dim, "
                                       r"target_std, scale_range"):
    FamilySpec("quadratic", {"size": 3}).build()
  with pytest.raises(ValueError, match=r"unknown augmentation 'rescale'; valid names: .*reparam"):
    FamilySpec("quadratic").augment("rescale").build()
  with pytest.raises(ValueError, match=r"augmentation 'reparam' got unknown kwargs \['scale'\]; accepted kwargs: "
                                       r"log_scale_range, per_leaf"):
    FamilySpec("quadratic").augment("reparam", scale=2.0).build()
  with pytest.raises(ValueError, match=r"building family kind 'quadratic' with kwargs .*dim must be a positive int"):
    FamilySpec("quadratic", {"dim": 0}).build()
  with pytest.raises(TypeError, match="must be plain data"):
    FamilySpec("quadratic", {"target_std": jnp.ones(())})
  with pytest.raises(TypeError, match="a name or a \\(name, kwargs\\) pair"):
    FamilySpec("quadratic", {}, (("reparam", {}, "extra"),))
  with pytest.raises(ValueError, match="needs 'kind'"):
    FamilySpec.from_dict({"kwargs": {}})
  custom = {"tiny": lambda dim=2: QuadraticFamily(dim)}
  assert FamilySpec("tiny", {"dim": 5}).build(kinds=custom).dim == 5


def test_mixture_frequencies_match_weights_and_are_deterministic():
  specs = [FamilySpec("quadratic", {"dim": d}) for d in (2, 3, 4, 5)]
  weights = [0.5, 0.0, 0.3, 0.2]
  mixture = FamilyMixture(specs, weights)
  assert len(mixture) == 4 and [f.dim for f in mixture.families] == [2, 3, 4, 5]
  n = 20000
  stream = mixture.indices(seed=7)
  draws = np.array([next(stream) for _ in range(n)])
  freq = np.bincount(draws, minlength=4) / n
  # Binomial standard error sqrt(w (1 - w) / n) <= 0.0036; allow 5 standard errors. Zero weight is never drawn.
  np.testing.assert_allclose(freq, weights, atol=5 * np.sqrt(0.25 / n))
  assert freq[1] == 0.0
  again = mixture.indices(seed=7)
  np.testing.assert_array_equal([next(again) for _ in range(100)], draws[:100])
  assert mixture.sample_family(3) == mixture.sample_family(3)
  rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
  assert [mixture.sample_family(rng_a) for _ in range(20)] == [mixture.sample_family(rng_b) for _ in range(20)]
  key = jax.random.key(0)
  assert mixture.sample_family(key) == mixture.sample_family(key)
  key_draws = np.array([mixture.sample_family(k) for k in jax.random.split(jax.random.key(1), 400)])
  assert set(key_draws) == {0, 2, 3} and abs(np.mean(key_draws == 0) - 0.5) < 5 * np.sqrt(0.25 / 400)
  # The CDF boundaries: u in [0, 0.5) -> 0, [0.5, 0.8) -> 2, [0.8, 1) -> 3.
  assert [mixture.index_from_uniform(u) for u in (0.0, 0.49, 0.5, 0.79, 0.8, 0.999999)] == [0, 0, 2, 2, 3, 3]


def test_mixture_runs_each_family_as_its_own_program():
  quad = QuadraticFamily(3)
  mixture = FamilyMixture([quad, {"kind": "quadratic", "kwargs": {"dim": 5}}])  # uniform weights
  np.testing.assert_allclose(mixture.weights, [0.5, 0.5])
  assert mixture[0] is quad and mixture.specs[0] is None and mixture.specs[1] == FamilySpec("quadratic", {"dim": 5})
  programs = {}
  seen = []
  for i, key in zip(mixture.indices(seed=0), jax.random.split(jax.random.key(0), 6)):
    family = mixture[i]
    if i not in programs:
      programs[i] = jax.jit(jax.vmap(lambda k, f=family: f.task_fn(f.sample(k)).loss(jnp.zeros(f.dim), k, None)))
    losses = programs[i](jax.random.split(key, 4))
    assert losses.shape == (4,) and bool(jnp.all(losses > 0))
    seen.append(i)
  assert set(seen) == {0, 1}
  assert "QuadraticFamily3: 0.5" in repr(mixture)
  with pytest.raises(ValueError, match="nonnegative"):
    FamilyMixture([quad, quad], [1.0, -1.0])
  with pytest.raises(ValueError, match="not all zero"):
    FamilyMixture([quad], [0.0])
  with pytest.raises(ValueError, match="2 finite"):
    FamilyMixture([quad, quad], [1.0])
  with pytest.raises(TypeError, match="must be a FamilySpec"):
    FamilyMixture(["quadratic"])
