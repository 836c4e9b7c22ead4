"""Multi-process meta-training on jax.distributed (CPU, loopback only).

The runs are real: separate Python processes (tests/distributed_driver.py, or the `metafam` CLI) joined by JAX's
coordination service on 127.0.0.1, with Gloo collectives. They meta-train MLPLOpt with PES on a small quadratic
family, 8 lanes spread over every device of every process.

Equalities: 2 processes x 1 CPU device run the same partitioned program as 1 process x 2 devices, and a
2-operand sum is the same in either order, so their thetas must be bit-identical; 1 process x 1 device sums the
lanes in another order, so it agrees only up to float32 rounding (a few ulps of each meta-gradient, through 6 Adam
steps of size 1e-2: well inside rtol 1e-5 / atol 1e-6, the bound the single-process sharding tests use).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from metafam import cli, distributed

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "distributed_driver.py")
STEPS = 6


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(tmp_path_factory):
  """One persistent compilation cache for this module's driver processes: each program compiles once."""
  os.environ["METAFAM_TEST_JAX_CACHE"] = str(tmp_path_factory.mktemp("jax_cache"))
  yield
  os.environ.pop("METAFAM_TEST_JAX_CACHE", None)


def _env():
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), HERE, env.get("PYTHONPATH", "")])
  return env


def start(out_dir, theta, steps, *, processes=1, devices=1, sleep=0.0, port=None):
  """Starts one run of the driver: ``processes`` processes (each with ``devices`` CPU devices); returns them."""
  base = [sys.executable, DRIVER, str(out_dir), str(steps), str(theta), f"--devices={devices}", f"--sleep={sleep}"]
  if processes == 1:
    return [subprocess.Popen(base, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
  port = port or distributed.free_port()
  return [subprocess.Popen(base + [f"--num_processes={processes}", f"--process_id={i}",
                                   f"--coordinator=127.0.0.1:{port}"],
                           env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for i in range(processes)]


def finish(procs, timeout=180):
  outputs = [p.communicate(timeout=timeout)[0] for p in procs]
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  return outputs


def run(out_dir, theta, steps, **kw):
  finish(start(out_dir, theta, steps, **kw))
  return dict(np.load(theta))


def assert_same(a, b, exact=True):
  assert a.keys() == b.keys()
  for k in a:
    if exact:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    else:
      np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted runs of STEPS meta-steps: 1 process x 2 devices and 1 process x 1 device."""
  root = tmp_path_factory.mktemp("reference")
  return {"1x2": run(root / "r12", root / "t12.npz", STEPS, devices=2),
          "1x1": run(root / "r11", root / "t11.npz", STEPS, devices=1)}


def test_two_processes_equal_one_process(tmp_path, reference):
  theta = run(tmp_path / "run", tmp_path / "theta.npz", STEPS, processes=2)
  assert_same(theta, reference["1x2"], exact=True)
  assert_same(theta, reference["1x1"], exact=False)
  # Only process 0 wrote, once: a checkpoint and one metrics record per step (and held the directory's lock, whose
  # file it removed at the end).
  assert sorted(os.listdir(tmp_path / "run")) == ["checkpoint.npz", "metrics.jsonl"]
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    assert [json.loads(line)["step"] for line in f] == list(range(1, STEPS + 1))


def _metrics_lines(path):
  try:
    with open(path) as f:
      return sum(1 for line in f if line.strip())
  except FileNotFoundError:
    return 0


# Slow: resuming exactly after SIGKILL is tested in one process (tests/outer_trainers/test_meta_trainer.py) and two
# processes resuming together in tests/runs/test_failures.py (SIGTERM) and
# test_checkpoint_of_two_processes_resumes_in_one.
@pytest.mark.parametrize("victim", [pytest.param(1, marks=pytest.mark.slow), pytest.param(0, marks=pytest.mark.slow)])
def test_kill_one_process_then_restart_resumes_exactly(tmp_path, reference, victim):
  out, theta = tmp_path / "run", tmp_path / "theta.npz"
  procs = start(out, theta, 1000, processes=2, sleep=0.2)
  deadline = time.monotonic() + 120
  while _metrics_lines(out / "metrics.jsonl") < 3:
    assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the run did not start"
    time.sleep(0.2)
  procs[victim].send_signal(signal.SIGKILL)
  killed_at = time.monotonic()
  survivor = procs[1 - victim]
  output = survivor.communicate(timeout=60)[0]
  waited = time.monotonic() - killed_at
  procs[victim].wait()
  # The survivor stops on its own, with an error naming what happened, well before its heartbeat deadline (5 s in
  # the driver) would matter; without the peer check it would wait in the collective.
  assert survivor.returncode != 0
  # Our error, or (when the coordinator itself died) JAX's own: its coordination client ends the process.
  assert ("another process of this run stopped" in output
          or "JAX distributed service detected fatal errors" in output), output[-3000:]
  assert waited < 30
  # Restart both: the run resumes from the last checkpoint and ends where an uninterrupted run ends.
  assert_same(run(out, theta, STEPS, processes=2), reference["1x2"], exact=True)
  with open(out / "metrics.jsonl") as f:  # the records past the checkpoint were dropped and written again
    assert [json.loads(line)["step"] for line in f] == list(range(1, STEPS + 1))


@pytest.mark.slow  # test_two_processes_equal_one_process covers two-process checkpoints; resume: test_failures.py
def test_checkpoint_of_two_processes_resumes_in_one(tmp_path, reference):
  run(tmp_path / "run", tmp_path / "theta.npz", 3, processes=2)
  shutil.copytree(tmp_path / "run", tmp_path / "copy")
  # Same total devices: the same program, so exactly the uninterrupted run; one device: up to rounding.
  assert_same(run(tmp_path / "run", tmp_path / "theta.npz", STEPS, devices=2), reference["1x2"], exact=True)
  assert_same(run(tmp_path / "copy", tmp_path / "theta1.npz", STEPS, devices=1), reference["1x1"], exact=False)


# -- bad input -----------------------------------------------------------------------------------------------------
def test_process_group_arguments_are_checked():
  for kwargs, message in [
      (dict(num_processes=0), "num_processes must be a positive int"),
      (dict(num_processes=2, process_id=2, coordinator="127.0.0.1:1234"), r"process_id must be an int in \[0, 2\)"),
      (dict(num_processes=2, process_id=-1, coordinator="127.0.0.1:1234"), "process_id"),
      (dict(num_processes=2), "needs a coordinator HOST:PORT"),
      (dict(num_processes=2, coordinator="localhost"), "not HOST:PORT"),
      (dict(num_processes=2, coordinator="h:99999"), "port in 1..65535"),
      (dict(num_processes=2, coordinator="auto"), "leave num_processes and process_id unset"),
      (dict(timeout_s=0), "timeout_s must be a positive int"),
  ]:
    with pytest.raises(ValueError, match=message):
      distributed.ProcessGroup(**kwargs)
  assert not distributed.ProcessGroup().distributed
  assert distributed.ProcessGroup(coordinator="auto").distributed


def test_busy_coordinator_port_is_refused_at_once():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    group = distributed.ProcessGroup(2, 0, f"127.0.0.1:{s.getsockname()[1]}")
    with pytest.raises(distributed.DistributedError, match="is busy on this host"):
      distributed.check_coordinator(group)


def test_unreachable_coordinator_fails_after_the_timeout():
  group = distributed.ProcessGroup(2, 1, f"127.0.0.1:{distributed.free_port()}", timeout_s=1)
  t0 = time.monotonic()
  with pytest.raises(distributed.DistributedError, match="unreachable for 1 s"):
    distributed.check_coordinator(group)
  assert time.monotonic() - t0 < 10


def _cli(args, capsys, tmp_path):
  before = sorted(os.listdir(tmp_path))
  code = cli.main(["metafam"] + args)
  err = capsys.readouterr().err
  assert sorted(os.listdir(tmp_path)) == before  # nothing written
  return code, err


@pytest.mark.parametrize("args, message", [
    (["--num_processes=2"], "needs a coordinator HOST:PORT"),
    (["--num_processes=2", "--process_id=2", "--coordinator=127.0.0.1:1"], "process_id must be an int in [0, 2)"),
    (["--num_processes=2", "--coordinator=127.0.0.1"], "not HOST:PORT"),
    (["--num_processes=2", "--coordinator=127.0.0.1:1", "--num_tasks=3"],
     "--num_tasks=3 lanes cannot be split evenly over --num_processes 2 x --devices 1 = 2 devices"),
])
def test_cli_bad_process_flags_are_one_line_exit_2(args, message, capsys, tmp_path):
  code, err = _cli(["meta-train", f"--output_dir={tmp_path}/run"] + args, capsys, tmp_path)
  assert code == 2 and err.startswith("metafam: error: ") and len(err.strip().splitlines()) == 1, err
  assert message in err, err


def test_cli_busy_and_unreachable_coordinator(capsys, tmp_path):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    busy = f"127.0.0.1:{s.getsockname()[1]}"
    code, err = _cli(["meta-train", f"--output_dir={tmp_path}/run", "--num_processes=2", f"--coordinator={busy}"],
                     capsys, tmp_path)
  assert code == 2 and "is busy on this host" in err and len(err.strip().splitlines()) == 1, err
  code, err = _cli(["meta-train", f"--output_dir={tmp_path}/run", "--num_processes=2", "--process_id=1",
                    f"--coordinator=127.0.0.1:{distributed.free_port()}", "--coordinator_timeout=1"],
                   capsys, tmp_path)
  assert code == 2 and "unreachable for 1 s" in err and len(err.strip().splitlines()) == 1, err


def test_cli_launch_checks_its_command_first(capsys, tmp_path):
  for args, message in [
      (["launch", "--num_processes=2", "--", "evaluate"], "launch runs meta-train"),
      (["launch", "--num_processes=2", "--", "meta-train", "--process_id=1"], "launch sets --process_id itself"),
      (["launch", "--num_processes=2", "--", "meta-train", "--num_tasks=3", f"--output_dir={tmp_path}/x"],
       "--num_tasks=3 lanes cannot be split evenly"),
      (["launch", "--num_processes=2", "--", "meta-train", "--family=nope", f"--output_dir={tmp_path}/x"],
       "unknown family 'nope'"),
      (["launch", "--num_processes=2"], "launch takes COMMAND"),
  ]:
    code, err = _cli(args, capsys, tmp_path)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)


def test_cli_processes_given_different_flags_stop_with_exit_2(tmp_path):
  port = distributed.free_port()
  common = ["-m", "metafam", "meta-train", f"--output_dir={tmp_path}/run", "--family=quadratic_family_10",
            "--num_processes=2", f"--coordinator=127.0.0.1:{port}", "--coordinator_timeout=60", "--noprogress"]
  procs = [subprocess.Popen([sys.executable, *common, "--process_id=0", "--num_tasks=4"], env=_env(),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True),
           subprocess.Popen([sys.executable, *common, "--process_id=1", "--num_tasks=2"], env=_env(),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)]
  errors = [p.communicate(timeout=120)[1] for p in procs]
  for p, err in zip(procs, errors):
    lines = [line for line in err.splitlines() if line.startswith("metafam: error: ")]
    assert p.returncode == 2 and len(lines) == 1, err[-2000:]
    assert "different meta-train flags" in lines[0] and "num_tasks=2 (process 0: 4)" in lines[0], lines[0]
  assert not os.path.exists(tmp_path / "run" / "checkpoint.npz")


@pytest.mark.slow
def test_cli_launch_runs_meta_train_on_two_processes(tmp_path):
  """The README's one-liner, end to end (about 30 s on 2 cores): process 0 writes the report, process 1 nothing."""
  out = tmp_path / "run"
  proc = subprocess.run([sys.executable, "-m", "metafam", "launch", "--num_processes=2", "--", "meta-train",
                         "--family=quadratic_family_10", "--num_steps=3", "--num_tasks=2", "--unroll_length=5",
                         "--trajectory_length=10", "--eval_tasks=2", "--eval_steps=10", f"--output_dir={out}",
                         "--eval_every=3", "--noprogress"], env=_env(), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "process 1/2: meta-training reached step 3" in proc.stdout
  assert proc.stdout.count("held-out comparison") == 1
  assert {"checkpoint.npz", "metrics.jsonl", "summary.json"} <= set(os.listdir(out))
  with open(out / "metrics.jsonl") as f:  # written once, with process 0's evaluation at the last step
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records] == [1, 2, 3] and "eval_final_loss" in records[-1]


def _fake_processes(monkeypatch, tmp_path, scripts):
  """`launch_local` runs ``python -c SCRIPT`` for each script instead of metafam (stdout to a file per process)."""
  def commands(argv, num_processes, port=None):
    assert num_processes == len(scripts)
    return [[sys.executable, "-c", f"import sys; sys.stdout = open({str(tmp_path / str(i))!r}, 'w'); {s}"]
            for i, s in enumerate(scripts)]
  monkeypatch.setattr(distributed, "local_commands", commands)


def test_launcher_waits_for_a_slow_checkpoint_after_a_preempted_exit(monkeypatch, tmp_path):
  """Process 0 is preempted at once; process 1 takes longer than the grace period to write its checkpoint and
  report. A preempted exit is no failure: process 1 is not terminated (it was, when 75 started the grace timer)."""
  _fake_processes(monkeypatch, tmp_path, ["sys.exit(75)",
                                          "import time; time.sleep(1.5); print('checkpointed'); sys.exit(75)"])
  start = time.monotonic()
  assert distributed.launch_local(["meta-train"], 2, grace_s=0.2) == 75
  assert time.monotonic() - start >= 1.5
  with open(tmp_path / "1") as f:
    assert f.read() == "checkpointed\n"


def test_launcher_terminates_the_others_a_grace_period_after_a_failure(monkeypatch, tmp_path):
  _fake_processes(monkeypatch, tmp_path, ["sys.exit(1)", "import time; time.sleep(60)"])
  start = time.monotonic()
  assert distributed.launch_local(["meta-train"], 2, grace_s=0.5) == 1  # the first failure's code
  assert 0.5 <= time.monotonic() - start < 30
  # A failure after a preempted exit starts the timer too.
  _fake_processes(monkeypatch, tmp_path, ["sys.exit(75)", "import time; time.sleep(0.3); sys.exit(3)",
                                          "import time; time.sleep(60)"])
  start = time.monotonic()
  assert distributed.launch_local(["meta-train"], 3, grace_s=0.5) == 75
  assert 0.8 <= time.monotonic() - start < 30
