"""The library's defaults never contradict `Recipe`'s (issue 63).

Where the library (`TruncatedStep`, `make_estimator`, the estimators, `MetaTrainer`) and `Recipe` default the same
argument, the value is the same and checked here; where a default differs on purpose (documented in the docstrings
of `Recipe` and of the library object) the relation is pinned here, so neither side drifts silently.
"""

import dataclasses
import inspect

import optax

from metafam.inner import ConstantSchedule, LogUniformSchedule, TruncatedStep
from metafam.optimizers.registry import get_learned_optimizer
from metafam.outer_trainers import MetaTrainer, make_estimator
from metafam.outer_trainers import PES, FullES, NoiseReuseES, TruncatedBPTT, TruncatedES
from metafam.runs.recipe_flags import MAIN_JOB_FAMILY, main_job
from metafam.runs.recipes import Recipe
from metafam.taskfamilies.registry import get_family
from metafam.taskfamilies.spec import FamilySpec

RECIPE = {f.name: f.default for f in dataclasses.fields(Recipe)}
ESTIMATORS = (TruncatedBPTT, FullES, TruncatedES, PES, NoiseReuseES)


def _defaults(fn):
  return {p.name: p.default for p in inspect.signature(fn).parameters.values() if p.default is not p.empty}


def _recipe(**changes):
  return Recipe(name="defaults", optimizer="adafac_muon_mlp_lopt", step_mult=1e-2,
                families=(FamilySpec("registered", {"name": MAIN_JOB_FAMILY}),), **changes)


def test_the_defaults_both_have_are_equal():
  for cls in ESTIMATORS:
    defaults = _defaults(cls)
    if "unroll_length" in defaults:
      assert defaults["unroll_length"] == RECIPE["unroll_length"], cls
    if cls is not TruncatedBPTT:
      assert (defaults["sigma"], defaults["perturbation"], defaults["rank"]) == (
          RECIPE["sigma"], RECIPE["perturbation"], RECIPE["perturbation_rank"]), cls
  assert _defaults(make_estimator)["num_tasks"] == RECIPE["num_tasks"]


def _same_estimator(a, b):
  assert type(a) is type(b)
  for name in ("num_tasks", "num_tasks", "unroll_length", "trajectory_length", "sigma", "perturbation", "rank",
               "loss_kind", "loss_type", "clip_loss_diff", "resample_every"):
    assert getattr(a, name, None) == getattr(b, name, None), name
  for name in ("num_tasks", "schedule", "random_initial_iteration", "meta_loss_split", "stack_antithetic"):
    assert getattr(a.step, name, None) == getattr(b.step, name, None), name


def test_a_default_recipe_builds_the_estimator_make_estimator_builds_by_default():
  """`Recipe` builds its estimators with `make_estimator`; with the recipe's defaults and a constant trajectory
  length of 200 (`make_estimator`'s and `FullES`'s default, see below) the estimator is `make_estimator`'s default
  one: same pairs, truncation, noise, loss, staggering and meta-loss split."""
  family, lopt = get_family(MAIN_JOB_FAMILY), get_learned_optimizer("adafac_muon_mlp_lopt", step_mult=1e-2)
  for name in ("nres", "pes", "full_es", "tbptt"):
    recipe = _recipe(estimator=name, trajectory_lengths=(200, 200))
    (built,) = recipe.build_estimators(lopt, families=[family])
    _same_estimator(built, make_estimator(name, family, lopt))


def test_the_defaults_that_differ_on_purpose():
  """Pinned: the documented differences (`Recipe`'s docstring, "Defaults")."""
  # Trajectory lengths: the library defaults to one constant length, 200, the main job's (FullES, which runs whole
  # trajectories of one length, and make_estimator's schedule); Recipe's default range is the generalist's.
  assert _defaults(FullES)["trajectory_length"] == 200 == main_job().trajectory_lengths[0]
  assert main_job().trajectory_lengths == (200, 200)
  assert RECIPE["trajectory_lengths"] == (100, 2000)
  assert _recipe().schedule() == LogUniformSchedule(100, 2000)
  assert _recipe(trajectory_lengths=(200, 200)).schedule() == ConstantSchedule(200)
  # A recipe with a range gives full_es no trajectory_length: FullES's own default applies.
  family, lopt = get_family(MAIN_JOB_FAMILY), get_learned_optimizer("adafac_muon_mlp_lopt", step_mult=1e-2)
  (full_es,) = _recipe(estimator="full_es").build_estimators(lopt, families=[family])
  assert full_es.trajectory_length == 200
  # TruncatedStep is the bare inner loop: a short constant truncation, unstaggered lanes, the train batch as the
  # meta-loss data. make_estimator (and so every Recipe) builds meta-training's step instead.
  step = TruncatedStep(family, lopt, 2)
  assert (step.schedule, step.random_initial_iteration, step.meta_loss_split) == (
      ConstantSchedule(50), False, "same_batch")
  est = make_estimator("pes", family, lopt)
  assert (est.step.schedule, est.step.random_initial_iteration, est.step.meta_loss_split) == (
      ConstantSchedule(200), True, "outer_valid")
  # MetaTrainer applies no clipping unless asked; Recipe clips the meta-gradient to norm 1 (0: none).
  assert _defaults(MetaTrainer)["clip_grad_norm"] is None and RECIPE["clip_grad_norm"] == 1.0
  trainer = MetaTrainer(lopt, [est], optax.adam(1e-3))
  assert trainer.clip_grad_norm is None
  # The main job sets its own truncation, length and schedule (recipe_flags.main_job), nothing else.
  job = main_job()
  changed = {f.name for f in dataclasses.fields(Recipe) if getattr(job, f.name) != RECIPE[f.name]
             and f.default is not dataclasses.MISSING}
  assert changed == {"unroll_length", "trajectory_lengths", "meta_lr_decay_steps", "num_steps"}
