"""Meta-training recipes: a whole meta-training run as data (learned optimizer, families, estimator, meta-optimizer).

A `Recipe` names a registered learned optimizer and its ``step_mult``, a mixture of task families (`FamilySpec`s:
each family gets its own estimator, and a meta-step averages their meta-gradients, so families of different shapes
share one theta), the estimator, its truncations and perturbation, and the meta-optimizer. It is the only
description of a run: ``metafam meta-train``'s flags build a one-family recipe, or ``--recipe`` loads one that given
flags override (`metafam.runs.recipe_flags`). Recipes are JSON files; the shipped ones
live in ``metafam/runs/recipes/`` and are named in `RECIPES`:

    recipe = load_recipe("generalist")                 # or load_recipe("path/to/my_recipe.json")
    run = MetaTrainingRun(recipe, "runs/generalist", seed=0)   # metafam.runs.run
    result = run.run()

A run's identity (what must match to resume it) is `Recipe.identity`: the recipe less its name, prose and length,
plus the seed. A run's checkpoint stores it as its config (`metafam.runs.run_dir.run_identity`), and a run resumes
only a checkpoint of its own identity.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from metafam._checks import check_number, check_positive_int
from metafam._registry import UnknownNameError, unknown_name_message
from metafam.outer_trainers.base import PERTURBATIONS
from metafam.taskfamilies.spec import FamilySpec

_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes")

# Shipped recipes: name -> file in metafam/runs/recipes/.
RECIPES: Dict[str, str] = {
    "generalist": "generalist.json",  # the pretrained `generalist_v1` (metafam.pretrained): 5 families, NRES
    "generalist_v2": "generalist_v2.json",  # the pretrained `generalist_v2`: 7 meta-parameters, 3 families, NRES
}


@dataclasses.dataclass(frozen=True)
class Recipe:
  """One meta-training run as data (see the module docstring). Values are checked on construction.

  Attributes:
    name: the recipe's name (recorded in checkpoints, not part of the run's identity).
    optimizer: a registered learned optimizer (`metafam.optimizers.registry.LEARNED_OPTIMIZERS`).
    step_mult: its ``step_mult`` (for a unit-RMS optimizer: the learning rate during meta-training); None for an
      optimizer without one (or its library default).
    optimizer_kwargs: other constructor arguments of the learned optimizer (JSON values), e.g. ``{"lr_spread":
      3.16}`` for `MuonResidualLOpt`; part of the run's identity when not empty.
    estimator_kwargs: other keyword arguments of the estimator (JSON values; the ones `estimator_arguments` lists
      besides those the fields above set), e.g. ``{"loss_type": "tail", "tail_fraction": 0.1}`` for "full_es";
      part of the run's identity when not empty.
    families: the mixture, one `FamilySpec` each (at least one).
    estimator: a registered estimator name ("nres", "pes", ...).
    num_tasks: task instances per family and meta-step (`make_estimator`'s ``num_tasks``): a lane each for
      "tbptt", an antithetic pair of lanes each for the ES estimators.
    unroll_length: inner steps per truncation.
    trajectory_lengths: ``(low, high)``: trajectory lengths are log-uniform in this range (`LogUniformSchedule`;
      ``low == high``: every trajectory has that length, `ConstantSchedule`).
    sigma: the ES perturbation's standard deviation.
    perturbation, perturbation_rank: the ES noise of matrix meta-parameters: "full" Gaussian, or "low_rank" with
      factors of that rank (same covariance; ES estimators only).
    meta_learning_rate, meta_lr_decay_steps, clip_grad_norm: the meta-optimizer (`meta_optimizer`; clip 0: none).
    num_steps: meta-steps of the run.
    description: what the recipe is for, in words.

  Defaults: a recipe builds its estimators with `metafam.outer_trainers.make_estimator`, and the defaults the
  library shares with it are the same: 8 pairs, truncations of 20 (every estimator's ``unroll_length``), ``sigma``
  0.01, full noise of rank 1, the estimators' ``loss_kind`` and no loss-difference clipping, staggered lanes and the
  ``outer_valid`` meta-loss (`make_estimator`'s). Three differ on purpose, and tests/runs/test_library_defaults.py pins
  them: ``trajectory_lengths`` (100, 2000), the generalist's range, where `make_estimator` (and `FullES`, which runs
  one length) default to a constant 200, the main job's; ``clip_grad_norm`` 1.0, where `MetaTrainer` clips nothing
  unless asked; and `TruncatedStep`'s own ``ConstantSchedule(50)``, unstaggered lanes and ``"same_batch"``
  meta-loss, the bare inner loop's. The main job (`metafam.runs.recipe_flags.main_job`) changes only its truncation
  (10), trajectory length (200), meta-steps (6000) and their decay.
  """
  name: str
  optimizer: str
  step_mult: Optional[float]
  families: Tuple[FamilySpec, ...]
  estimator: str = "nres"
  num_tasks: int = 8
  unroll_length: int = 20
  trajectory_lengths: Tuple[int, int] = (100, 2000)
  sigma: float = 0.01
  perturbation: str = "full"
  perturbation_rank: int = 1
  meta_learning_rate: float = 3e-3
  meta_lr_decay_steps: int = 0
  clip_grad_norm: float = 1.0
  num_steps: int = 1000
  description: str = ""
  optimizer_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  estimator_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    from metafam.inner.schedules import LogUniformSchedule
    from metafam.optimizers.registry import LEARNED_OPTIMIZERS, takes_step_mult
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
    for field in ("num_tasks", "unroll_length", "num_steps"):
      check_positive_int(f"Recipe.{field}", getattr(self, field))
    check_number("Recipe.meta_lr_decay_steps", self.meta_lr_decay_steps, low=0, integer=True)
    for field in ("sigma", "meta_learning_rate"):
      check_number(f"Recipe.{field}", getattr(self, field), low=0.0, low_open=True)
    if self.step_mult is not None:
      check_number("Recipe.step_mult", self.step_mult, low=0.0, low_open=True)
      if not takes_step_mult(self.optimizer):
        raise ValueError(f"Recipe.step_mult: optimizer {self.optimizer} has no step_mult; it applies to "
                         f"{', '.join(n for n in sorted(LEARNED_OPTIMIZERS) if takes_step_mult(n))}.")
    self._check_optimizer_kwargs()
    self._check_estimator_kwargs()
    if self.perturbation not in PERTURBATIONS:
      raise ValueError(f"Recipe.perturbation must be one of {PERTURBATIONS}, got {self.perturbation!r}.")
    check_positive_int("Recipe.perturbation_rank", self.perturbation_rank)
    if self.perturbation != "full" and self.estimator == "tbptt":
      raise ValueError("Recipe.perturbation low_rank: estimator tbptt perturbs nothing; use an ES estimator.")
    check_number("Recipe.clip_grad_norm", self.clip_grad_norm, low=0.0)
    lengths = tuple(self.trajectory_lengths)
    if len(lengths) != 2:
      raise ValueError(f"Recipe.trajectory_lengths must be (low, high), got {self.trajectory_lengths!r}.")
    LogUniformSchedule(*lengths)  # checks 1 <= low <= high, ints
    object.__setattr__(self, "trajectory_lengths", lengths)

  def _check_optimizer_kwargs(self):
    from metafam.optimizers.registry import get_learned_optimizer
    kwargs = self.optimizer_kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
      raise ValueError(f"Recipe.optimizer_kwargs must be a mapping of argument names to values, got {kwargs!r}.")
    if "step_mult" in kwargs:
      raise ValueError("Recipe.optimizer_kwargs: give step_mult as Recipe.step_mult.")
    try:
      kwargs = json.loads(json.dumps(dict(kwargs)))  # JSON data, as the run's identity stores it
    except (TypeError, ValueError):
      raise ValueError(f"Recipe.optimizer_kwargs must hold JSON values, got {self.optimizer_kwargs!r}.") from None
    try:
      get_learned_optimizer(self.optimizer, **kwargs)  # constructors are cheap and check their arguments
    except (TypeError, ValueError) as e:
      raise ValueError(f"Recipe.optimizer_kwargs {kwargs} for {self.optimizer}: {e}") from None
    object.__setattr__(self, "optimizer_kwargs", kwargs)

  def _check_estimator_kwargs(self):
    from metafam.outer_trainers.registry import estimator_arguments
    kwargs = self.estimator_kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
      raise ValueError(f"Recipe.estimator_kwargs must be a mapping of argument names to values, got {kwargs!r}.")
    try:
      kwargs = json.loads(json.dumps(dict(kwargs)))
    except (TypeError, ValueError):
      raise ValueError(f"Recipe.estimator_kwargs must hold JSON values, got {self.estimator_kwargs!r}.") from None
    own = set(self._estimator_values()) | {"trajectory_length"}
    accepted = sorted(set(estimator_arguments(self.estimator)) - own)
    for name in kwargs:
      if name in own:
        raise ValueError(f"Recipe.estimator_kwargs: {name} is set by the recipe's own fields; give it there.")
      if name not in accepted:
        raise ValueError(f"Recipe.estimator_kwargs: estimator {self.estimator} takes no {name!r}; it takes "
                         f"{', '.join(accepted) or 'nothing more'}.")
    object.__setattr__(self, "estimator_kwargs", kwargs)

  def _estimator_values(self) -> Dict[str, Any]:
    """The estimator arguments the recipe's own fields set (those the estimator takes are passed)."""
    return dict(unroll_length=self.unroll_length, sigma=self.sigma, perturbation=self.perturbation,
                rank=self.perturbation_rank)

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

  def identity(self, seed: int) -> Dict[str, Any]:
    """What identifies a run of this recipe with ``seed`` (resuming with anything else is refused): the recipe less
    its name, description and length (a run may be continued to more meta-steps), as JSON data."""
    recipe = {k: v for k, v in self.to_dict().items() if k not in ("name", "description", "num_steps")}
    for field in ("optimizer_kwargs", "estimator_kwargs"):
      if not recipe[field]:  # the identity of runs of recipes from before the field
        del recipe[field]
    if recipe["perturbation"] == "full":
      recipe["perturbation_rank"] = None  # meaningless for full noise
    return json.loads(json.dumps({"recipe": recipe, "seed": int(seed)}))

  @classmethod
  def from_identity(cls, recorded: Mapping[str, Any], name: str) -> "Recipe":
    """The recipe a run recorded: the ``"recipe"`` part of `identity` as a checkpoint stores it, named ``name`` where it records none. ``Recipe.from_identity(r, n).identity(seed)`` is the
    run's identity again, so two runs' recipes compare by their identities."""
    data = dict(recorded)
    data.setdefault("name", name)
    if data.get("perturbation", "full") == "full" and data.get("perturbation_rank", 1) is None:
      data["perturbation_rank"] = 1  # identity records none for full noise, where the rank means nothing
    return cls.from_dict(data)

  # -- building -----------------------------------------------------------------------------------------------
  def build_learned_optimizer(self):
    from metafam.optimizers.registry import get_learned_optimizer
    return get_learned_optimizer(self.optimizer, **self.optimizer_kwargs,
                                 **({} if self.step_mult is None else {"step_mult": self.step_mult}))

  def schedule(self):
    """The trajectory-length schedule: constant when ``low == high``, else log-uniform."""
    from metafam.inner.schedules import ConstantSchedule, LogUniformSchedule
    low, high = self.trajectory_lengths
    return ConstantSchedule(low) if low == high else LogUniformSchedule(low, high)

  def build_estimators(self, lopt, devices: Any = None, families: Optional[list] = None) -> list:
    """One estimator per family, in the order of ``families`` (built from the specs unless given)."""
    from metafam.outer_trainers.registry import estimator_arguments, make_estimator
    values = self._estimator_values()
    low, high = self.trajectory_lengths
    if low == high:  # full_es trains whole trajectories of this length (with a range: its own default)
      values["trajectory_length"] = low
    accepted = estimator_arguments(self.estimator)
    kwargs = {**{k: v for k, v in values.items() if k in accepted}, **self.estimator_kwargs}
    families = [spec.build() for spec in self.families] if families is None else families
    return [make_estimator(self.estimator, family, lopt, num_tasks=self.num_tasks, schedule=self.schedule(),
                           devices=devices, **kwargs) for family in families]

  def build(self, *, devices: Any = None) -> "BuiltRecipe":
    """The learned optimizer, the families and the `MetaTrainer` (its estimators' lanes over ``devices``)."""
    from metafam.outer_trainers.meta_trainer import MetaTrainer, meta_optimizer
    lopt = self.build_learned_optimizer()
    families = [spec.build() for spec in self.families]
    estimators = self.build_estimators(lopt, devices=devices, families=families)
    trainer = MetaTrainer(lopt, estimators, meta_optimizer(self.meta_learning_rate, self.meta_lr_decay_steps),
                          clip_grad_norm=self.clip_grad_norm or None)
    return BuiltRecipe(lopt, families, trainer)


class BuiltRecipe(NamedTuple):
  """What `Recipe.build` returns: the learned optimizer, the built families (in the recipe's order) and the
  `metafam.outer_trainers.meta_trainer.MetaTrainer`."""
  learned_opt: Any
  families: List[Any]
  trainer: Any


def list_recipes():
  return sorted(RECIPES)


def load_recipe(name_or_path: str) -> Recipe:
  """The shipped recipe ``name_or_path`` (a key of `RECIPES`) or the recipe in the JSON file at that path.

  Raises `metafam.UnknownNameError` (a KeyError and a ValueError) naming the shipped recipes when it is neither,
  or ValueError saying what is wrong with the file's content."""
  if name_or_path in RECIPES:
    path = os.path.join(_HERE, RECIPES[name_or_path])
  elif os.path.isfile(name_or_path):
    path = name_or_path
  else:
    raise UnknownNameError(unknown_name_message(RECIPES, name_or_path, "recipe (and no such JSON file)"))
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
