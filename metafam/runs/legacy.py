"""Reading the run configs that checkpoints of earlier metafam versions store, so that their runs resume.

A checkpoint stores its run's identity as ``config``. Today that is `Recipe.identity`; earlier versions stored the
``--recipe`` recipe with its name and the perturbation beside it, or, before recipes described every run, the
command line's flags (`metafam.runs.recipe_flags.FLAG_KEYS`) and the seed. `stored_identity` maps each to the
identity the same run has today and `same_run` is the identity check `metafam.runs.run.MetaTrainingRun`
passes to the loop (`metafam.runs.loop.train`'s ``same_run``).
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional

import numpy as np

from metafam.runs.recipe_flags import FLAG_KEYS, recipe_from_flags
from metafam.runs.recipes import Recipe


def stored_identity(config: Any) -> Optional[Dict[str, Any]]:
  """The `Recipe.identity` of the run whose checkpoint stores ``config``, or None if it is no recipe run's.

  Reads the config of every metafam version: the current one, ``--recipe`` runs of earlier versions (the recipe
  with its name, the perturbation beside it) and flag runs of earlier versions (the flags, `FLAG_KEYS`).
  """
  if not isinstance(config, Mapping) or not isinstance(config.get("seed"), (int, np.integer)):
    return None
  perturbation = {k: config[k] for k in ("perturbation", "perturbation_rank") if config.get(k) is not None}
  try:
    if isinstance(config.get("recipe"), Mapping):
      data = dict(config["recipe"], **perturbation)
      data = {k: v for k, v in data.items() if not (k == "perturbation_rank" and v is None)}
      recipe = Recipe.from_dict(dict(data, name=data.get("name") or "stored"))
    elif all(k in config for k in FLAG_KEYS):
      recipe = recipe_from_flags(dict(config, **perturbation))
    else:
      return None
  except (TypeError, ValueError, KeyError):
    return None
  return recipe.identity(config["seed"])


def same_run(stored: Any, mine: Any) -> bool:
  """Whether a checkpoint's stored config and ``mine`` (a trainer's config) name the same run: equal recipe
  identities (`stored_identity`, which reads every version's configs), or else equal as JSON."""
  mine = json.loads(json.dumps(mine, sort_keys=True))  # as stored: tuples become lists
  identities = stored_identity(stored), stored_identity(mine)
  return identities[0] == identities[1] if identities[1] is not None else stored == mine
