"""`learned_optimization.optimizers.opt_list`: `OptList(idx)`, the ``idx``-th entry of a ranked list of NAdamW
hyper-parameters (Metz et al. 2020, "Using a thousand optimization tasks to learn hyperparameter search strategies":
sweeping ``idx = 0, 1, 2, ...`` tries the configurations in the order that did best across a thousand tasks).

Each entry sets `NAdamW`'s arguments and a `CosineLearningRateSchedule` (``learning_rate``,
``min_learning_rate_mult``, ``constant_fraction``, ``warmup_fraction``), so ``init`` needs ``num_steps``. The list is
data the reference ships (``learned_optimization/optimizers/data/opt_list.json``: a JSON list of objects with those
keys); metafam does not redistribute it. `OptList` reads it from ``path=``, else from the file named by the
environment variable ``METAFAM_OPT_LIST``; without either, or with a malformed file, it raises an error saying
where to put it. ``idx`` may be a traced integer (the hyper-parameters are gathered from arrays), so one program can
``vmap`` over indices.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

import jax.numpy as jnp
import numpy as np

from metafam.compat.learned_optimization.optimizers._interface import ModelState, Params
from metafam.compat.learned_optimization.optimizers.learning_rate_schedules import CosineLearningRateSchedule
from metafam.compat.learned_optimization.optimizers.nadamw import NAdamW

__all__ = ["OptList", "load_opt_list", "ENV_VAR", "Params", "ModelState"]

ENV_VAR = "METAFAM_OPT_LIST"
_SCHEDULE_KEYS = ("learning_rate", "min_learning_rate_mult", "constant_fraction", "warmup_fraction")
_NADAMW_KEYS = ("beta1", "beta2", "epsilon", "adamw_weight_decay", "l2_weight_decay", "use_nesterov",
                "use_bias_correction")


def load_opt_list(path: Optional[str] = None) -> Dict[str, np.ndarray]:
  """The hyper-parameter list as ``{name: array over entries}`` from ``path`` or ``$METAFAM_OPT_LIST``."""
  path = path or os.environ.get(ENV_VAR)
  where = ("Put learned_optimization's optimizers/data/opt_list.json (from a checkout of "
           "github.com/google/learned_optimization) on this machine and pass OptList(idx, path=...) or set "
           f"{ENV_VAR} to its path.")
  if not path:
    raise FileNotFoundError(f"OptList needs its list of hyper-parameters, which metafam does not ship. {where}")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"OptList: no file at {path!r}. {where}")
  with open(path, "rb") as f:
    entries = json.loads(f.read().decode("utf-8"))
  if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
    raise ValueError(f"OptList: {path} must hold a non-empty JSON list of objects. {where}")
  keys = set(entries[0])
  unknown = keys - set(_SCHEDULE_KEYS) - set(_NADAMW_KEYS)
  if unknown or not set(_SCHEDULE_KEYS) <= keys or any(set(e) != keys for e in entries):
    raise ValueError(f"OptList: {path} entries must all have the same keys, {list(_SCHEDULE_KEYS)} and any of "
                     f"{list(_NADAMW_KEYS)}; got {sorted(keys)} (unknown: {sorted(unknown)}).")
  table = {k: np.asarray([e[k] for e in entries], np.float32) for k in sorted(keys)}
  for k, v in table.items():
    if not np.all(np.isfinite(v)):
      raise ValueError(f"OptList: {path} has a non-finite {k!r}.")
  return table


class OptList(NAdamW):
  """NAdamW with the ``idx``-th hyper-parameters of the list (module docstring)."""

  def __init__(self, idx: Any, path: Optional[str] = None):
    table = load_opt_list(path)
    size = len(next(iter(table.values())))
    if isinstance(idx, (int, np.integer)) and not 0 <= int(idx) < size:
      raise ValueError(f"OptList: idx must lie in [0, {size}), got {idx!r}.")
    self.idx = idx
    static = isinstance(idx, (int, np.integer))
    flags = {}
    for k in ("use_nesterov", "use_bias_correction"):
      column = table.pop(k, np.ones(size, np.float32))
      if not static and np.any(column != column[0]):
        raise ValueError(f"OptList: {k} differs between entries, so idx must be a Python int, got {idx!r}.")
      flags[k] = bool(column[int(idx) if static else 0])
    pick = {k: jnp.asarray(v)[idx] for k, v in table.items()}
    schedule = CosineLearningRateSchedule(*(pick.pop(k) for k in _SCHEDULE_KEYS))
    # The hyper-parameters may be traced (a traced idx), so NAdamW's host-side checks are skipped here; the list was
    # checked (finite numbers) when loaded. As in the reference, the bias correction is always applied.
    self.learning_rate, self.beta1, self.beta2 = schedule, pick.get("beta1", 0.9), pick.get("beta2", 0.999)
    self.epsilon = pick.get("epsilon", 1e-8)
    self.adamw_weight_decay = pick.get("adamw_weight_decay", 0.0)
    self.l2_weight_decay = pick.get("l2_weight_decay", 0.0)
    self.use_nesterov, self.use_bias_correction = flags["use_nesterov"], True

  @property
  def name(self) -> str:
    return f"OptList{self.idx}" if isinstance(self.idx, (int, np.integer)) else "OptListDynamicIdx"

  def init(self, params, model_state=None, num_steps=None, key=None, **kwargs):
    if num_steps is None:
      raise ValueError("OptList.init needs num_steps (its cosine learning-rate schedule spans the run).")
    return super().init(params, model_state, num_steps=num_steps, key=key, **kwargs)
