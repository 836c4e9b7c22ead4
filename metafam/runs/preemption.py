"""Stopping a meta-training run cleanly on SIGTERM / SIGINT (preemption), at a meta-step every process agrees on.

Cluster schedulers (SLURM, Kubernetes, spot instances) announce a preemption with SIGTERM, wait a grace period, then
kill. `StopRequests` turns the signal into a request that `metafam.runs.loop.train` honours after the
meta-step in flight: it writes the metrics and a checkpoint at that step and raises `Preempted`; the command line
exits with `EXIT_PREEMPTED` and one line saying how to resume. The resumed run equals an uninterrupted one bit for bit (the
checkpoint holds the whole `MetaTrainState`).

* One process: Python handlers for SIGTERM and SIGINT set the request. A second SIGINT (Ctrl-C twice) raises
  `KeyboardInterrupt` at once, for a user who does not want to wait for the step; further SIGTERMs are ignored.
* Several processes (`jax.distributed`): JAX's distributed runtime has its own preemption notice. Its native
  SIGTERM handler tells the coordination service, which computes a step every process reaches and reports it
  through `jax.experimental.multihost_utils.reached_preemption_sync_point` (called once per meta-step by every
  process), so all processes stop and checkpoint at the same meta-step, however the signal reached them. Here
  SIGTERM is left to that handler, and SIGINT is forwarded to it as a SIGTERM to this process.

Handlers are installed only from the main thread (Python allows no other) and restored on exit.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Optional

import jax

from metafam.distributed import EXIT_PREEMPTED  # defined beside the launcher, which must tell it from a failure

__all__ = ["EXIT_PREEMPTED", "Preempted", "StopRequests"]


class Preempted(Exception):
  """Meta-training stopped on a signal after meta-step ``step``; ``checkpoint`` (None without an output
  directory) holds the state at that step, and ``state`` is that state."""

  def __init__(self, step: int, checkpoint: Optional[str], signal_name: str, state: Any = None):
    self.step, self.checkpoint, self.signal_name, self.state = step, checkpoint, signal_name, state
    where = (f"checkpoint and metrics written to {checkpoint}; run the same command again to resume"
             if checkpoint else "nothing was checkpointed (no output directory)")
    super().__init__(f"stopped by {signal_name} after meta-step {step}: {where}.")


def _multi_process() -> bool:
  return jax.process_count() > 1


class StopRequests:
  """Context manager that records SIGTERM / SIGINT as a request to stop at the next agreed meta-step.

  ``requested(step)`` is called once per meta-step (after it) by every process with the meta-step count; it is
  True at the step where the run should stop. `signal_name` names the signal that asked.
  """

  def __init__(self):
    self.signal_name: Optional[str] = None
    self._previous = {}

  # -- handlers ---------------------------------------------------------------------------------------------------
  def _on_signal(self, signum, frame) -> None:
    name = signal.Signals(signum).name
    if self.signal_name is None:
      self.signal_name = name
    elif signum == signal.SIGINT:  # asked twice: leave now, without the checkpoint
      raise KeyboardInterrupt
    if _multi_process() and signum == signal.SIGINT:
      os.kill(os.getpid(), signal.SIGTERM)  # to JAX's preemption notifier, which agrees on the step with the others

  def __enter__(self) -> "StopRequests":
    if threading.current_thread() is not threading.main_thread():
      return self  # signals are delivered to the main thread only: nothing to catch here
    wanted = [signal.SIGINT] if _multi_process() else [signal.SIGTERM, signal.SIGINT]
    for signum in wanted:
      self._previous[signum] = signal.signal(signum, self._on_signal)
    return self

  def __exit__(self, *exc) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  # -- the loop's question ----------------------------------------------------------------------------------------
  def requested(self, step: int) -> bool:
    """Whether to stop after meta-step ``step``. On several processes every one must ask after every meta-step,
    with the same ``step`` (a local look-up of the sync point, not a collective)."""
    if _multi_process():
      from jax.experimental import multihost_utils
      if multihost_utils.reached_preemption_sync_point(step):
        self.signal_name = self.signal_name or "SIGTERM"
        return True
      return False
    return self.signal_name is not None
