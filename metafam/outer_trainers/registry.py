"""The estimator registry: names -> estimator classes, and `make_estimator` to build one with its step.

    est = make_estimator("pes", family, learned_opt, num_tasks=8, unroll_length=20, sigma=0.01)

is ``PES(TruncatedStep(family, learned_opt, 8, ConstantSchedule(200), random_initial_iteration=True,
meta_loss_split="outer_valid"), unroll_length=20, sigma=0.01)``: the step's arguments go to the step, the rest to
the estimator. ``num_tasks`` is the number of task instances per meta-step (TBPTT: a lane each; ES estimators: an
antithetic pair of lanes each).

`make_estimator` is how a `metafam.runs.Recipe` builds its estimators, and its defaults are meta-training's, not
the bare `TruncatedStep`'s: 8 tasks (``Recipe.num_tasks``), staggered lanes (``random_initial_iteration=True``) and
the meta-loss on ``outer_valid``, where `TruncatedStep` defaults to unstaggered lanes, the step's own batch and
``ConstantSchedule(50)``. Its schedule, ``ConstantSchedule(200)``, is one constant length, that of `FullES` and of
the main job (``metafam meta-train``), where `Recipe` defaults to a range (log-uniform in 100-2,000); a recipe
always passes its own. tests/runs/test_library_defaults.py pins these relations.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Type

from metafam._registry import lookup
from metafam.inner.schedules import ConstantSchedule
from metafam.inner.truncated_step import TruncatedStep
from metafam.outer_trainers.base import GradientEstimator
from metafam.outer_trainers.estimators import FullES, TruncatedBPTT, TruncatedES
from metafam.outer_trainers.pes import PES, NoiseReuseES

ESTIMATORS: Dict[str, Type[GradientEstimator]] = {
    "tbptt": TruncatedBPTT, "full_es": FullES, "truncated_es": TruncatedES, "pes": PES, "nres": NoiseReuseES}


def list_estimators() -> List[str]:
  return sorted(ESTIMATORS)


def get_estimator(name: str) -> Type[GradientEstimator]:
  """The estimator class registered as ``name`` (`UnknownNameError` listing the valid names otherwise)."""
  return lookup(ESTIMATORS, name, "estimator")


def make_estimator(name: str, family: Any, learned_opt: Any, *, num_tasks: int = 8, schedule: Any = None,
                   meta_loss_split: Optional[str] = "outer_valid", random_initial_iteration: bool = True,
                   devices: Any = None, **estimator_kwargs: Any) -> GradientEstimator:
  """Builds the `TruncatedStep` (``ConstantSchedule(200)`` unless ``schedule`` is given) and the estimator ``name``
  on it; ``estimator_kwargs`` go to the estimator (e.g. ``unroll_length``, ``sigma``, ``loss_kind``)."""
  cls = get_estimator(name)
  step = TruncatedStep(family, learned_opt, num_tasks, ConstantSchedule(200) if schedule is None else schedule,
                       random_initial_iteration=random_initial_iteration, meta_loss_split=meta_loss_split,
                       devices=devices)
  return cls(step, **estimator_kwargs)


def estimator_arguments(name: str) -> List[str]:
  """The keyword arguments the estimator ``name`` accepts besides its step (e.g. to pass only those that apply)."""
  params = inspect.signature(get_estimator(name)).parameters.values()
  return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "truncated_step"]
