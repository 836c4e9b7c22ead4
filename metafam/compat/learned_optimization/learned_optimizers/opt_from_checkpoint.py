"""`learned_optimization.learned_optimizers.opt_from_checkpoint`: a meta-trained optimizer from a saved theta.

LO rebuilds the learned optimizer from the run's gin config (``config_path`` / ``extra_bindings``); metafam has no
gin, so pass the learned optimizer itself as ``learned_opt=`` (a gin ``config_path`` or bindings raise
NotImplementedError naming gin). The file is a `checkpoints.save_state` file holding a
`gradient_learner.ParameterCheckpoint` or a bare theta (metafam's ``.npz``: no pickle, no code run on load); its
structure must match ``learned_opt.init(key)``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax

from metafam.compat.learned_optimization import checkpoints
from metafam.compat.learned_optimization.optimizers import base as opt_base
from metafam.runs import checkpoint as _checkpoint

__all__ = ["opt_from_checkpoint"]


def opt_from_checkpoint(checkpoint_path: str, config_path: Optional[str] = None,
                        extra_bindings: Sequence[str] = tuple([]), learned_opt: Any = None) -> opt_base.Optimizer:
  """``learned_opt.opt_fn(theta)`` with theta read from ``checkpoint_path``."""
  if config_path is not None or tuple(extra_bindings):
    raise NotImplementedError("opt_from_checkpoint: config_path / extra_bindings are gin configuration, and "
                              "metafam does not use gin; pass the learned optimizer as learned_opt=.")
  if learned_opt is None or not hasattr(learned_opt, "opt_fn") or not hasattr(learned_opt, "init"):
    raise ValueError("opt_from_checkpoint: learned_opt must be the learned optimizer the checkpoint was trained "
                     f"with (an object with init and opt_fn), got {learned_opt!r}.")
  like = learned_opt.init(jax.random.PRNGKey(0))
  if _checkpoint.read_metadata(checkpoint_path).get("kind") == "ParameterCheckpoint":
    theta = checkpoints.load_state(checkpoint_path, checkpoints.ParameterCheckpoint(like, "", 0)).params
  else:
    theta = checkpoints.load_state(checkpoint_path, like)
  return opt_base.as_lo_optimizer(learned_opt.opt_fn(theta))
