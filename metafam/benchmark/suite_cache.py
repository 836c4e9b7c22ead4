"""The cache of `evaluate_suite`'s runs: one JSON file per finished task (its seed curves, the tuned setting, the
seconds it took, when it finished, and the identity of the evaluation that wrote it), read back instead of retrained
when the identity matches and refused with the differing fields when it does not.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np


def utc_now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def theta_fingerprint(candidate: Any) -> Optional[str]:
  """SHA-256 of a ``(learned optimizer, theta)`` candidate's meta-parameters (of the checkpoint file's bytes when
  theta is a path), with the learned optimizer's class; None for other candidates."""
  if not isinstance(candidate, tuple) or len(candidate) != 2:
    return None
  import hashlib
  lopt, theta = candidate
  digest = hashlib.sha256(type(lopt).__qualname__.encode())
  if isinstance(theta, (str, os.PathLike)):
    with open(theta, "rb") as f:
      digest.update(f.read())
  else:
    import jax
    for path, leaf in jax.tree_util.tree_flatten_with_path(theta)[0]:
      leaf = np.asarray(leaf)
      digest.update(f"{jax.tree_util.keystr(path)}:{leaf.dtype}:{leaf.shape}".encode())
      digest.update(np.ascontiguousarray(leaf).tobytes())
  return digest.hexdigest()


# A rate grid such as 10 ** (k / 2) comes out an ulp apart on CPUs whose libm rounds differently (seen: AVX2 and
# AVX-512 machines, 0.0316227766016838 against 0.03162277660168379), so a cache file moved between machines must still
# match; any real change of a setting moves a number by far more than this relative tolerance.
IDENTITY_RTOL = 1e-12


def same_identity(a: Any, b: Any) -> bool:
  """Whether two JSON-like identities are equal, floats up to `IDENTITY_RTOL` (everything else exactly)."""
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(same_identity(a[k], b[k]) for k in a)
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return len(a) == len(b) and all(same_identity(x, y) for x, y in zip(a, b))
  if isinstance(a, float) or isinstance(b, float):
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return numbers and math.isclose(a, b, rel_tol=IDENTITY_RTOL, abs_tol=0.0)
  return a == b


def read_cached_task(path: str) -> Tuple[Dict[str, Any], np.ndarray, Any, float, Optional[str]]:
  """``(identity, seed curves, setting, seconds, trained_at)`` of one file `evaluate_suite` wrote to a cache_dir."""
  try:
    with open(path) as f:
      record = json.load(f)
    stored = record["identity"]
    seed_curves = np.asarray([[np.nan if v is None else v for v in row] for row in record["curves"]], np.float64)
    setting, seconds, finished = record["setting"], float(record["seconds"]), record.get("trained_at")
    if not isinstance(stored, dict):
      raise TypeError("its identity is not an object")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"cache_dir: {path} is not a cached task of evaluate_suite ({e}); remove it to retrain the "
                     "task.") from None
  return stored, seed_curves, setting, seconds, finished


def cached_task(path: Optional[str], identity: Optional[Dict[str, Any]],
                 train: Callable[[], Tuple[np.ndarray, Any]]) -> Tuple[np.ndarray, Any, float, Optional[str]]:
  """``(seed curves, setting, seconds it took to train, when it finished training (UTC; None if the cached file
  predates that record))`` of one task: read from ``path`` when that file was written by the same evaluation
  (``identity``), else trained (and written there unless ``path`` is None)."""
  from metafam.io import write_json
  if path is not None and os.path.exists(path):
    stored, seed_curves, setting, seconds, finished = read_cached_task(path)
    if not same_identity(stored, identity):
      differ = sorted(k for k in set(stored) | set(identity) if not same_identity(stored.get(k), identity.get(k)))
      raise ValueError(f"cache_dir: {path} was written by another evaluation (it differs in {differ}); use another "
                       "cache directory for this candidate or setting.")
    return seed_curves, setting, seconds, finished
  start = time.perf_counter()
  seed_curves, setting = train()
  seconds, finished = time.perf_counter() - start, utc_now()
  if path is None:
    return np.asarray(seed_curves, np.float64), setting, seconds, finished
  rows = [[float(v) if np.isfinite(v) else None for v in row] for row in np.asarray(seed_curves, np.float64)]
  write_json(path, {"identity": identity, "curves": rows, "setting": setting, "seconds": seconds,
                    "trained_at": finished})
  return np.asarray(seed_curves, np.float64), setting, seconds, finished
