"""Meta-training on several processes with JAX's own distributed runtime (`jax.distributed`).

Every process runs the same program (SPMD). After `initialize`, `jax.devices()` lists the devices of *all*
processes, so an estimator built with ``devices=jax.device_count()`` spreads its lanes over one global mesh
(`metafam.inner.sharding`): each process computes its own block of lanes, theta and the meta-optimizer state are
replicated, and the jitted meta-step averages the estimate across processes inside XLA (Gloo on CPU, NCCL on GPU).

`MetaTrainer` adapts on its own when its mesh spans several processes:

- checkpoints hold the *global* state (lanes gathered from every process) and are written by process 0 alone,
  atomically; on resume process 0 reads the checkpoint and broadcasts it, so a run resumes with any process count
  whose devices divide the lanes (the lanes are re-split), and the other processes need no shared file system;
- ``metrics.jsonl`` is written by process 0 only; held-out evaluation runs on each process's own devices;
- when another process dies, the collective of the next meta-step fails and `metafam.runs.loop.train` raises
  `PeerFailureError` (no hang: JAX's heartbeat also ends a process whose peer stopped answering).

This module holds what is about processes rather than arrays: `initialize` (argument checks, a busy or unreachable
coordinator reported before JAX tries), `check_same_everywhere` (all processes were given the same run), the host
gather/broadcast helpers `MetaTrainer` uses, and `launch_local`, which starts N local processes for a quick try.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

__all__ = ["ProcessGroup", "DistributedError", "PeerFailureError", "initialize", "is_main_process",
           "check_same_everywhere", "raise_if_any", "to_host", "from_main_process", "broadcast_flag",
           "is_peer_failure", "launch_local", "local_commands", "free_port", "exit_now", "parse_coordinator",
           "check_coordinator"]

# A process stopped on a preemption signal after checkpointing (metafam.runs.preemption). EX_TEMPFAIL (sysexits.h): a
# temporary condition; running the same command again continues.
EXIT_PREEMPTED = 75
DEFAULT_TIMEOUT_S = 60
DEFAULT_HEARTBEAT_S = 20
SHUTDOWN_TIMEOUT_S = 24 * 3600


class DistributedError(RuntimeError):
  """A multi-process run could not start or continue (bad arguments, coordinator, or processes that disagree)."""


class PeerFailureError(DistributedError):
  """Another process of the run stopped (killed, crashed, or unreachable) while this one was meta-training."""


# -- arguments ---------------------------------------------------------------------------------------------------------
def parse_coordinator(address: str) -> Tuple[str, int]:
  """``"HOST:PORT"`` -> ``(host, port)``; ValueError naming what is accepted."""
  host, sep, port = str(address).rpartition(":")
  if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
    raise ValueError(f"coordinator {address!r} is not HOST:PORT with a port in 1..65535 (e.g. 127.0.0.1:12345).")
  return host.strip("[]"), int(port)


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
  """Where this process sits in a multi-process run.

  Attributes:
    num_processes: processes in the run (>= 1).
    process_id: this process's index in ``[0, num_processes)``; process 0 hosts the coordinator and writes files.
    coordinator: ``"HOST:PORT"`` of process 0's coordination service (reachable from every process), or ``"auto"``
      to let `jax.distributed.initialize` read the cluster's environment (SLURM, Open MPI, Kubernetes/TPU pods).
    timeout_s: how long to wait for the coordinator and for all processes to connect.
    heartbeat_s: after this long without a heartbeat from a process, the others are told it failed.
  """
  num_processes: int = 1
  process_id: int = 0
  coordinator: Optional[str] = None
  timeout_s: int = DEFAULT_TIMEOUT_S
  heartbeat_s: int = DEFAULT_HEARTBEAT_S

  def __post_init__(self):
    for name in ("num_processes", "timeout_s", "heartbeat_s"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    if self.coordinator == "auto":
      if self.num_processes != 1 or self.process_id != 0:
        raise ValueError("with coordinator='auto' the cluster's environment gives the process count and id; leave "
                         f"num_processes and process_id unset (got {self.num_processes}, {self.process_id}).")
      return
    pid = self.process_id
    if not isinstance(pid, (int, np.integer)) or isinstance(pid, bool) or not 0 <= pid < self.num_processes:
      raise ValueError(f"process_id must be an int in [0, {self.num_processes}) for num_processes="
                       f"{self.num_processes}, got {pid!r}.")
    if self.num_processes > 1 and self.coordinator is None:
      raise ValueError("num_processes > 1 needs a coordinator HOST:PORT (process 0's address, reachable from every "
                       "process), or 'auto' on a cluster.")
    if self.coordinator is not None:
      parse_coordinator(self.coordinator)

  @property
  def distributed(self) -> bool:
    return self.num_processes > 1 or self.coordinator == "auto"


def is_peer_failure(error: BaseException) -> bool:
  """Whether ``error`` (raised by a collective of a multi-process program) says that another process is gone: the
  transport lost its peer (Gloo on CPU, NCCL on GPU) or the coordination service reported a failed task."""
  if not isinstance(error, (jax.errors.JaxRuntimeError, ValueError)):
    return False
  text = str(error)
  return any(word in text for word in ("Gloo", "NCCL", "Connection reset", "Connection closed", "heartbeat",
                                       "coordination service"))


# -- starting ----------------------------------------------------------------------------------------------------------
def check_coordinator(group: ProcessGroup) -> None:
  """Fails fast, before JAX starts its runtime: process 0 needs the coordinator port free on this host; the others
  need it to accept connections within ``group.timeout_s`` (process 0 may start a little later)."""
  if group.coordinator in (None, "auto"):
    return
  host, port = parse_coordinator(group.coordinator)
  if group.process_id == 0:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: a port in TIME_WAIT is free
      try:
        s.bind(("" if family == socket.AF_INET else "::", port))
      except OSError as e:
        raise DistributedError(f"coordinator {group.coordinator}: port {port} is busy on this host ({e.strerror}); "
                               "is another run (or another process 0) using it? Choose a free port.") from None
    return
  deadline = time.monotonic() + group.timeout_s
  while True:
    try:
      with socket.create_connection((host, port), timeout=2.0):
        return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise DistributedError(f"coordinator {group.coordinator} unreachable for {group.timeout_s} s "
                               f"({e.strerror or e}); start process 0 there, or check the address.") from None
      time.sleep(0.25)


def initialize(group: ProcessGroup) -> None:
  """Joins the multi-process run described by ``group`` (a no-op for a single process).

  Must run before JAX is first used. On CPU it selects Gloo collectives (the cross-process reductions of the
  meta-step). Raises `DistributedError` for a busy or unreachable coordinator or processes that do not all connect
  within ``group.timeout_s``.
  """
  if not group.distributed:
    return
  check_coordinator(group)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  # Process 0 may evaluate and write reports long after the others finished and wait at JAX's shutdown barrier; a
  # process that dies meanwhile is still caught by the heartbeat, so the barrier itself may wait long.
  kwargs: Dict[str, Any] = dict(initialization_timeout=group.timeout_s, heartbeat_timeout_seconds=group.heartbeat_s,
                                shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S)
  if group.coordinator != "auto":
    kwargs.update(coordinator_address=group.coordinator, num_processes=group.num_processes,
                  process_id=group.process_id)
  try:
    jax.distributed.initialize(**kwargs)
  except (RuntimeError, ValueError) as e:  # XlaRuntimeError is a RuntimeError
    message = " ".join(str(e).split())[:300]
    raise DistributedError(f"could not join the run through coordinator {group.coordinator}: {message}") from None


def is_main_process() -> bool:
  """True on process 0 (and in a single-process run): the process that writes files and prints reports."""
  return jax.process_index() == 0


# -- agreeing ----------------------------------------------------------------------------------------------------------
def _gather_bytes(data: bytes) -> List[bytes]:
  """Every process's ``data``, in process order (a collective: all processes must call it)."""
  from jax.experimental import multihost_utils
  sizes = np.asarray(multihost_utils.process_allgather(np.asarray([len(data)], np.int32))).reshape(-1)
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:len(data)] = np.frombuffer(data, np.uint8)
  rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
  return [bytes(row[:n]) for row, n in zip(rows, sizes)]


def raise_if_any(error: Optional[BaseException]) -> None:
  """Raises on *every* process when ``error`` is set on any (a collective).

  A process with its own ``error`` raises it; the others raise `DistributedError` quoting the first failing process,
  so a check that only process 0 can make (e.g. reading the checkpoint) stops the whole run the same way.
  """
  if jax.process_count() == 1:
    if error is not None:
      raise error
    return
  messages = _gather_bytes(b"" if error is None else " ".join(str(error).split()).encode())
  if error is not None:
    raise error
  for pid, message in enumerate(messages):
    if message:
      raise DistributedError(f"process {pid} stopped the run: {message.decode()}")


def check_same_everywhere(values: Dict[str, Any], what: str = "settings") -> None:
  """Raises `DistributedError` on every process unless all processes passed equal JSON-able ``values``.

  A collective (every process must call it, with the same ``what``); the message names the differing keys and the
  processes that differ from process 0.
  """
  if jax.process_count() == 1:
    return
  mine = json.dumps(values, sort_keys=True, default=str).encode()
  everyone = [json.loads(b) for b in _gather_bytes(mine)]
  reference = everyone[0]
  problems = []
  for pid, other in enumerate(everyone[1:], start=1):
    keys = sorted(k for k in set(reference) | set(other) if reference.get(k) != other.get(k))
    if keys:
      shown = ", ".join(f"{k}={other.get(k)!r} (process 0: {reference.get(k)!r})" for k in keys)
      problems.append(f"process {pid}: {shown}")
  if problems:
    raise DistributedError(f"the processes were given different {what}; every process must get the same ones. "
                           + "; ".join(problems))


# -- host copies of global state ---------------------------------------------------------------------------------------
def _is_key(x: Any) -> bool:
  return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _map_keys(fn, tree: Any) -> Any:
  """``fn`` applied to every leaf, PRNG key arrays through their raw data (collectives do not take key types)."""
  def one(x):
    if _is_key(x):
      return jax.random.wrap_key_data(fn(jax.random.key_data(x)), impl=jax.random.key_impl(x))
    return fn(x)
  return jax.tree.map(one, tree)


def to_host(tree: Any) -> Any:
  """``tree`` with every array as a numpy array of its *global* value (keys stay keys, on the host's device).

  Arrays split over several processes are gathered (a collective: every process must call it); replicated ones and
  process-local ones are copied (so for a replicated tree, e.g. theta, one process may call it alone). Use it before
  computing on one process alone with arrays of a multi-process run: a global array in a one-process computation
  would wait for the other processes forever.
  """
  from jax.experimental import multihost_utils

  def host(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      if x.is_fully_replicated:  # this process holds it all: no collective needed
        return np.asarray(x.addressable_data(0))
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
  return _map_keys(host, tree)


def from_main_process(tree: Any) -> Any:
  """Process 0's ``tree`` on every process (numpy leaves; a collective). The other processes pass a tree of the
  same structure, shapes and dtypes (e.g. their own fresh state); its values are ignored."""
  if jax.process_count() == 1:
    return tree
  from jax.experimental import multihost_utils
  host = to_host(tree)
  return _map_keys(lambda x: np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(x))), host)


def broadcast_flag(value: bool) -> bool:
  """Process 0's ``value`` on every process (a collective)."""
  if jax.process_count() == 1:
    return bool(value)
  from jax.experimental import multihost_utils
  return bool(multihost_utils.broadcast_one_to_all(np.asarray(value, np.int32)))


def exit_now(code: int) -> None:
  """Ends the process with ``code`` at once, flushing stdio first.

  After `PeerFailureError`, JAX's exit hook would wait at a shutdown barrier the dead process never reaches, then
  abort with a stack trace; a command-line program that has reported the error leaves without it.
  """
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


# -- local launcher ----------------------------------------------------------------------------------------------------
def free_port() -> int:
  """A TCP port on 127.0.0.1 that nobody listens on right now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def local_commands(argv: Sequence[str], num_processes: int, port: Optional[int] = None) -> List[List[str]]:
  """The command lines `launch_local` runs: ``python -m metafam ARGV --num_processes N --process_id I
  --coordinator 127.0.0.1:PORT`` for each I."""
  if not isinstance(num_processes, int) or isinstance(num_processes, bool) or num_processes < 1:
    raise ValueError(f"num_processes must be a positive int, got {num_processes!r}.")
  port = free_port() if port is None else port
  return [[sys.executable, "-m", "metafam", *argv, f"--num_processes={num_processes}", f"--process_id={i}",
           f"--coordinator=127.0.0.1:{port}"] for i in range(num_processes)]


def launch_local(argv: Sequence[str], num_processes: int, port: Optional[int] = None,
                 grace_s: float = 30.0) -> int:
  """Runs ``metafam ARGV`` as ``num_processes`` local processes of one run; returns the run's exit code.

  The processes share this terminal. When one exits with an error, the others get ``grace_s`` seconds to notice it
  themselves (they stop at their next meta-step) before they are terminated; the first non-zero exit code is
  returned (0 when all succeed). SIGTERM or Ctrl-C (SIGINT) sent to the launcher is passed on to every process as
  SIGTERM: they agree on a meta-step, checkpoint it and exit (75, see `metafam.runs.preemption`), and the
  launcher returns their code. A process that exits 75 is not a failure: every other process stops at the same
  agreed meta-step, however long its checkpoint takes, so the launcher waits for them (terminating one mid-write
  would lose its report, and on a loaded machine a checkpoint can take longer than ``grace_s``).
  """
  procs = [subprocess.Popen(cmd) for cmd in local_commands(argv, num_processes, port)]

  def forward(signum=None, frame=None):
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)

  previous = signal.signal(signal.SIGTERM, forward) if _in_main_thread() else None
  code, failed_at = 0, None
  try:
    while any(p.poll() is None for p in procs):
      for p in procs:
        rc = p.poll()
        if rc not in (None, 0) and code == 0:
          code = rc
        if rc not in (None, 0, EXIT_PREEMPTED) and failed_at is None:
          failed_at = time.monotonic()
      if failed_at is not None and time.monotonic() - failed_at > grace_s:
        for p in procs:
          if p.poll() is None:
            p.terminate()
      time.sleep(0.1)
  except KeyboardInterrupt:
    forward()
    for p in procs:
      p.wait()
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
  for p in procs:
    if p.returncode != 0 and code == 0:
      code = p.returncode
  return code if code >= 0 else 128 - code  # a signal -N is reported like a shell does (128 + N)


def _in_main_thread() -> bool:
  import threading
  return threading.current_thread() is threading.main_thread()
