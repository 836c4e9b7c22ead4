"""Meta-training recipes: a whole meta-training run as data (learned optimizer, families, estimator, meta-optimizer).

A `Recipe` names a registered learned optimizer and its ``step_mult``, a mixture of task families (`FamilySpec`s:
each family gets its own estimator, and a meta-step averages their meta-gradients, so families of different shapes
share one theta), the estimator and its truncations, and the meta-optimizer. Recipes are JSON files; the shipped
ones live in ``metafam/outer_trainers/recipes/`` and are named in `RECIPES`:

    recipe = load_recipe("generalist")                 # or load_recipe("path/to/my_recipe.json")
    lopt, trainer = recipe.build(eval_num_tasks=16, eval_steps=200)
    state, history = trainer.train(recipe.num_steps, key=jax.random.key(0), output_dir="runs/generalist")

``metafam meta-train --recipe generalist`` runs the same thing from the command line, checkpointed and resumable
(its run configuration holds the recipe, so resuming with another one is refused).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from metafam._checks import check_positive_int
from metafam.taskfamilies.spec import FamilySpec

_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes")

# Shipped recipes: name -> file in metafam/outer_trainers/recipes/.
RECIPES: Dict[str, str] = {
    "generalist": "generalist.json",  # the pretrained `generalist_v1` (metafam.pretrained): 5 families, NRES
}


@dataclasses.dataclass(frozen=True)
class Recipe:
  """One meta-training run as data (see the module docstring). Values are checked on construction.

  Attributes:
    name: the recipe's name (recorded in checkpoints).
    optimizer: a registered learned optimizer (`metafam.optimizers.registry.LEARNED_OPTIMIZERS`).
    step_mult: its ``step_mult`` (for a unit-RMS optimizer: the learning rate during meta-training).
    families: the mixture, one `FamilySpec` each (at least one).
    estimator: a registered estimator name ("nres", "pes", ...).
    num_pairs: antithetic pairs (lanes for "tbptt") per family.
    unroll_length: inner steps per truncation.
    trajectory_lengths: ``(low, high)``: trajectory lengths are log-uniform in this range (`LogUniformSchedule`).
    sigma: the ES perturbation's standard deviation.
    meta_learning_rate, meta_lr_decay_steps, clip_grad_norm: the meta-optimizer (`meta_optimizer`; clip 0: none).
    num_steps: meta-steps of the run.
    description: what the recipe is for, in words.
  """
  name: str
  optimizer: str
  step_mult: float
  families: Tuple[FamilySpec, ...]
  estimator: str = "nres"
  num_pairs: int = 8
  unroll_length: int = 20
  trajectory_lengths: Tuple[int, int] = (100, 2000)
  sigma: float = 0.01
  meta_learning_rate: float = 3e-3
  meta_lr_decay_steps: int = 0
  clip_grad_norm: float = 1.0
  num_steps: int = 1000
  description: str = ""

  def __post_init__(self):
    from metafam.inner.schedules import LogUniformSchedule
    from metafam.optimizers.base import check_number
    from metafam.optimizers.registry import LEARNED_OPTIMIZERS
    from metafam.outer_trainers.registry import ESTIMATORS
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"Recipe.name must be a non-empty string, got {self.name!r}.")
    if self.optimizer not in LEARNED_OPTIMIZERS:
      raise ValueError(f"Recipe.optimizer {self.optimizer!r} is not a registered learned optimizer; registered: "
                       f"{', '.join(sorted(LEARNED_OPTIMIZERS))}.")
    if self.estimator not in ESTIMATORS:
      raise ValueError(f"Recipe.estimator {self.estimator!r} is not one of {', '.join(sorted(ESTIMATORS))}.")
    families = tuple(f if isinstance(f, FamilySpec) else FamilySpec.from_dict(f) for f in self.families)
    if not families:
      raise ValueError("Recipe.families must name at least one family.")
    object.__setattr__(self, "families", families)
    for field in ("num_pairs", "unroll_length", "num_steps"):
      check_positive_int(f"Recipe.{field}", getattr(self, field))
    check_number("Recipe.meta_lr_decay_steps", self.meta_lr_decay_steps, low=0, integer=True)
    for field in ("step_mult", "sigma", "meta_learning_rate"):
      check_number(f"Recipe.{field}", getattr(self, field), low=0.0, low_open=True)
    check_number("Recipe.clip_grad_norm", self.clip_grad_norm, low=0.0)
    lengths = tuple(self.trajectory_lengths)
    if len(lengths) != 2:
      raise ValueError(f"Recipe.trajectory_lengths must be (low, high), got {self.trajectory_lengths!r}.")
    LogUniformSchedule(*lengths)  # checks 1 <= low <= high, ints
    object.__setattr__(self, "trajectory_lengths", lengths)

  # -- data ---------------------------------------------------------------------------------------------------
  def to_dict(self) -> Dict[str, Any]:
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out["families"] = [f.to_dict() for f in self.families]
    out["trajectory_lengths"] = list(self.trajectory_lengths)
    return out

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> "Recipe":
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
      raise ValueError(f"unknown recipe keys {unknown}; a recipe has {', '.join(sorted(fields))}.")
    data = dict(data)
    data["families"] = tuple(FamilySpec.from_dict(f) for f in data.get("families", ()))
    return cls(**data)

  def replace(self, **changes: Any) -> "Recipe":
    return dataclasses.replace(self, **changes)

  # -- building -----------------------------------------------------------------------------------------------
  def build_learned_optimizer(self):
    from metafam.optimizers.registry import get_learned_optimizer
    return get_learned_optimizer(self.optimizer, step_mult=self.step_mult)

  def build_estimators(self, lopt, devices: Any = None, perturbation: str = "full", rank: int = 1) -> list:
    """One estimator per family, in the order of ``families``."""
    from metafam.inner.schedules import LogUniformSchedule
    from metafam.outer_trainers.registry import estimator_arguments, make_estimator
    values = dict(unroll_length=self.unroll_length, sigma=self.sigma, perturbation=perturbation, rank=rank)
    accepted = estimator_arguments(self.estimator)
    kwargs = {k: v for k, v in values.items() if k in accepted}
    schedule = LogUniformSchedule(*self.trajectory_lengths)
    return [make_estimator(self.estimator, spec.build(), lopt, num_tasks=self.num_pairs, schedule=schedule,
                           devices=devices, **kwargs) for spec in self.families]

  def build(self, *, devices: Any = None, perturbation: str = "full", rank: int = 1, eval_num_tasks: int = 16,
            eval_steps: int = 200, config: Optional[Dict[str, Any]] = None):
    """``(learned optimizer, MetaTrainer)``; the trainer evaluates on the first family."""
    from metafam.outer_trainers.meta_trainer import MetaTrainer, meta_optimizer
    lopt = self.build_learned_optimizer()
    estimators = self.build_estimators(lopt, devices=devices, perturbation=perturbation, rank=rank)
    config = dict({"recipe": self.to_dict()} if config is None else config)
    trainer = MetaTrainer(lopt, estimators, meta_optimizer(self.meta_learning_rate, self.meta_lr_decay_steps),
                          clip_grad_norm=self.clip_grad_norm or None, eval_family=self.families[0].build(),
                          eval_num_tasks=eval_num_tasks, eval_steps=eval_steps, config=config)
    return lopt, trainer


def list_recipes():
  return sorted(RECIPES)


def load_recipe(name_or_path: str) -> Recipe:
  """The shipped recipe ``name_or_path`` (a key of `RECIPES`) or the recipe in the JSON file at that path.

  Raises ValueError naming the registered recipes when it is neither, or what is wrong with the file's content."""
  if name_or_path in RECIPES:
    path = os.path.join(_HERE, RECIPES[name_or_path])
  elif os.path.isfile(name_or_path):
    path = name_or_path
  else:
    raise ValueError(f"recipe {name_or_path!r} is neither a shipped recipe ({', '.join(list_recipes())}) nor a JSON "
                     "file.")
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"recipe file {path!r} is not valid JSON: {e}") from None
  if not isinstance(data, dict):
    raise ValueError(f"recipe file {path!r} must hold a JSON object, got {type(data).__name__}.")
  try:
    return Recipe.from_dict(data)
  except (TypeError, ValueError) as e:
    raise ValueError(f"recipe file {path!r}: {e}") from None
