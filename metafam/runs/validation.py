"""The meta-validation curve: a learned optimizer's theta scored on fixed held-out instances during meta-training.

The training meta-loss mixes positions along the inner trajectories (each lane is somewhere between its reset and
its horizon) and the noise of the estimator, so it cannot show whether a run learns. `MetaValidation` can: at every
check it trains the *same* held-out instances of every family (same instances, same batches: the keys do not depend
on the meta-step) from their initialization for a fixed horizon with ``opt_fn(theta)``, and returns the normalized
``split`` loss at the horizon, its mean along the curve and the spread over instances, per family and averaged over
families. `metafam.runs.loop.train` calls it every ``eval_every`` meta-steps (its ``evaluate``) and writes
the numbers into the step's record in ``metrics.jsonl``; `metafam.evaluation.report` plots them.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import jax
import numpy as np

from metafam import distributed
from metafam._checks import check_number, check_positive
from metafam.datasets.base import SPLITS
from metafam.evaluation.family_eval import FamilyEvaluator
from metafam.inner import sharding

DEFAULT_SEED = 12345  # the instances of a check: key(seed) folded with the family's index, whatever the meta-step


def family_names(families: Sequence[Any]) -> list:
  """One distinct name per family (its ``name`` attribute, else its class name), suffixed by its index on a clash."""
  names = [str(getattr(f, "name", None) or type(f).__name__) for f in families]
  return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]


def evaluator_on(mesh: Any, family: Any, num_tasks: int, num_steps: int, split: str = "test") -> FamilyEvaluator:
  """A `FamilyEvaluator` of ``family`` whose instances are spread over this process's devices of ``mesh`` (a
  trainer's, or None) when ``num_tasks`` divides evenly, else on one device. Evaluation is not a collective: on a
  mesh of several processes each process evaluates on its own devices."""
  devices = [] if mesh is None else sharding.local_devices(mesh)
  divides = len(devices) > 1 and num_tasks % len(devices) == 0
  return FamilyEvaluator(family, num_tasks, num_steps, split=split, devices=devices if divides else None)


class MetaValidation:
  """Scores a theta of ``learned_opt`` on ``num_tasks`` fixed held-out instances of each of ``families``.

  Args:
    learned_opt: the learned optimizer (``opt_fn(theta)``) whose meta-parameters are scored.
    families: the task families (a multi-family recipe: all of them); each gets its own instances.
    num_tasks: held-out instances per family.
    num_steps: inner steps each instance trains (the horizon).
    split: the split scored after each inner step (normalized by the task); the default, ``outer_valid``, is the
      split meant for choosing meta-parameters, leaving ``test`` to the closing report.
    seed: instances and batches come from ``key(seed)`` folded with the family's index: the same at every call.
    mesh: the trainer's device mesh (`MetaTrainer.mesh`); the instances are spread over this process's devices of
      it when ``num_tasks`` divides evenly, else they run on one device (same numbers up to float rounding).

  Calling it with ``theta`` (and, as the run's validation hook does, the meta-step: ``(theta, step)``) returns, for
  each family ``F`` (`family_names`), ``eval/F/final_loss`` (mean over instances of the loss after the last step),
  ``eval/F/final_loss_sd`` (its standard deviation over instances) and ``eval/F/mean_loss`` (the mean over steps and
  instances), and their means over families as ``eval_final_loss``, ``eval_final_loss_sd`` and ``eval_mean_loss``. A
  non-finite loss (a diverged instance) counts as inf. ``step`` is optional and not used: every check sees the same
  instances, which is what makes the values of two checks comparable.
  """

  def __init__(self, learned_opt: Any, families: Sequence[Any], *, num_tasks: int = 8, num_steps: int = 100,
               split: str = "outer_valid", seed: int = DEFAULT_SEED, mesh: Any = None):
    families = list(families) if isinstance(families, (list, tuple)) else [families]
    if not families:
      raise ValueError("families must name at least one task family to validate on.")
    if split not in SPLITS:  # checked here: the programs are built at the first check, after meta-steps
      raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    check_positive("num_tasks", num_tasks, integer=True)
    check_positive("num_steps", num_steps, integer=True)
    self.seed = int(check_number("seed", seed, low=0, integer=True))
    self.learned_opt, self.families, self.names = learned_opt, families, family_names(families)
    self.num_tasks, self.num_steps, self.split = num_tasks, num_steps, split
    self.multi_process = sharding.is_multi_process(mesh)
    self.evaluators = [evaluator_on(mesh, f, num_tasks, num_steps, split) for f in families]

  def instance_curves(self, theta: Any) -> Dict[str, np.ndarray]:
    """``{family name: f64[num_steps, num_tasks]}``: the per-instance normalized loss after each inner step."""
    if self.multi_process:  # each process evaluates on its own devices: a host copy of the replicated theta
      theta = distributed.to_host(theta)
    base = jax.random.key(self.seed)
    return {name: ev.instance_curves(self.learned_opt, theta, jax.random.fold_in(base, i))
            for i, (name, ev) in enumerate(zip(self.names, self.evaluators))}

  def __call__(self, theta: Any, step: Optional[int] = None) -> Dict[str, float]:
    del step  # the same instances at every check
    out: Dict[str, float] = {}
    for name, curves in self.instance_curves(theta).items():
      curves = np.where(np.isfinite(curves), curves, np.inf)
      final = curves[-1]
      out[f"eval/{name}/final_loss"] = float(np.mean(final))
      out[f"eval/{name}/final_loss_sd"] = float(np.std(final)) if np.all(np.isfinite(final)) else float("inf")
      out[f"eval/{name}/mean_loss"] = float(np.mean(curves))
    for stat in ("final_loss", "final_loss_sd", "mean_loss"):
      out[f"eval_{stat}"] = float(np.mean([out[f"eval/{name}/{stat}"] for name in self.names]))
    return out
