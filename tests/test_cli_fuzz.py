"""Fuzzing the command line: every bad invocation is one `metafam: error:` line, exit code 2, nothing changed.

One tiny meta-training run and one tiny evaluation are made once (module fixture); each bad invocation then points
at them (as output directory, checkpoint or conversion target) and the test compares a snapshot of every file
under the workspace (names and SHA-256 hashes) before and after: a refused command must not create, change or
remove anything.
"""

import hashlib
import os
import pickle
import re
import subprocess
import sys

import pytest

from metafam import cli
from metafam.runs.run_dir import CHECKPOINT_NAME

TINY = ["--family=quadratic_family_10", "--optimizer=learnable_sgd", "--estimator=pes", "--num_tasks=2",
        "--unroll_length=5", "--trajectory_length=10", "--eval_tasks=2", "--eval_steps=10", "--sigma=0.05",
        "--checkpoint_every=2", "--progress=false"]
EVAL = ["--optimizer=adam", "--task=quadratic_10", "--inner_steps=16", "--seeds=1", "--progress=false"]


def _call(args, capsys):
  code = cli.main(["metafam"] + args)
  out = capsys.readouterr()
  return code, out.out, out.err


def _snapshot(root):
  """``{relative path: sha256}`` of every file under ``root`` (directories as entries too)."""
  snap = {}
  for d, dirs, files in os.walk(root):
    for name in dirs:
      snap[os.path.relpath(os.path.join(d, name), root) + "/"] = "dir"
    for name in files:
      path = os.path.join(d, name)
      with open(path, "rb") as f:
        snap[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return snap


@pytest.fixture(autouse=True)
def _no_persistent_cache(monkeypatch):
  monkeypatch.setenv("METAFAM_JAX_CACHE", "")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
  """A directory holding an earlier meta-train run, an earlier evaluation, a regular file and odd checkpoints."""
  root = tmp_path_factory.mktemp("fuzz")
  run_dir, eval_dir = root / "run", root / "eval"
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("METAFAM_JAX_CACHE", "")
    assert cli.main(["metafam", "meta-train", "--num_steps=2", f"--output_dir={run_dir}"] + TINY) == 0
    assert cli.main(["metafam", "evaluate", f"--output_dir={eval_dir}"] + EVAL) == 0
  (root / "a_file").write_text("not a directory\n")
  (root / "garbage.ckpt").write_bytes(b"\x00\x01 definitely not a checkpoint")
  with open(root / "benign.pkl", "wb") as f:  # a benign pickle: the loaders must refuse it without unpickling
    pickle.dump({"metadata": {}, "tree": {"log_lr": 0.0}}, f)
  return root


def _unwritable(root):
  """A directory that cannot be created: under /proc for root (who may write anywhere else), else a 0500 dir."""
  if hasattr(os, "geteuid") and os.geteuid() == 0:
    return "/proc/metafam-fuzz/out"
  locked = root / "locked"
  locked.mkdir(exist_ok=True)
  os.chmod(locked, 0o500)
  return str(locked / "out")


def bad_invocations(root):
  """(args, regex the error must match); ``root`` is the workspace."""
  run, ev, ckpt = f"{root}/run", f"{root}/eval", f"{root}/run/{CHECKPOINT_NAME}"
  file_, garbage, pickled = f"{root}/a_file", f"{root}/garbage.ckpt", f"{root}/benign.pkl"
  locked = _unwritable(root)
  mt = ["meta-train", f"--output_dir={run}"]
  evl = ["evaluate", f"--output_dir={root}/new_eval"]
  return [
      # non-finite and out-of-range numbers
      (mt + ["--sigma=nan"], "--sigma=nan: must be a finite number"),
      (mt + ["--sigma=inf"], "--sigma=inf"),
      (mt + ["--sigma=-inf"], "--sigma=-inf"),
      (mt + ["--meta_learning_rate=nan"], "--meta_learning_rate=nan: must be a finite number"),
      (mt + ["--clip_grad_norm=nan"], "--clip_grad_norm=nan: must be a finite number"),
      (mt + ["--clip_grad_norm=-1"], "--clip_grad_norm=-1"),
      (mt + ["--seed=100000000000000000000"], "--seed=100000000000000000000"),
      (mt + ["--seed=-1"], "--seed=-1"),
      (mt + ["--trajectory_length=3000000000"], "--trajectory_length=3000000000"),
      (mt + ["--num_steps=0"], r"--num_steps=0: 0 is not an integer in the range \[1, 2147483647\]"),
      (mt + ["--num_tasks=0"], "--num_tasks=0"),
      (mt + ["--num_tasks=many"], "num_tasks"),
      (mt + ["--num_tasks=100000000"], "--num_tasks=100000000"),
      (mt + ["--unroll_length=1.5"], "unroll_length"),
      (mt + ["--eval_steps=-5"], "--eval_steps=-5"),
      (mt + ["--checkpoint_every=0"], "--checkpoint_every=0"),
      (mt + ["--devices=0"], "--devices=0"),
      (mt + ["--seed="], "--seed"),
      (mt + ["--tensorboard=maybe"], "tensorboard"),
      # names
      (mt + ["--family=nope"], "unknown family 'nope'; valid names: .*fmnist_mlp_family_8x8_32"),
      (mt + ["--estimator=es"], "unknown estimator 'es'; valid names: full_es, nres, pes"),
      (mt + ["--optimizer=adam"], "unknown learned optimizer .*'adam'; valid names: "),
      (mt + ["--task=quadratic_10"], "meta-train does not take --task; its flags: --family"),
      (["meta-train", "extra"], "meta-train takes no arguments; got extra"),
      # output directories
      (["meta-train", f"--output_dir={file_}"] + TINY, "exists and is not a directory"),
      (["meta-train", f"--output_dir={file_}/sub"] + TINY, "cannot be created: .*a_file' is a file"),
      (["meta-train", f"--output_dir={locked}"] + TINY, "cannot be (written|created)|not writable"),
      (["meta-train", "--num_steps=4", "--seed=1", f"--output_dir={run}"] + TINY, "belongs to a different run"),
      (["meta-train", "--output_dir="] + TINY, "--output_dir must not be empty"),
      # evaluate
      (["evaluate", f"--output_dir={ev}", "--learning_rate=nan"] + EVAL[1:],
       "--learning_rate=nan: must be a finite number"),
      (evl + ["--learning_rate=inf"] + EVAL, "--learning_rate=inf"),
      (["evaluate", f"--output_dir={ev}"] + EVAL, f"--output_dir '{re.escape(ev)}' already holds results "
       r"\(custom.json.*pass --overwrite"),
      (["evaluate", f"--output_dir={file_}/sub"] + EVAL, "cannot be created: .*is a file"),
      (["evaluate", f"--output_dir={file_}"] + EVAL, "exists and is not a directory"),
      (["evaluate", f"--output_dir={locked}"] + EVAL, "cannot be (written|created)|not writable"),
      (evl + ["--optimizer=adamax"],
       "unknown optimizer 'adamax'; valid names: adafac_mlp_lopt, adafac_muon_mlp_lopt, adafac_muon_rms_lopt, "
       "adafactor, adam, adamw, ademamix, hyper_v2, learnable_adam"),
      (evl + ["--optimizer=adam", "--task=resnet"], "unknown task 'resnet'; valid names: .*fmnist_mlp_8x8_32"),
      (evl + ["--optimizer=adam", "--suite=tiny", "--task=quadratic_10"], "give --task or --suite, not both"),
      (evl + ["--optimizer=mlp_lopt", "--task=quadratic_10"], "is a learned optimizer: give its meta-parameters"),
      (evl + ["--optimizer=learnable_sgd", f"--checkpoint={root}/missing"], "--checkpoint .*: no such file"),
      (evl + ["--optimizer=mlp_lopt", f"--checkpoint={ckpt}", "--task=quadratic_10"], "does not hold mlp_lopt"),
      (evl + ["--optimizer=learnable_sgd", f"--checkpoint={garbage}", "--task=quadratic_10"],
       "not a .*checkpoint|corrupted"),
      (evl + ["--optimizer=learnable_sgd", f"--checkpoint={pickled}", "--task=quadratic_10"],
       "is a pickle"),
      (evl + ["--optimizer=adam", "--task=quadratic_10", "--seeds=0"], "--seeds=0"),
      (evl + ["--optimizer=adam", "--task=quadratic_10", "--inner_steps=3000000000"], "--inner_steps=3000000000"),
      (evl + EVAL + ["--num_tasks=4"], "evaluate does not take --num_tasks"),
      (["evaluate", "twice"] + EVAL, "evaluate takes no arguments"),
      # benchmark
      (["benchmark", f"--output_dir={ev}", "--task=quadratic_10"], "already holds results"),
      (["benchmark", f"--output_dir={root}/b", "--suite=huge"], "unknown suite 'huge'; valid names: .*tiny"),
      (["benchmark", f"--output_dir={root}/b", "--learning_rate=nan"], "--learning_rate=nan"),
      (["benchmark", f"--output_dir={root}/b", "--optimizer=sgd", f"--checkpoint={ckpt}"],
       "--checkpoint holds a learned optimizer"),
      (["benchmark", f"--output_dir={root}/b", "--sigma=0.1"], "benchmark does not take --sigma"),
      # list, the command itself
      (["list", "--seed=3"], "list does not take --seed; its flags: none"),
      (["list", "everything"], "list takes no arguments"),
      ([], "expected one command from meta-train, evaluate, benchmark, list"),
      (["train"], "expected one command from .*; got train"),
      (["meta-train", "--no_such_flag=1"], "no_such_flag"),
  ]


def test_at_least_forty_bad_invocations(tmp_path):
  assert len(bad_invocations(tmp_path)) >= 40


def test_every_bad_invocation_is_one_line_exit_2_and_changes_nothing(workspace, capsys):
  before = _snapshot(workspace)
  assert any(name.endswith(CHECKPOINT_NAME) for name in before) and "eval/custom.json" in before
  failures = []
  for args, pattern in bad_invocations(workspace):
    try:
      code, _, err = _call(args, capsys)
    except BaseException as e:  # an uncaught exception is a traceback for the user  # noqa: B036
      failures.append(f"{args}: raised {type(e).__name__}: {e}")
      continue
    lines = err.strip().splitlines()
    if code != 2 or len(lines) != 1 or not lines[0].startswith("metafam: error: ") or "Traceback" in err:
      failures.append(f"{args}: exit {code}, stderr {err!r}")
    elif not re.search(pattern, lines[0]):
      failures.append(f"{args}: {lines[0]!r} does not match {pattern!r}")
    after = _snapshot(workspace)
    if after != before:
      changed = sorted(set(before.items()) ^ set(after.items()))
      failures.append(f"{args}: changed {changed}")
      before = after
  assert not failures, "\n".join(failures)


def test_bad_invocations_in_a_fresh_process_print_no_traceback(workspace):
  env = dict(os.environ, METAFAM_JAX_CACHE="")
  for args in (["meta-train", "--clip_grad_norm=nan"], ["meta-train", f"--output_dir={workspace}/a_file/x"]):
    proc = subprocess.run([sys.executable, "-m", "metafam"] + args, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("metafam: error: ")


def test_help_lists_commands_and_each_commands_flags_with_defaults(capsys):
  for args in (["--help"], ["-h"]):
    code, out, err = _call(args, capsys)
    assert code == 0 and not err
    for command in cli.COMMANDS:
      assert re.search(rf"^  {command} ", out, re.M), out
  code, out, _ = _call(["meta-train", "--help"], capsys)
  assert code == 0
  assert "--num_steps=6000" in out and "--meta_lr_decay_steps=6000" in out and "--sigma=0.01" in out
  assert "--seed=0" in out and "--task" not in out
  code, out, _ = _call(["evaluate", "--help"], capsys)
  assert code == 0 and "--overwrite=false" in out and "--inner_steps=200" in out and "--num_tasks" not in out


def test_overwrite_replaces_earlier_results(workspace, capsys):
  ev = workspace / "eval_again"
  assert _call(["evaluate", f"--output_dir={ev}"] + EVAL, capsys)[0] == 0
  first = _snapshot(ev)
  code, _, err = _call(["evaluate", f"--output_dir={ev}"] + EVAL, capsys)
  assert code == 2 and "--overwrite" in err and _snapshot(ev) == first
  code, _, err = _call(["evaluate", f"--output_dir={ev}", "--overwrite", "--inner_steps=8"] + EVAL[:2] +
                       EVAL[3:], capsys)
  assert code == 0, err
  assert _snapshot(ev)["custom_tasks.csv"] != first["custom_tasks.csv"]
