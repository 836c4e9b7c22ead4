"""The command line end to end on tiny settings, resuming, and every kind of bad input."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from metafam import cli

TINY = ["--family=quadratic_family_10", "--optimizer=learnable_sgd", "--estimator=pes", "--num_tasks=2",
        "--unroll_length=5", "--trajectory_length=10", "--eval_tasks=2", "--eval_steps=10", "--sigma=0.05",
        "--checkpoint_every=2", "--progress=false"]


def run(args, capsys):
  code = cli.main(["metafam"] + args)
  out = capsys.readouterr()
  return code, out.out, out.err


@pytest.fixture(autouse=True)
def _no_persistent_cache(monkeypatch):
  monkeypatch.setenv("METAFAM_JAX_CACHE", "")


def test_list(capsys):
  code, out, _ = run(["list"], capsys)
  assert code == 0
  lines = out.splitlines()
  assert "  fmnist_mlp_8x8_32" in lines and "  pes" in lines and "  mlp_lopt" in lines
  assert lines[lines.index("recipes:") + 1] == "  generalist"


def test_meta_train_writes_files_and_resumes(tmp_path, capsys):
  out_dir = str(tmp_path / "run")
  code, out, err = run(["meta-train", "--num_steps=3", f"--output_dir={out_dir}"] + TINY, capsys)
  assert code == 0, err
  for name in ("checkpoint.npz", "metrics.jsonl", "summary.json", "meta_loss.png", "inner_curves.png"):
    assert os.path.exists(os.path.join(out_dir, name)), name
  assert "learned (final)" in out and "Adam (tuned" in out
  # Resumed with the lanes spread over 2 devices: the device count is not part of the run's identity.
  code, out, err = run(["meta-train", "--num_steps=5", f"--output_dir={out_dir}", "--devices=2"] + TINY, capsys)
  assert code == 0, err
  with open(os.path.join(out_dir, "metrics.jsonl")) as f:
    assert [json.loads(line)["step"] for line in f] == [1, 2, 3, 4, 5]
  with open(os.path.join(out_dir, "summary.json")) as f:
    summary = json.load(f)
  family = summary["config"]["recipe"]["families"][0]
  assert summary["meta_steps"] == 5 and family == {"kind": "registered", "kwargs": {"name": "quadratic_family_10"},
                                                   "augmentations": []}
  assert set(summary["eval"]["learned"]) == {"learned (init)", "learned (final)"}
  final = summary["eval"]["learned"]["learned (final)"]
  assert len(final["speedup_per_instance"]) == 2 and set(final["speedup"]) >= {"value", "low", "high"}
  assert summary["eval"]["adam"]["lr"] > 0 and summary["eval"]["tasks"] == 2


@pytest.mark.parametrize("args, message", [
    (["meta-train", "--family=nope"], "unknown family 'nope'; valid names: .*fmnist_mlp_family_8x8_32"),
    (["meta-train", "--estimator=es"], "unknown estimator 'es'; valid names: full_es, nres, pes"),
    (["meta-train", "--optimizer=adam"],
     "unknown learned optimizer .*'adam'; valid names: adafac_mlp_lopt, adafac_muon_mlp_lopt, adafac_muon_rms_lopt, "
     "hyper_v2, learnable_adam"),
    (["meta-train", "--num_steps=0"], r"flag --num_steps=0: 0 is not an integer in the range \[1, 2147483647\]"),
    (["meta-train", "--sigma=-1"], "flag --sigma=-1.*"),
    (["meta-train", "--num_tasks=many"], "num_tasks"),
    (["meta-train", "--devices=3"], r"--devices 3: devices=3, but 2 cpu device\(s\) are available"),
    (["meta-train", "--devices=2", "--estimator=tbptt", "--num_tasks=3"],
     r"--devices 2: --num_tasks 3 gives 3 lanes \(one lane per task for --estimator tbptt\), which cannot be split "
     "evenly over 2 devices"),
    (["evaluate", "--checkpoint=missing.npz", "--optimizer=adam", "--task=quadratic_10"],
     "--checkpoint 'missing.npz': no such file"),
    (["train"], "expected one command from meta-train, evaluate, benchmark, list, launch; got train"),
    (["meta-train", "--optimizer=learnable_sgd", "--step_mult=0.1"],
     "--step_mult: --optimizer=learnable_sgd has no step_mult; it applies to adafac_mlp_lopt, "
     "adafac_muon_mlp_lopt, adafac_muon_rms_lopt, hyper_v2, mlp_lopt, mlp_nom_lopt, muon_celo_lopt, muon_residual_lopt, "
     "rnn_mlp_lopt"),
    (["meta-train", "--step_mult=0"], "flag --step_mult=0"),
    (["meta-train", "--perturbation=lowrank"],
     "flag --perturbation=lowrank: value should be one of <full|low_rank>"),
    (["meta-train", "--perturbation_rank=2"], "--perturbation_rank applies to --perturbation low_rank"),
    (["meta-train", "--perturbation=low_rank", "--estimator=tbptt"], "--estimator tbptt perturbs nothing"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, message, capsys, tmp_path):
  # Start JAX's backend with the suite's 2 CPU devices first: otherwise a first test of the process would let the CLI
  # ask for --devices=3 CPU devices (which it may do before JAX starts) and the --devices=3 case would depend on order.
  jax.device_count()
  code, out, err = run(args + [f"--output_dir={tmp_path / 'x'}"], capsys)
  assert code == 2
  assert err.startswith("metafam: error: ") and len(err.strip().splitlines()) == 1
  import re
  assert re.search(message, err), err
  assert not os.path.exists(tmp_path / "x")  # nothing was created


def test_version_and_list_one_entry_a_line_with_user_data_marked(capsys):
  from metafam import __version__
  assert run(["--version"], capsys)[:2] == (0, f"metafam {__version__}\n")
  code, out, _ = run(["list"], capsys)
  lines = out.splitlines()
  assert code == 0 and "  quadratic_10" in lines and "  pes" in lines and "recipes:" in lines
  marked = [line for line in lines if line.endswith("[user data: $METAFAM_FASHION_MNIST_DIR]")]
  assert len(marked) == 10 and all(line.split()[0].startswith("fmnist60k_") for line in marked)
  assert any(line.startswith("  [user data: $METAFAM_FASHION_MNIST_DIR]: metafam does not ship these data; needs "
                             "the full Fashion-MNIST: set $METAFAM_FASHION_MNIST_DIR") for line in lines)


def test_evaluate_with_missing_user_data_creates_nothing(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("METAFAM_FASHION_MNIST_DIR", str(tmp_path / "nowhere"))
  out_dir = tmp_path / "out"
  code, _, err = run(["evaluate", "--task=fmnist60k_logreg_28x28_b128", "--optimizer=adam", f"--output_dir={out_dir}"],
                     capsys)
  assert code == 2 and len(err.strip().splitlines()) == 1
  assert err.startswith("metafam: error: --task fmnist60k_logreg_28x28_b128: task fmnist60k_logreg_28x28_b128 needs "
                        "the full Fashion-MNIST: set $METAFAM_FASHION_MNIST_DIR")
  assert "does not exist" in err and not out_dir.exists()


def test_short_run_without_report_then_nothing_to_train_then_the_report(tmp_path, capsys):
  out_dir = str(tmp_path / "run")
  args = ["meta-train", "--num_steps=3", f"--output_dir={out_dir}"] + TINY
  code, out, err = run(args + ["--noreport"], capsys)
  assert code == 0, err
  assert sorted(os.listdir(out_dir)) == ["checkpoint.npz", "metrics.jsonl"]  # no report, and the lock is gone
  assert "(--noreport: no closing report)" in out
  from metafam.runs import checkpoint
  recipe = checkpoint.read_metadata(os.path.join(out_dir, "checkpoint.npz"))["config"]["recipe"]
  assert recipe["meta_lr_decay_steps"] == 3  # decays over --num_steps, not over the default run's 6000
  files = {n: open(os.path.join(out_dir, n), "rb").read() for n in os.listdir(out_dir)}
  code, _, err = run(args + ["--noreport"], capsys)
  assert code == 2 and err == (f"metafam: error: --num_steps 3: the run in {out_dir!r} is already at meta-step 3 "
                               "(checkpoint.npz); nothing to train. Ask for more than 3 meta-steps to continue it.\n")
  assert {n: open(os.path.join(out_dir, n), "rb").read() for n in os.listdir(out_dir)} == files
  code, out, err = run(args, capsys)  # the same --num_steps with the report: only the report is written
  assert code == 0 and "learned (final)" in out, err
  assert sorted(os.listdir(out_dir)) == ["checkpoint.npz", "inner_curves.png", "meta_loss.png", "metrics.jsonl",
                                         "summary.json"]
  assert open(os.path.join(out_dir, "checkpoint.npz"), "rb").read() == files["checkpoint.npz"]
  code, _, err = run(args, capsys)
  assert code == 2 and "already at meta-step 3 (checkpoint.npz, summary.json); nothing to train" in err
  # Resumed to more steps without --meta_lr_decay_steps: the run keeps the schedule it started with.
  code, _, err = run(["meta-train", "--num_steps=4", f"--output_dir={out_dir}", "--noreport"] + TINY, capsys)
  assert code == 0, err
  assert checkpoint.read_metadata(os.path.join(out_dir, "checkpoint.npz"))["step"] == 4


def test_meta_train_names_the_masked_steps_of_a_diverging_lane(tmp_path, capsys):
  code, _, err = run(["meta-train", "--num_steps=3", f"--output_dir={tmp_path / 'run'}", "--noreport"] + TINY
                     + ["--sigma=20"], capsys)
  assert code == 0, err
  lines = err.strip().splitlines()
  assert lines[0].startswith("metafam: warning: meta-step 1: PES on family ")
  assert "of the pair-steps of the estimate were masked because a value went non-finite" in lines[0]
  assert lines[-1].startswith("metafam: warning: meta-training to meta-step 3: ")
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    assert json.loads(f.readline())["nonfinite_fraction"] > 0


def test_decay_steps_follow_num_steps_and_the_default_run_is_unchanged():
  from metafam.runs.recipe_flags import main_job, recipe_from_command
  from metafam._cli_spec import COMMANDS, FLAGS as SPEC
  defaults = {n: SPEC[n].default for n in COMMANDS["meta-train"]["flags"]}
  assert recipe_from_command(defaults, set()) == main_job()  # 6000 meta-steps, decayed over 6000
  short = recipe_from_command(dict(defaults, num_steps=20), {"num_steps"})
  assert (short.num_steps, short.meta_lr_decay_steps) == (20, 20)
  given = recipe_from_command(dict(defaults, num_steps=20, meta_lr_decay_steps=500), {"num_steps",
                                                                                      "meta_lr_decay_steps"})
  assert given.meta_lr_decay_steps == 500


def test_other_runs_checkpoint_and_corrupted_checkpoint_are_refused_and_kept(tmp_path, capsys):
  out_dir = str(tmp_path / "run")
  assert run(["meta-train", "--num_steps=2", f"--output_dir={out_dir}"] + TINY, capsys)[0] == 0
  # The lock file as a run long gone leaves it (another pid; nobody holds the flock): a refusal after the directory
  # was locked gives the lock file its bytes back, so every byte of the directory is as it was.
  with open(os.path.join(out_dir, ".metafam.lock"), "wb") as f:
    f.write(b"999999999")
  files = {n: open(os.path.join(out_dir, n), "rb").read() for n in os.listdir(out_dir)}
  code, _, err = run(["meta-train", "--num_steps=4", "--seed=1", f"--output_dir={out_dir}"] + TINY, capsys)
  assert code == 2 and "belongs to a different run" in err and len(err.strip().splitlines()) == 1
  assert {n: open(os.path.join(out_dir, n), "rb").read() for n in os.listdir(out_dir)} == files
  ckpt = os.path.join(out_dir, "checkpoint.npz")
  with open(ckpt, "wb") as f:
    f.write(files["checkpoint.npz"][:100])
  code, _, err = run(["meta-train", "--num_steps=4", f"--output_dir={out_dir}"] + TINY, capsys)
  assert code == 2 and "corrupted" in err
  assert open(ckpt, "rb").read() == files["checkpoint.npz"][:100]  # left as found, for the user to inspect
  assert open(os.path.join(out_dir, "metrics.jsonl"), "rb").read() == files["metrics.jsonl"]
  assert open(os.path.join(out_dir, ".metafam.lock"), "rb").read() == b"999999999"


def test_low_rank_perturbation_is_part_of_the_run_config(tmp_path, capsys):
  out_dir = str(tmp_path / "run")
  low_rank = ["--perturbation=low_rank", "--perturbation_rank=2"]
  assert run(["meta-train", "--num_steps=2", f"--output_dir={out_dir}"] + TINY + low_rank, capsys)[0] == 0
  with open(os.path.join(out_dir, "summary.json")) as f:
    assert json.load(f)["config"]["recipe"]["perturbation_rank"] == 2
  code, _, err = run(["meta-train", "--num_steps=3", f"--output_dir={out_dir}"] + TINY, capsys)
  assert code == 2 and "belongs to a different run" in err
  assert run(["meta-train", "--num_steps=3", f"--output_dir={out_dir}"] + TINY + low_rank, capsys)[0] == 0


def test_python_dash_m_entry_point():
  proc = subprocess.run([sys.executable, "-m", "metafam", "list"], capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, METAFAM_JAX_CACHE=""))
  assert proc.returncode == 0 and "families:" in proc.stdout
  proc = subprocess.run([sys.executable, "-m", "metafam", "meta-train", "--family=x"], capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, METAFAM_JAX_CACHE=""))
  assert proc.returncode == 2 and "unknown family 'x'" in proc.stderr


def test_evaluate_a_saved_learned_optimizer_and_its_bad_inputs(tmp_path, capsys):
  run_dir = str(tmp_path / "run")
  assert run(["meta-train", "--num_steps=2", f"--output_dir={run_dir}"] + TINY, capsys)[0] == 0
  ckpt = os.path.join(run_dir, "checkpoint.npz")
  out_dir = str(tmp_path / "eval")
  code, out, err = run(["evaluate", "--optimizer=learnable_sgd", f"--checkpoint={ckpt}", "--task=quadratic_10",
                        "--inner_steps=24", "--seeds=2", "--progress=false", f"--output_dir={out_dir}"], capsys)
  assert code == 0, err
  assert "learnable_sgd@run" in out and os.path.exists(os.path.join(out_dir, "custom_tasks.csv"))
  for args, message in [
      (["--task=quadratic_10", "--optimizer=mlp_lopt"], "is a learned optimizer: give its meta-parameters with"),
      (["--task=quadratic_10", "--optimizer=mlp_lopt", f"--checkpoint={ckpt}"], "does not hold mlp_lopt meta-"),
      (["--optimizer=adam", "--suite=huge"], "unknown suite 'huge'; valid names: .*tiny"),
      (["--optimizer=adam", "--suite=tiny", "--task=quadratic_10"], "give --task or --suite, not both"),
      (["--optimizer=adam", "--task=resnet"], "unknown task 'resnet'; valid names: .*fmnist_mlp_8x8_32"),
      (["--optimizer=adamax"],
       "unknown optimizer 'adamax'; valid names: adafac_mlp_lopt, adafac_muon_mlp_lopt, adafac_muon_rms_lopt, "
       "adafactor, adam, adamw, ademamix, hyper_v2, learnable_adam"),
      (["--optimizer=learnable_sgd", f"--checkpoint={tmp_path / 'missing.npz'}"], "--checkpoint .*: no such file"),
  ]:
    code, _, err = run(["evaluate", f"--output_dir={tmp_path / 'bad'}"] + args, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    import re
    assert re.search(message, err), err
  assert not os.path.exists(tmp_path / "bad")


def test_step_mult_is_recorded_and_evaluate_rebuilds_the_optimizer_with_it(tmp_path, capsys):
  """A learned optimizer meta-trained with --step_mult must be evaluated with the same step_mult: the checkpoint
  records it and `evaluate --checkpoint` passes it back (a wrong scale would silently change every update)."""
  from metafam.optimizers import MLPLOpt
  from metafam.runs import checkpoint
  run_dir = str(tmp_path / "run")
  args = ["meta-train", "--num_steps=2", f"--output_dir={run_dir}", "--optimizer=mlp_lopt", "--step_mult=0.05"]
  assert run(args + [a for a in TINY if not a.startswith("--optimizer")], capsys)[0] == 0
  ckpt = os.path.join(run_dir, "checkpoint.npz")
  assert checkpoint.read_metadata(ckpt)["config"]["recipe"]["step_mult"] == 0.05
  (opt,) = cli.build_optimizers("mlp_lopt", learning_rate=1.0, checkpoint=ckpt).values()
  # The same theta under step_mult 0.05 (as trained) and 0.005 (the wrong scale): the CLI's must be the first.
  step = {}
  new = opt.update(opt.init({"w": np.ones(3, np.float32)}, num_steps=10), {"w": np.full(3, 0.5, np.float32)})
  step["cli"] = np.asarray(opt.get_params(new)["w"]) - 1.0
  from metafam.benchmark.runner import learned_optimizer
  for mult in (0.05, 0.005):
    ref = learned_optimizer(MLPLOpt(step_mult=mult), ckpt)
    new = ref.update(ref.init({"w": np.ones(3, np.float32)}, num_steps=10), {"w": np.full(3, 0.5, np.float32)})
    step[mult] = np.asarray(ref.get_params(new)["w"]) - 1.0
  np.testing.assert_array_equal(step["cli"], step[0.05])
  assert np.all(np.abs(step[0.005]) < np.abs(step[0.05]))
  from metafam.optimizers.registry import takes_step_mult
  assert takes_step_mult("mlp_lopt") and not takes_step_mult("learnable_sgd")  # optimizers without a step_mult
