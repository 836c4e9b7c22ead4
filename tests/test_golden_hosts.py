"""Per-host golden records (tests/golden_hosts.py): every host record is complete and filed under its host's key, and
the comparisons accept cross-host rounding and reject a change to what is computed. The checks themselves, run as
production runs them, are the slow tests of tests/optimizers/test_lopt_contract.py and
tests/runs/test_recipe_goldens.py."""

import json
import os

import numpy as np
import pytest

import golden_hosts as H
import lopt_goldens
import recipe_goldens

HOST_DIRS = sorted(os.path.join(H.DATA, "hosts", d) for d in os.listdir(os.path.join(H.DATA, "hosts")))


def test_the_host_key_is_the_hash_of_the_description_and_moves_with_any_part():
  description = H.host()
  assert H.host_key() == H.host_key(description) and len(H.host_key()) == 12
  int(H.host_key(), 16)
  for change in ({"cpu_count": 64}, {"jaxlib": "0.0.0"},
                 {"cpu": dict(description["cpu"], flags=description["cpu"]["flags"] + ["amx_tile"])}):
    assert H.host_key(dict(description, **change)) != H.host_key(description), change


def test_a_record_of_a_host_is_complete_and_filed_under_its_key():
  assert HOST_DIRS, "no host has a record of its own"
  reference = np.load(lopt_goldens.GOLDENS)
  with open(recipe_goldens.GOLDENS) as f:
    recipes = json.load(f)
  with open(recipe_goldens.SUMMARY_GOLDEN) as f:
    summary = json.load(f)
  for d in HOST_DIRS:
    with open(os.path.join(d, "host.json")) as f:
      made = json.load(f)
    assert os.path.basename(d) == H.host_key(made["host"]), d  # the key of the host it describes
    assert made["commit"] and made["how"]
    own = np.load(os.path.join(d, lopt_goldens.NAME))
    assert set(own.files) == set(reference.files), d
    assert os.path.getsize(os.path.join(d, lopt_goldens.NAME)) < 200_000
    with open(os.path.join(d, recipe_goldens.NAME)) as f:
      own_recipes = json.load(f)
    assert {r: set(v) for r, v in own_recipes.items()} == {r: set(v) for r, v in recipes.items()}, d
    with open(os.path.join(d, recipe_goldens.SUMMARY_NAME)) as f:
      own_summary = json.load(f)
    assert set(own_summary) == set(summary), d
    assert recipe_goldens.compare(own_recipes, recipes, own_summary, summary, exact=False)[0] == [], d
    # Another host's numbers: equal to the reference's, or within the cross-host tolerance of them.
    largest = max(lopt_goldens.relative_differences({k: own[k] for k in own.files}, reference).values())
    assert largest <= H.RTOL, (d, largest)


def test_relative_difference_is_at_the_scale_of_the_expected_array():
  want = np.array([[1.0, -4.0], [0.5, 2.0]], np.float32)
  assert H.relative_difference(want, want) == 0.0
  assert H.relative_difference(want + np.float32(4e-3), want) == pytest.approx(1e-3, rel=1e-3)
  assert H.relative_difference(want[:1], want) == np.inf  # another shape
  assert H.relative_difference([np.nan, 1.0], [np.nan, 1.0]) == 0.0  # non-finite where expected, matched
  assert H.relative_difference([np.nan, 1.0], [0.0, 1.0]) == np.inf
  assert H.relative_difference([np.inf], [-np.inf]) == np.inf
  assert H.relative_difference([0.0, 0.0], [0.0, 0.0]) == 0.0


def test_close_accepts_cross_host_rounding_and_rejects_a_changed_computation():
  rng = np.random.default_rng(0)
  want = rng.standard_normal((3, 40)).astype(np.float32)
  rounding = want + np.float32(2.4e-7) * np.sign(rng.standard_normal(want.shape)).astype(np.float32)
  assert H.close(rounding, want)
  assert not H.close(want * np.float32(1.001), want)  # e.g. a decay of 0.999 instead of 0.998 somewhere upstream
  assert not H.close(want[:, :39], want)


def test_lopt_differences_are_bit_for_bit_and_name_each_array(tmp_path):
  got = {"registry/a/params": np.ones((3, 4), np.float32), "registry/a/optax": np.zeros((3, 4), np.float32)}
  np.savez(tmp_path / "same.npz", **got)
  assert lopt_goldens.differences(got, np.load(tmp_path / "same.npz")) == []
  moved = dict(got)
  moved["registry/a/params"] = np.nextafter(got["registry/a/params"], np.float32(2))
  np.savez(tmp_path / "moved.npz", **moved, **{"registry/b/params": np.ones(2, np.float32)})
  lines = lopt_goldens.differences(got, np.load(tmp_path / "moved.npz"))
  assert len(lines) == 2 and lines[0].startswith("registry/a/params: max |difference| 1.19e-07")
  assert lines[1] == "registry/b: recorded, no longer run"


def test_recipe_compare_exact_and_within_tolerance():
  want = {"run": {"leaf_0": "float32 3 abc", "meta_loss_values": [0.5, 0.4]}}
  summary = {"eval/family": "fmnist", "eval/adam/final_loss": 0.37, "eval/adam/final_loss_per_instance": [0.3, 0.44]}
  assert recipe_goldens.compare(want, want, summary, summary, exact=True) == ([], 0.0)
  rounded = {"run": {"leaf_0": "float32 3 abd", "meta_loss_values": [0.5, 0.4 + 1e-7]}}
  rounded_summary = dict(summary, **{"eval/adam/final_loss": 0.37 * (1 + 3e-7)})
  bad, _ = recipe_goldens.compare(rounded, want, rounded_summary, summary, exact=True)
  assert bad[:2] == ["differs: run/leaf_0", "differs: run/meta_loss_values"] and len(bad) == 3
  assert bad[2] == f"summary.json differs: eval/adam/final_loss: 0.37 != {0.37 * (1 + 3e-7)!r}"
  bad, largest = recipe_goldens.compare(rounded, want, rounded_summary, summary, exact=False)
  assert bad == [] and 1e-7 < largest < 1e-6  # fingerprints are not compared on a host without a record
  for changed in ({"eval/family": "mnist"}, {"eval/adam/final_loss_per_instance": [0.3, 0.441]}):
    bad, _ = recipe_goldens.compare(want, want, dict(summary, **changed), summary, exact=False)
    assert len(bad) == 1, changed
  bad, _ = recipe_goldens.compare({"run": {"leaf_0": "x", "meta_loss_values": [0.5, 0.41]}}, want, summary, summary,
                                  exact=False)
  assert len(bad) == 1 and bad[0].startswith("largest difference 0.02")
  bad, _ = recipe_goldens.compare({"run": {"meta_loss_values": [0.5, 0.4]}}, want, summary, summary, exact=False)
  assert bad == ["differs: run/leaf_0"]  # a missing array is a difference everywhere
