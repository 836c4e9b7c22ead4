"""The first meta-steps of the main job and of every shipped recipe, recorded before issue 63's refactors, and the
script that records and checks them (tests/runs/test_recipe_goldens.py).

Each run is the command line itself, in a child process with JAX's default config and XLA's production flags:
``python -m metafam meta-train [--recipe NAME] --num_steps N --meta_lr_decay_steps 6000 --noreport`` into a fresh
directory (the meta-learning-rate schedule pinned to the full run's, so that it does not follow the short
``--num_steps``). Its checkpoint's arrays (theta, the meta-optimizer state, the estimators' lanes: every leaf; the
header, which records the run's identity and versions, aside) and the meta-losses of ``metrics.jsonl`` are the
record, each array as its dtype, shape and SHA-256 of its bytes (the arrays themselves are 15 MB). The record made on
e012da3 (before the learned-optimizer contract and the run package; the main job's arrays were checked identical to
056da22's) is ``tests/data/recipe_goldens.json``.

The main job's ``summary.json`` (3 meta-steps, then its closing comparison with tuned Adam) is checked too, in every
field that issue 61 did not redefine on purpose (it replaced the speedup and added the profile score, loss ratio and
gain): the meta-losses, the step counts, the evaluation's setup, the learned optimizer's and tuned Adam's final and
mean losses per instance, Adam's tuned rate and selection scores (`SUMMARY_FIELDS`). Its record,
``tests/data/main_job_summary_golden.json``, was made on 056da22 itself: ``python -m metafam meta-train --num_steps 3
--meta_lr_decay_steps 6000 --output_dir DIR`` at that commit, then ``python tests/recipe_goldens.py --summary_of DIR``.

XLA's float32 results follow the host's CPU, so a host may have records of its own (tests/golden_hosts.py: which
records a host is held to, and what is compared on a host with none).

    python tests/recipe_goldens.py                # records the reference (with PYTHONPATH at the commit to record)
    python tests/recipe_goldens.py --record_host  # records this host's (tests/data/hosts/KEY/), summary included
    python tests/recipe_goldens.py --check        # compares: exit status 1 and the differences if any
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, Tuple

import numpy as np

NAME, SUMMARY_NAME = "recipe_goldens.json", "main_job_summary_golden.json"
GOLDENS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", NAME)  # the reference records
SUMMARY_GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", SUMMARY_NAME)
SUMMARY_STEPS = 3
# summary.json's fields that must not change: paths of keys, "*" for each optimizer of the evaluation.
SUMMARY_FIELDS = (
    ("meta_steps",), ("inner_steps_total",), ("meta_loss_first_10",), ("meta_loss_last_10",),
    ("eval", "family"), ("eval", "inner_steps"), ("eval", "select_split"), ("eval", "smoothing"), ("eval", "split"),
    ("eval", "tasks"), ("eval", "adam", "lr"), ("eval", "adam", "select_scores"),
    ("eval", "adam", "final_loss"), ("eval", "adam", "final_loss_per_instance"), ("eval", "adam", "mean_loss"),
    ("eval", "learned", "*", "final_loss"), ("eval", "learned", "*", "final_loss_per_instance"),
    ("eval", "learned", "*", "mean_loss"),
)
# On a host without a record of its own: 18 times the largest cross-host difference measured (5.4e-6 of the
# generalist's second meta-loss, after one meta-update: Adam's first step is lr * sign(g) wherever |g| is near
# eps, so the rounding of a tiny meta-gradient entry moves theta by the whole step there; 2.5e-6 of the summary's
# per-instance losses, after the evaluation's inner training).
RTOL = 1e-4
RUNS = {  # name -> (flags, meta-steps)
    "main_job": ((), 3),
    "generalist": (("--recipe=generalist",), 2),
    "generalist_v2": (("--recipe=generalist_v2",), 2),
}


def fingerprint(array: np.ndarray) -> str:
  """``"dtype shape sha256"`` of an array's bytes (C order)."""
  a = np.ascontiguousarray(array)
  return f"{a.dtype} {'x'.join(map(str, a.shape))} {hashlib.sha256(a.tobytes()).hexdigest()}"


def run(flags, num_steps: int) -> Dict[str, np.ndarray]:
  """``{array name: array}`` of the run's checkpoint (its header aside), plus ``meta_loss``: the meta-losses of its
  metrics.jsonl."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "run")
    cmd = [sys.executable, "-m", "metafam", "meta-train", *flags, f"--num_steps={num_steps}",
           "--meta_lr_decay_steps=6000", "--noreport", "--progress=false", f"--output_dir={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
      raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    with np.load(os.path.join(out, "checkpoint.npz"), allow_pickle=False) as f:
      arrays = {k: np.asarray(f[k]) for k in f.files if k != "metafam_header"}
    with open(os.path.join(out, "metrics.jsonl")) as f:
      losses = [json.loads(line).get("meta_loss") for line in f if line.strip()]
    arrays["meta_loss"] = np.asarray([np.nan if v is None else v for v in losses], np.float64)
    return arrays


def summary_fields(summary: Dict) -> Dict[str, object]:
  """``{"eval/adam/lr": value, ...}``: the `SUMMARY_FIELDS` of a summary.json's content."""
  out = {}

  def walk(node, path, done):
    if not path:
      out["/".join(done)] = node
    elif path[0] == "*":
      for key in sorted(node):
        walk(node[key], path[1:], done + (key,))
    else:
      walk(node[path[0]], path[1:], done + (path[0],))

  for field in SUMMARY_FIELDS:
    walk(summary, field, ())
  return out


def main_job_summary() -> Dict[str, object]:
  """`summary_fields` of the main job run for `SUMMARY_STEPS` meta-steps with its closing report."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "run")
    cmd = [sys.executable, "-m", "metafam", "meta-train", f"--num_steps={SUMMARY_STEPS}", "--meta_lr_decay_steps=6000",
           "--progress=false", f"--output_dir={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
      raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(out, "summary.json")) as f:
      return summary_fields(json.load(f))


def record() -> Dict[str, Dict[str, str]]:
  """``{run: {array name: fingerprint}}``, the meta-losses also as their exact values (``meta_loss_values``)."""
  out = {}
  for name, (flags, steps) in RUNS.items():
    arrays = run(flags, steps)
    out[name] = {k: fingerprint(v) for k, v in arrays.items()}
    out[name]["meta_loss_values"] = [float(v) for v in arrays["meta_loss"]]
  return out


def _numeric(value) -> bool:
  values = value if isinstance(value, list) else [value]
  return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) and bool(values)


def compare(got: Dict, want: Dict, got_summary: Dict, want_summary: Dict, exact: bool) -> Tuple[list, float]:
  """``(difference lines, largest relative difference)``. ``exact``: every record and field bit for bit. Otherwise
  (a host without a record of its own) the numbers that can be compared to a tolerance are: the meta-losses
  (``meta_loss_values``) and the summary's numeric fields, to `RTOL` of their scale; the other fields
  must be equal, and the arrays' SHA-256 fingerprints are not compared."""
  import golden_hosts as H
  bad, largest = [], 0.0
  for run in sorted(set(want) | set(got)):
    for k in sorted(set(want.get(run, {})) | set(got.get(run, {}))):
      a, b = got.get(run, {}).get(k), want.get(run, {}).get(k)
      if exact or a is None or b is None:
        if a != b:
          bad.append(f"differs: {run}/{k}")
      elif k == "meta_loss_values":
        largest = max(largest, H.relative_difference(a, b))
  for k in sorted(set(want_summary) | set(got_summary)):
    a, b = got_summary.get(k), want_summary.get(k)
    if not exact and a is not None and b is not None and _numeric(a) and _numeric(b):
      largest = max(largest, H.relative_difference(a, b))
    elif a != b:
      bad.append(f"summary.json differs: {k}: {b!r} != {a!r}"[:300])
  if not exact and largest > RTOL:
    bad.append(f"largest difference {largest:.3g} of a number's scale (tolerance {RTOL:g} on a host without a "
               f"record of its own, {H.host_key()})")
  return bad, largest


def main(argv) -> int:
  import golden_hosts as H
  from metafam.io import write_json
  if "--summary_of" in argv:  # records the summary golden from a run directory (made at the commit to record)
    with open(os.path.join(argv[argv.index("--summary_of") + 1], "summary.json")) as f:
      write_json(SUMMARY_GOLDEN, summary_fields(json.load(f)))
    print(f"wrote {SUMMARY_GOLDEN}")
    return 0
  if argv not in ([], ["--check"], ["--record_host"]):
    print(f"usage: {sys.argv[0]} [--check | --record_host | --summary_of DIR]")
    return 2
  got = record()
  if "--check" not in argv:
    path = H.host_record(NAME) if argv == ["--record_host"] else GOLDENS
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, got)
    print(f"wrote {path}: {sum(map(len, got.values()))} records")
    if argv == ["--record_host"]:
      write_json(H.host_record(SUMMARY_NAME), main_job_summary())
      print(f"wrote {H.host_record(SUMMARY_NAME)}\n-> {H.write_host_json(H.HOW)}")
    return 0
  got_summary = main_job_summary()
  own = H.own_record(NAME)
  with open(own or GOLDENS) as f:
    want = json.load(f)
  with open(H.host_record(SUMMARY_NAME) if own else SUMMARY_GOLDEN) as f:
    want_summary = json.load(f)
  bad, _ = compare(got, want, got_summary, want_summary, exact=True)
  notes = [f"{sum(map(len, want.values()))} records and {len(want_summary)} summary.json fields of {own or GOLDENS}"]
  if bad and not own:
    shown = bad
    bad, largest = compare(got, want, got_summary, want_summary, exact=False)
    if not bad:
      notes.append(f"{len(shown)} differ in their last bits")
      notes.append(H.unrecorded_line(largest, RTOL) + " The checkpoint arrays' fingerprints were not compared.")
  for line in bad[:20]:
    print(line)
  print("\n".join(notes + ([f"{len(bad)} differ"] if bad else ["bit-identical"] if len(notes) == 1 else [])))
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
