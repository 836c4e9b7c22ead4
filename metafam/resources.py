"""Will it fit? The memory a compiled program needs, against what the machine can give, before the work starts.

`program_memory` reads XLA's own buffer assignment of a compiled program (`Compiled.memory_analysis`): its peak
(arguments, outputs and temporaries alive at once; arguments that the program donates to its outputs counted once).
`available_memory` is what the devices can still hold: for an accelerator its allocator's limit minus what is in
use (`Device.memory_stats`); for the CPU the host's, the least of

* ``MemAvailable`` in ``/proc/meminfo`` (free plus reclaimable memory),
* the cgroup's limit minus its usage (containers, SLURM jobs with memory limits): cgroup v2 ``memory.max`` /
  ``memory.current``, or v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``,
* the address-space limit (``RLIMIT_AS``, ``ulimit -v``) minus this process's current virtual size.

`check_fits` raises `InsufficientMemoryError` with both numbers when the program cannot fit. The estimate covers the
one program it is given; a caller that runs several (meta-step and evaluation) checks the larger. Unknown limits
(no ``/proc``, a device without statistics) are not guessed: `available_memory` returns None and nothing is refused.
"""

from __future__ import annotations

import dataclasses
import os
import resource
from typing import Any, Optional, Sequence

__all__ = ["MemoryEstimate", "InsufficientMemoryError", "program_memory", "host_memory_available", "available_memory",
           "check_fits"]

GIB = 2 ** 30


class InsufficientMemoryError(MemoryError):
  """A program's estimated memory exceeds what its devices can give."""


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
  """Bytes of one compiled program, from XLA's buffer assignment, per device."""
  arguments: int
  outputs: int
  aliased: int
  temporaries: int

  @property
  def peak(self) -> int:
    """Arguments + outputs - donated (counted once) + temporaries."""
    return self.arguments + self.outputs - self.aliased + self.temporaries


def program_memory(compiled: Any) -> MemoryEstimate:
  """The `MemoryEstimate` of a ``jax.stages.Compiled`` (e.g. ``jax.jit(f).lower(*shapes).compile()``; lowering with
  ``jax.ShapeDtypeStruct`` arguments allocates nothing)."""
  stats = compiled.memory_analysis()
  if stats is None:
    raise ValueError("this backend reports no memory analysis for compiled programs.")
  return MemoryEstimate(arguments=int(stats.argument_size_in_bytes), outputs=int(stats.output_size_in_bytes),
                        aliased=int(stats.alias_size_in_bytes), temporaries=int(stats.temp_size_in_bytes))


def _read_int(path: str) -> Optional[int]:
  try:
    with open(path) as f:
      text = f.read().strip()
  except OSError:
    return None
  return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _meminfo_available() -> Optional[int]:
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


def _cgroup_available() -> Optional[int]:
  for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                  "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
    limit, usage = _read_int(limit_file), _read_int(usage_file)
    if limit is not None and usage is not None and limit < 2 ** 60:  # v1 writes a huge number for no limit
      return max(limit - usage, 0)
  return None


def _address_space_available() -> Optional[int]:
  soft, _ = resource.getrlimit(resource.RLIMIT_AS)
  if soft == resource.RLIM_INFINITY:
    return None
  try:
    with open("/proc/self/statm") as f:
      used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    used = 0
  return max(soft - used, 0)


def host_memory_available() -> Optional[int]:
  """Bytes this process can still allocate on the host (see the module docstring); None if nothing is known."""
  known = [v for v in (_meminfo_available(), _cgroup_available(), _address_space_available()) if v is not None]
  return min(known) if known else None


def available_memory(device: Any) -> Optional[int]:
  """Bytes ``device`` (a ``jax.Device``) can still hold: the host's for a CPU device, else its allocator's limit
  minus its use; None when unknown."""
  if device.platform == "cpu":
    return host_memory_available()
  stats = device.memory_stats() or {}
  limit = stats.get("bytes_limit")
  return None if limit is None else max(int(limit) - int(stats.get("bytes_in_use", 0)), 0)


def check_fits(estimate: MemoryEstimate, devices: Sequence[Any], what: str = "the program") -> None:
  """Raises `InsufficientMemoryError` when ``estimate`` (per device) exceeds what the first of ``devices`` can
  give. CPU devices of one process share the host: their estimates add up."""
  device = devices[0]
  need = estimate.peak * (sum(d.platform == "cpu" and d.process_index == device.process_index for d in devices)
                          if device.platform == "cpu" else 1)
  have = available_memory(device)
  if have is not None and need > have:
    raise InsufficientMemoryError(
        f"{what} needs about {need / GIB:.2f} GiB ({need:,} bytes, XLA's memory analysis) but only "
        f"{have / GIB:.2f} GiB ({have:,} bytes) are available on {device.platform}; use fewer lanes "
        "(pairs), a smaller model or shorter unrolls, or a machine with more memory.")
