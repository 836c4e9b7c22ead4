"""``metafam meta-train``'s flags as a `Recipe`, and the recipe their defaults come from.

`main_job` is the recipe the command runs with no flags (the README's main job); the defaults of the meta-train
flags that describe a run are read from it (`flag_defaults`), so the command line and the recipe cannot disagree.
`recipe_from_flags` builds the one-family recipe of the flags (`FLAG_KEYS`), `recipe_from_command` the recipe of a
whole command line (``--recipe`` with the given flags applied, errors naming the flags).
"""

from __future__ import annotations

from typing import Any, Collection, Dict, Mapping, Optional

from metafam.runs.recipes import Recipe, load_recipe
from metafam.taskfamilies.spec import FamilySpec

MAIN_JOB_FAMILY = "fmnist_mlp_family_8x8_32"


def main_job() -> Recipe:
  """The recipe of ``metafam meta-train`` with no flags: `Recipe`'s defaults except a shorter truncation (10 inner
  steps), a constant trajectory length of 200, 6000 meta-steps and a meta-learning rate decayed over them, for
  ``adafac_muon_mlp_lopt`` (``step_mult`` 1e-2) on the 8x8 Fashion-MNIST MLP family."""
  return Recipe(name=MAIN_JOB_FAMILY, optimizer="adafac_muon_mlp_lopt", step_mult=1e-2,
                families=(FamilySpec("registered", {"name": MAIN_JOB_FAMILY}),), unroll_length=10,
                trajectory_lengths=(200, 200), meta_lr_decay_steps=6000, num_steps=6000)


def flag_defaults(recipe: Recipe) -> Dict[str, Any]:
  """The values of meta-train's run flags (`FLAG_KEYS`, ``perturbation``, ``perturbation_rank``, ``num_steps``)
  that describe the one-family ``recipe`` with a constant trajectory length: the inverse of `recipe_from_flags`."""
  (family,), (low, high) = recipe.families, recipe.trajectory_lengths
  if family.kind != "registered" or low != high:
    raise ValueError(f"recipe {recipe.name!r} is not one that meta-train's flags describe (one registered family, "
                     "a constant trajectory length).")
  values = {name: getattr(recipe, name) for name in FLAG_KEYS + ("perturbation", "perturbation_rank", "num_steps")
            if name not in ("family", "trajectory_length")}
  return dict(values, family=family.kwargs["name"], trajectory_length=low)


# The flags of `metafam meta-train` that describe the run (and, with the seed, the config of checkpoints written by
# metafam before recipes described every run).
FLAG_KEYS = ("family", "optimizer", "estimator", "num_tasks", "unroll_length", "trajectory_length", "sigma",
             "meta_learning_rate", "meta_lr_decay_steps", "clip_grad_norm", "step_mult")


def recipe_from_flags(values: Mapping[str, Any]) -> Recipe:
  """The one-family recipe of meta-train's flags (``FLAG_KEYS``, optionally ``perturbation``,
  ``perturbation_rank`` and ``num_steps``): the registered family, a constant trajectory length, and ``step_mult``
  only for an optimizer that has one."""
  from metafam.optimizers.registry import takes_step_mult
  perturbation = values.get("perturbation") or "full"
  extra = {"num_steps": values["num_steps"]} if values.get("num_steps") is not None else {}
  return Recipe(name=values["family"], optimizer=values["optimizer"],
                step_mult=values["step_mult"] if takes_step_mult(values["optimizer"]) else None,
                families=(FamilySpec("registered", {"name": values["family"]}),), estimator=values["estimator"],
                num_tasks=values["num_tasks"], unroll_length=values["unroll_length"],
                trajectory_lengths=(values["trajectory_length"],) * 2, sigma=values["sigma"],
                perturbation=perturbation,
                perturbation_rank=values.get("perturbation_rank") or 1 if perturbation != "full" else 1,
                meta_learning_rate=values["meta_learning_rate"], meta_lr_decay_steps=values["meta_lr_decay_steps"],
                clip_grad_norm=values["clip_grad_norm"], **extra)


# What ``--recipe`` sets and a flag may not (the recipe's families replace --family), and what a given flag overrides.
RECIPE_EXCLUDES = ("family", "optimizer", "estimator", "trajectory_length")
RECIPE_OVERRIDES = ("num_steps", "num_tasks", "unroll_length", "sigma", "step_mult", "meta_learning_rate",
                    "meta_lr_decay_steps", "clip_grad_norm", "perturbation", "perturbation_rank")


def recipe_from_command(values: Mapping[str, Any], given: Collection[str], resumed: Optional[str] = None) -> Recipe:
  """The `Recipe` that ``metafam meta-train``'s flags describe.

  ``values`` maps the command's flag names to their values and ``given`` names the flags set on the command line.
  With ``values["recipe"]``, that recipe (`load_recipe`) with the given `RECIPE_OVERRIDES` applied; otherwise the
  one-family recipe of the flags (`recipe_from_flags`). Unless ``meta_lr_decay_steps`` is given, it follows
  ``num_steps``: the flags' recipe decays over its ``num_steps``, and a recipe whose schedule decays (not 0) over the
  given ``--num_steps`` (else over its own). Raises ValueError naming the flag (an `UnknownNameError` listing the
  registered names for an unknown family, optimizer or estimator) before anything is built. With ``resumed`` (the
  run directory) a checkpoint there gives the decay when it is not given: a resumed run keeps its schedule.
  """
  if "meta_lr_decay_steps" not in given and resumed is not None:
    from metafam.runs.run_dir import recorded_decay_steps
    stored = recorded_decay_steps(resumed)
    if stored is not None:
      values, given = dict(values, meta_lr_decay_steps=stored), set(given) | {"meta_lr_decay_steps"}
  from metafam._registry import lookup
  from metafam.optimizers.registry import LEARNED_OPTIMIZERS, takes_step_mult
  from metafam.outer_trainers.registry import ESTIMATORS
  from metafam.taskfamilies.registry import FAMILIES
  path = values.get("recipe")
  if path is not None:
    excluded = [f"--{name}" for name in RECIPE_EXCLUDES if name in given]
    if excluded:
      raise ValueError(f"--recipe sets the learned optimizer, families, estimator and trajectory lengths; remove "
                       f"{', '.join(excluded)} (or edit a copy of the recipe file).")
    try:
      recipe = load_recipe(path)
    except ValueError as e:
      raise ValueError(f"--recipe {path}: {e}") from None
    estimator = recipe.estimator
  else:
    lookup(FAMILIES, values["family"], "family")
    lookup(LEARNED_OPTIMIZERS, values["optimizer"], "learned optimizer (--optimizer)")
    lookup(ESTIMATORS, values["estimator"], "estimator")
    estimator = values["estimator"]
  if values["perturbation"] != "full" and estimator == "tbptt":
    raise ValueError("--perturbation low_rank: --estimator tbptt perturbs nothing; use an ES estimator.")
  if "perturbation_rank" in given and values["perturbation"] == "full":
    raise ValueError("--perturbation_rank applies to --perturbation low_rank.")
  if "step_mult" in given and path is None and not takes_step_mult(values["optimizer"]):
    raise ValueError(f"--step_mult: --optimizer={values['optimizer']} has no step_mult; it applies to "
                     f"{', '.join(n for n in sorted(LEARNED_OPTIMIZERS) if takes_step_mult(n))}.")
  follows = "meta_lr_decay_steps" not in given
  try:
    if path is not None:
      changes = {name: values[name] for name in RECIPE_OVERRIDES if name in given}
      if follows and "num_steps" in given and recipe.meta_lr_decay_steps > 0:
        changes["meta_lr_decay_steps"] = values["num_steps"]
      return recipe.replace(**changes)
    return recipe_from_flags(dict(values, meta_lr_decay_steps=values["num_steps"]) if follows else values)
  except ValueError as e:
    raise ValueError(f"--recipe {path}: {e}" if path else str(e)) from None


def lane_split_error(recipe: Recipe, devices: int) -> Optional[str]:
  """The library's rule (the lanes divide evenly over the devices) in the flags' names, or None when it holds."""
  one_per_task = recipe.estimator in ("tbptt", "truncated_es")  # truncated_es also runs num_tasks plain lanes
  lanes = recipe.num_tasks * (1 if one_per_task else 2)
  if lanes % devices == 0:
    return None
  per = "one lane per task" if recipe.estimator == "tbptt" else (
      "its unperturbed lanes, one per task" if one_per_task else "an antithetic pair of lanes per task")
  return (f"--devices {devices}: --num_tasks {recipe.num_tasks} gives {lanes} lanes ({per} for --estimator "
          f"{recipe.estimator}), which cannot be split evenly over {devices} devices; use a --num_tasks that makes "
          f"them a multiple of {devices}.")
