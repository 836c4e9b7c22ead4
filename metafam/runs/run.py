"""A meta-training run: a `Recipe` meta-trained into a run directory, resumable, and its closing report.

`MetaTrainingRun` is what ``metafam meta-train`` runs (the command line only parses flags into a `Recipe`, calls it
and prints). It composes `metafam.runs.run_dir` (the directory's files, the refusal rule),
`metafam.runs.loop` (`train`, the loop, usable on any `MetaTrainer`) and `metafam.runs.validation` (the
meta-validation curve).

A run directory holds, for one run identity (`Recipe.identity`: the recipe less its name, prose and length, plus the
seed):

* ``.metafam.lock``: the ``flock`` of the process running in the directory (`metafam.io.DirectoryLock`), holding its
  pid. Written when a run takes the directory; a run refused after that (another run's or a corrupted checkpoint, a
  meta-step too large for memory) gives the file back its bytes, so a refusal changes nothing.
* ``checkpoint.npz``: the whole `MetaTrainState` and ``{"step", "config": identity}``
  (`metafam.runs.checkpoint`), written atomically every ``checkpoint_every`` meta-steps, at the last one,
  and on SIGTERM / SIGINT at the step in flight; a fresh run of 0 steps writes its initial state. A rerun resumes
  from it, bit for bit.
* ``metrics.jsonl``: one strict-JSON record per meta-step (non-finite values as null), appended after each step; on
  resume the records past the checkpoint (they run again) and a partial last line left by a crash are dropped.
  With ``eval_every``, every that many meta-steps and at the last one the record also holds the meta-validation
  curve's point (`metafam.runs.validation.MetaValidation` on every family of the recipe, the same
  instances at every check): ``eval_final_loss``, ``eval_final_loss_sd``, ``eval_mean_loss`` and per family
  ``eval/FAMILY/...``.
* ``summary.json``, ``meta_loss.png``, ``inner_curves.png``: the closing report (`MetaTrainingRun.report`:
  the learned optimizer before and after against Adam tuned on ``inner_valid``, on held-out test instances),
  written once after the last meta-step (`metafam.evaluation.report`).
* ``tensorboard/``: with a TensorBoard ``log_fn`` (the command line's ``--tensorboard``).

On several processes (`metafam.distributed`) every process runs the meta-steps; process 0 alone locks the directory,
writes every file and evaluates. Failures (docs/guide/failures.md) raise `WriteFailedError` (a write failed; the last
checkpoint is intact), `RunDivergedError` (``max_skipped_steps`` consecutive skipped updates) or
`metafam.runs.preemption.Preempted` (stopped by a signal after a checkpoint).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Dict, List, Optional

import jax

from metafam import distributed
from metafam._checks import check_number
from metafam.outer_trainers.meta_trainer import MetaTrainState
from metafam.runs.loop import DEFAULT_MAX_SKIPPED_STEPS, train
from metafam.runs.recipes import Recipe
from metafam.runs.run_dir import (CHECKPOINT_NAME, METRICS_NAME, WriteFailedError, check_checkpoint, read_metrics,
                                  run_identity)
from metafam.runs.validation import MetaValidation, evaluator_on

__all__ = ["MetaTrainingRun", "RunResult", "tensorboard_logger", "REPORT_KEY_OFFSET"]

REPORT_KEY_OFFSET = 1_000_003  # the closing report's instances: key(seed + this), apart from the run's own streams


# -- the run object --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RunResult:
  """What `MetaTrainingRun.run` returns (process 0; ``comparison`` and ``written`` are None elsewhere).

  Attributes:
    state: the final `MetaTrainState`; meta_steps: its step.
    train_seconds: wall time of this session's meta-training (compilation included).
    totals: `metafam.evaluation.report.meta_train_totals` over every session of the run.
    inner_steps_per_meta_step: inner steps of all lanes per meta-step.
    comparison: the closing `metafam.evaluation.comparison.HeldOutComparison`.
    written: the report's file names in the run directory, ``summary.json`` first.
  """
  state: MetaTrainState
  meta_steps: int
  train_seconds: float
  totals: Dict[str, Any]
  inner_steps_per_meta_step: int
  comparison: Any = None
  written: Optional[List[str]] = None

  def format_summary(self) -> str:
    """Meta-steps, meta-step time (over all sessions and this one), inner steps, then the comparison's table."""
    totals, per_step = self.totals, self.inner_steps_per_meta_step
    text = (f"meta-steps: {self.meta_steps}; meta-step time over all sessions: "
            f"{totals['meta_step_seconds_total']:.0f} s (this session {self.train_seconds:.0f} s); inner steps: "
            f"{totals['inner_steps_total']:,} ({per_step:,} per meta-step)")
    return text + ("\n\n" + self.comparison.format_table() if self.comparison is not None else "")


class MetaTrainingRun:
  """``recipe`` meta-trained with ``seed`` into ``output_dir`` (see the module docstring for the directory).

  Building it builds the learned optimizer, the families, the estimators (lanes over ``devices``) and the
  `MetaTrainer`; nothing is compiled or written. `run` trains (resuming a checkpoint of the same run), then writes
  the closing report.

  Args:
    recipe: the `Recipe` (for ``metafam meta-train``'s flags:
      `metafam.runs.recipe_flags.recipe_from_command`).
    output_dir: the run directory (None: nothing is written, nothing resumed).
    seed: the run's seed: its key is ``jax.random.key(seed)``; part of its identity.
    eval_tasks, eval_steps: held-out instances (per family) and inner steps of the meta-validation checks and of the
      closing report (which runs on the recipe's first family).
    devices: spread the lanes over this many devices (or these devices; None: one).
  """

  def __init__(self, recipe: Recipe, output_dir: Optional[str], *, seed: int = 0, eval_tasks: int = 16,
               eval_steps: int = 200, devices: Any = None):
    if not isinstance(recipe, Recipe):
      raise TypeError(f"recipe must be a Recipe (metafam.runs.recipes), got {type(recipe).__name__}.")
    self.recipe, self.output_dir, self.seed = recipe, output_dir, int(check_number("seed", seed, low=0, integer=True))
    self.lopt, self.families, self.trainer = recipe.build(devices=devices)
    self.validation = MetaValidation(self.lopt, self.families, num_tasks=eval_tasks, num_steps=eval_steps,
                                     mesh=self.trainer.mesh)
    self.evaluator = evaluator_on(self.trainer.mesh, self.families[0], eval_tasks, eval_steps, split="test")

  @property
  def identity(self) -> Dict[str, Any]:
    """What must match to resume a checkpoint in the run directory: `Recipe.identity` (stored as the checkpoint's
    config, completed by `metafam.runs.run_dir.run_identity`)."""
    return self.recipe.identity(self.seed)

  @property
  def key(self) -> jax.Array:
    return jax.random.key(self.seed)

  def run(self, *, num_steps: Optional[int] = None, checkpoint_every: int = 50, eval_every: Optional[int] = None,
          progress: bool = True, log_fn: Optional[Callable[[Dict[str, Any]], None]] = None,
          handle_signals: bool = True, max_skipped_steps: Optional[int] = DEFAULT_MAX_SKIPPED_STEPS,
          report: bool = True) -> RunResult:
    """Meta-trains to ``num_steps`` (default the recipe's; with ``eval_every``, the meta-validation curve every that
    many meta-steps) with the directory locked (process 0), then, with ``report``, compares and writes the closing
    report (process 0) before the lock is released. A refusal leaves the directory as it was."""
    num_steps = self.recipe.num_steps if num_steps is None else num_steps
    main = self.trainer.is_main_process and distributed.is_main_process()
    start = time.perf_counter()

    def finish(state: MetaTrainState, _) -> RunResult:
      train_seconds = time.perf_counter() - start
      # Host copies of the thetas to compare: process 0 evaluates alone, so no array of a multi-process mesh may
      # enter its programs (placing the initial theta on that mesh is itself a collective: every process takes part).
      thetas = {"learned (init)": distributed.to_host(self.trainer.initial_theta(self.key)),
                "learned (final)": distributed.to_host(state.theta)}
      history = self.history() if main else []
      from metafam.evaluation.report import meta_train_totals
      per_step = self.trainer.inner_steps_per_meta_step
      result = RunResult(state, int(state.step), train_seconds, meta_train_totals(history, int(state.step), per_step),
                         per_step)
      return self.report(result, thetas, history) if report and main else result

    return train(self.trainer, num_steps, key=self.key, output_dir=self.output_dir,
                 identity=run_identity(self.trainer, self.identity), checkpoint_every=checkpoint_every,
                 evaluate=self.validation if eval_every else None, eval_every=eval_every or None,
                 progress=progress and main, log_fn=log_fn, handle_signals=handle_signals,
                 max_skipped_steps=max_skipped_steps, lock_output_dir=main, finish=finish)[2]

  def nothing_to_train(self, num_steps: int, report: bool = True) -> Optional[str]:
    """Why a `run` to ``num_steps`` would have nothing to do (the directory's run is at ``num_steps`` or past it, and
    at it holds its report or none is asked for), or None; refuses another run's checkpoint first (`steps_done`)."""
    done = self.steps_done()
    if done is None or done < num_steps or (done == num_steps and report and not self.has_report()):
      return None  # (at num_steps without its report, the run writes the report only)
    files = CHECKPOINT_NAME + (", summary.json" if done == num_steps and report else "")
    return (f"the run in {self.output_dir!r} is already at meta-step {done} ({files}); nothing to train. Ask for "
            f"more than {done} meta-steps to continue it.")

  def steps_done(self) -> Optional[int]:
    """The meta-steps of the checkpoint in the run directory (None: none), after refusing a checkpoint of another
    run (`metafam.runs.checkpoint.CheckpointError`); reads no arrays and changes nothing."""
    path = os.path.join(self.output_dir, CHECKPOINT_NAME) if self.output_dir else None
    if path is None or not os.path.isfile(path):
      return None
    check_checkpoint(path, run_identity(self.trainer, self.identity), read_theta=False)
    from metafam.runs.checkpoint import read_metadata
    step = read_metadata(path).get("step")
    return step if isinstance(step, int) else None

  def has_report(self) -> bool:
    """Whether the run directory holds a closing report (``summary.json``)."""
    return bool(self.output_dir) and os.path.exists(os.path.join(self.output_dir, "summary.json"))

  def history(self) -> List[Dict[str, Any]]:
    """The records of the run directory's ``metrics.jsonl`` (every session's; ``[]`` if none)."""
    path = os.path.join(self.output_dir, METRICS_NAME) if self.output_dir else None
    return read_metrics(path) if path and os.path.exists(path) else []

  def report(self, result: RunResult, thetas: Dict[str, Any], history: List[Dict[str, Any]]) -> RunResult:
    """The closing comparison (`metafam.evaluation.comparison.compare_with_tuned_adam` on fresh test instances,
    key ``seed + REPORT_KEY_OFFSET``) and, with a run directory, its report files."""
    from metafam.evaluation.comparison import compare_with_tuned_adam
    from metafam.evaluation.report import write_meta_train_report
    comparison = compare_with_tuned_adam(self.evaluator, self.lopt, thetas,
                                         jax.random.key(self.seed + REPORT_KEY_OFFSET), min_tasks=1)
    written = None
    if self.output_dir:
      try:
        written = write_meta_train_report(self.output_dir, history, comparison,
                                          run_identity(self.trainer, self.identity),
                                          meta_steps=result.meta_steps, train_seconds=result.train_seconds,
                                          inner_steps_per_meta_step=result.inner_steps_per_meta_step)
      except OSError as e:  # the run itself is checkpointed: only the report is missing
        raise WriteFailedError(getattr(e, "filename", None) or self.output_dir, e,
                               os.path.join(self.output_dir, CHECKPOINT_NAME), result.meta_steps) from e
    return dataclasses.replace(result, comparison=comparison, written=written)


def tensorboard_logger(output_dir: str) -> Callable[[Dict[str, Any]], None]:
  """A ``log_fn`` writing each record's numbers to ``OUTPUT_DIR/tensorboard`` (needs tensorboardX), created at the
  first record: a refused run writes nothing."""
  writers: List[Any] = []

  def log(record: Dict[str, Any]) -> None:
    if not writers:
      from tensorboardX import SummaryWriter
      writers.append(SummaryWriter(os.path.join(output_dir, "tensorboard")))
    for k, v in record.items():
      if k != "step" and isinstance(v, (int, float)):
        writers[0].add_scalar(k, v, record["step"])
    writers[0].flush()
  return log
