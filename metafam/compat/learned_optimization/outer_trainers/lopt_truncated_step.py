"""`learned_optimization.outer_trainers.lopt_truncated_step`: `VectorizedLOptTruncatedStep`, the reference's
constructor for metafam's `metafam.inner.TruncatedStep`.

The object *is* a `TruncatedStep` (a subclass that only translates the arguments), so metafam's estimators and
`MetaTrainer` take it directly. Translations:

* ``trunc_sched``: a schedule of `truncation_schedule` (or a metafam schedule).
* ``meta_loss_split=None``: the meta-loss is the train-batch loss of each step, as in the reference (metafam's
  ``meta_loss_split=None``); a split name (e.g. ``"outer_valid"``) scores the updated params on that split.
* ``random_initial_iteration_offset``: 0 starts every lane at iteration 0; a positive value staggers the lanes'
  first trajectories. metafam draws each lane's start uniformly in ``[0, length)`` of its first trajectory; the
  reference draws it in ``[0, random_initial_iteration_offset)``.
* ``outer_data_split``: only ``"train"`` (the inner training data); ``meta_loss_with_aux_key``: only None.

Other keyword arguments (``devices``, ``lane_chunk``, ...) go to `TruncatedStep` unchanged.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from metafam.compat.learned_optimization.outer_trainers import truncation_schedule
from metafam.inner.truncated_step import TruncatedStep

__all__ = ["VectorizedLOptTruncatedStep"]


class VectorizedLOptTruncatedStep(TruncatedStep):
  """``num_tasks`` instances of ``task_family`` trained by ``learned_opt`` in truncated, vectorized unrolls."""

  def __init__(self, task_family: Any, learned_opt: Any, trunc_sched: Any, num_tasks: int,
               meta_loss_split: Optional[str] = None, random_initial_iteration_offset: int = 0,
               outer_data_split: str = "train", meta_loss_with_aux_key: Optional[str] = None,
               task_name: Optional[str] = None, **metafam_kwargs: Any):
    offset = random_initial_iteration_offset
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)) or offset < 0:
      raise ValueError(f"random_initial_iteration_offset must be a non-negative int, got {offset!r}.")
    if outer_data_split != "train":
      raise NotImplementedError(f"outer_data_split={outer_data_split!r}: metafam's inner step trains on the train "
                                "split only.")
    if meta_loss_with_aux_key is not None:
      raise NotImplementedError("meta_loss_with_aux_key: metafam's meta-loss is the task's loss, not an aux value.")
    super().__init__(task_family, learned_opt, num_tasks, schedule=truncation_schedule.as_metafam_schedule(trunc_sched),
                     random_initial_iteration=offset > 0, meta_loss_split=meta_loss_split, **metafam_kwargs)
    self.task_family, self.trunc_sched = task_family, trunc_sched
    self.random_initial_iteration_offset = int(offset)
    self.task_name = task_name if task_name else task_family.name

  def cfg_name(self) -> str:
    return self.task_name
