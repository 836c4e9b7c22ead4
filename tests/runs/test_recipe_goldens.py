"""The main job's and every shipped recipe's first meta-steps, and the main job's summary.json (all but the fields
issue 61 redefined), are bit-identical to those recorded before issue 63's refactors: tests/recipe_goldens.py."""

import json

import pytest

import recipe_goldens as G
from production_run import run_production



def test_every_shipped_recipe_has_a_record():
  from metafam.runs.recipes import RECIPES
  assert set(RECIPES) | {"main_job"} == set(G.RUNS)
  with open(G.GOLDENS) as f:
    record = json.load(f)
  assert set(record) == set(G.RUNS)
  for name, (_, steps) in G.RUNS.items():
    assert len(record[name]["meta_loss_values"]) == steps and len(record[name]) > 10, name
  with open(G.SUMMARY_GOLDEN) as f:
    summary = json.load(f)
  assert summary["meta_steps"] == G.SUMMARY_STEPS and summary["eval/tasks"] == 16
  assert set(summary) == set(G.summary_fields(_nest(summary)))  # every field recorded, and nothing else
  assert {k.split("/")[2] for k in summary if k.startswith("eval/learned/")} == {"learned (init)", "learned (final)"}


def _nest(flat):
  """The nested summary.json content that `summary_fields` flattens to ``flat``."""
  out = {}
  for key, value in flat.items():
    *parents, last = key.split("/")
    node = out
    for p in parents:
      node = node.setdefault(p, {})
    node[last] = value
  return out


@pytest.mark.slow  # three meta-training runs from the command line, compiled as in production (a few minutes)
def test_the_first_meta_steps_are_bit_identical():
  """In a child process with JAX's default config and production XLA flags (the records' conditions)."""
  run_production("recipe_goldens.py", "--check", timeout=3000)
