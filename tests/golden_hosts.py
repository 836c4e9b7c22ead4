"""Which host a golden record belongs to, and how a record is compared on a host that has none of its own.

XLA compiles a program for the CPU it runs on: its instruction set decides the vector code, the vector math of ``exp``,
``tanh`` and ``rsqrt``, and whether multiplies and adds fuse; Eigen's matrix products block by the host's caches and
threads. So float32 results agree bit for bit between runs on one kind of host, and differ in the last bits between
kinds (measured between the project's two CI hosts: at most 2.6e-7 of an array's scale after three learned-optimizer
updates).

The goldens (tests/lopt_goldens.py, tests/recipe_goldens.py) are therefore kept per host:

- ``tests/data/<file>``: the reference records, made on e012da3 (and 056da22) on the project's first CI host, before
  issue 63's refactors. That host's key (`host_key`) was not recorded.
- ``tests/data/hosts/<key>/<file>``: a record made on the host with that key, with ``host.json`` (its `host`, the commit
  and how it was made). A host with a record of its own must reproduce it bit for bit.

On a host without a record of its own, a check passes if it reproduces the reference bit for bit; otherwise it compares
with the reference to a tolerance of each array's scale (`RTOL`, `close`) and says so in a line starting with
`UNRECORDED`, which the tests turn into a warning: ``python tests/<script> --record_host`` records this host.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from typing import Dict, Optional

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
# 40 times the largest cross-host difference measured in lopt_goldens (2.6e-7 of an array's scale, after three
# updates); the changes these checks exist to catch (a feature, a decay, a learning rate) move the numbers by 1e-3
# or more of their scale. Longer computations differ more between hosts: recipe_goldens sets its own.
RTOL = 1e-5
UNRECORDED = "UNRECORDED"
HOW = ("PYTHONPATH=. python tests/lopt_goldens.py --record_host; python tests/recipe_goldens.py --record_host "
       "(JAX's default config, XLA_FLAGS empty)")


def _cpu() -> Dict[str, object]:
  info: Dict[str, str] = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if not line.strip():
          break  # the first processor's block
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
  except OSError:
    pass
  return {"model": info.get("model name", platform.processor()),
          "family": info.get("cpu family", ""), "model_number": info.get("model", ""),
          "flags": sorted(info.get("flags", "").split())}


def host() -> Dict[str, object]:
  """What decides a program's float32 results on this machine: the CPU (name, family, model, flags), its thread
  count and the versions of the libraries that compile and run it."""
  import jax
  import jaxlib
  return {"machine": platform.machine(), "cpu": _cpu(), "cpu_count": os.cpu_count(), "jax": jax.__version__,
          "jaxlib": jaxlib.__version__, "numpy": np.__version__}


def host_key(description: Optional[Dict[str, object]] = None) -> str:
  """12 hex digits of the SHA-256 of `host` (a change of any of its parts is another host)."""
  text = json.dumps(host() if description is None else description, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def host_record(name: str, key: Optional[str] = None) -> str:
  """The path of this host's (or ``key``'s) record ``name``."""
  return os.path.join(DATA, "hosts", key or host_key(), name)


def reference_record(name: str) -> str:
  return os.path.join(DATA, name)


def own_record(name: str) -> Optional[str]:
  """This host's record ``name`` if it has one."""
  path = host_record(name)
  return path if os.path.exists(path) else None


def write_host_json(how: str) -> str:
  """Writes this host's ``host.json``: `host`, the commit of the working tree and ``how`` the records were made."""
  from metafam.io import write_json
  root = os.path.dirname(os.path.dirname(DATA))
  try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                            check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    commit = "unknown"
  path = host_record("host.json")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  write_json(path, {"host": host(), "commit": commit, "how": how})
  return path


def relative_difference(got, want, scale: Optional[float] = None) -> float:
  """``max |got - want|`` over ``scale`` (by default ``max |want|``; at least float32's smallest normal): the
  difference at the scale of the expected array (inf if the shapes differ or the non-finite entries do not match)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if got.shape != want.shape:
    return float("inf")
  if not np.array_equal(np.isfinite(got), np.isfinite(want)):
    return float("inf")
  finite = np.isfinite(want)
  if not np.array_equal(got[~finite], want[~finite], equal_nan=True):
    return float("inf")  # inf of the other sign
  if not finite.any():
    return 0.0
  scale = max(float(np.max(np.abs(want[finite]))) if scale is None else scale, float(np.finfo(np.float32).tiny))
  return float(np.max(np.abs(got[finite] - want[finite]))) / scale


def close(got, want, rtol: float = RTOL) -> bool:
  """Whether ``got`` is ``want`` to ``rtol`` of its scale (`relative_difference`)."""
  return relative_difference(got, want) <= rtol


def unrecorded_line(largest: float, rtol: float = RTOL) -> str:
  """The line a check prints when this host has no record and differs from the reference within ``rtol``."""
  return (f"{UNRECORDED}: host {host_key()} ({_cpu()['model']}, {os.cpu_count()} CPUs) has no record of its own; "
          f"the reference record, made on another host, is matched to {largest:.2g} of each array's scale "
          f"(tolerance {rtol:g}), not bit for bit. `--record_host` records this host.")
