"""Meta-training survives the cluster: preemption signals, failing disks, crashed writers, two runs in one
directory, runs gone bad, non-finite checkpoints and runs too large for memory (docs/guide/failures.md).

Where the point is about processes, signals or OS limits, the runs are real `metafam meta-train` subprocesses
(sharing one persistent compilation cache, so each compiles once); "bit for bit" compares every array of the
checkpoints (`MetaTrainState`: theta, meta-optimizer state, worker states, key, step) of a disturbed-then-resumed
run with those of an uninterrupted run of the same length.
"""

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from meta_setup import build_trainer
from metafam import cli, distributed, resources
from metafam.benchmark import load_theta
from metafam.io import DirectoryBusyError, DirectoryLock, append_line
from metafam.optimizers.learned import LearnableSGD
from metafam.outer_trainers import GradientEstimate, GradientEstimator, MetaTrainer
from metafam.runs import checkpoint, read_metrics, train
from metafam.runs.checkpoint import CheckpointError
from metafam.runs.loop import RunDivergedError, check_memory
from metafam.runs.run_dir import CHECKPOINT_NAME, METRICS_NAME
from metafam.runs.preemption import EXIT_PREEMPTED

TINY = ["--family=quadratic_family_10", "--optimizer=learnable_sgd", "--estimator=pes", "--num_tasks=2",
        "--unroll_length=5", "--trajectory_length=10", "--eval_tasks=2", "--eval_steps=10", "--sigma=0.05",
        "--progress=false", "--meta_lr_decay_steps=6000"]  # one schedule, whatever --num_steps a run is started with
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("jax_cache"))


def _env(cache_dir):
  env = dict(os.environ, METAFAM_JAX_CACHE=cache_dir, PYTHONUNBUFFERED="1")
  # The suite's own cache (tests/conftest.py) reaches child processes as JAX_COMPILATION_CACHE_DIR, which JAX reads
  # before the CLI looks at METAFAM_JAX_CACHE: drop it so that `cache_dir` alone decides ("" compiles uncached).
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
  return env


def _limited(command, fsize=None, address_space=None):
  """``command`` run under RLIMIT_FSIZE / RLIMIT_AS, set by a small Python that then execs it (no preexec_fn: the
  test process runs JAX's threads, and forking it to run Python code is unsafe). Python ignores SIGXFSZ, so a write
  past the file-size limit fails with EFBIG ("File too large")."""
  if fsize is None and address_space is None:
    return command
  setup = ("import os, resource, sys\n"
           f"for r, v in ((resource.RLIMIT_FSIZE, {fsize}), (resource.RLIMIT_AS, {address_space})):\n"
           "  if v is not None: resource.setrlimit(r, (v, v))\n"
           "os.execv(sys.argv[1], sys.argv[1:])\n")
  return [sys.executable, "-c", setup, *command]


def metafam(args, cache_dir, wait=True, **limits):
  """``python -m metafam ARGS`` as a subprocess: ``(returncode, stdout, stderr)``, or the running Popen."""
  # A run under a file-size limit compiles without the shared cache: JAX's cache writes would hit the limit too,
  # leaving truncated entries that warn in every later run.
  if limits.get("fsize") is not None:
    cache_dir = ""
  proc = subprocess.Popen(_limited([sys.executable, "-m", "metafam", *args], **limits), env=_env(cache_dir),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  if not wait:
    return proc
  out, err = proc.communicate(timeout=300)
  return proc.returncode, out, err


def meta_train(out_dir, steps, cache_dir, extra=(), **kw):
  return metafam(["meta-train", f"--output_dir={out_dir}", f"--num_steps={steps}", *TINY, *extra], cache_dir, **kw)


def steps_logged(out_dir):
  path = os.path.join(out_dir, METRICS_NAME)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line)["step"] for line in f if line.endswith("\n")]


def wait_for_steps(out_dir, count, procs, timeout=120):
  deadline = time.monotonic() + timeout
  while len(steps_logged(out_dir)) < count:
    assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the run did not start"
    time.sleep(0.1)


def checkpoint_arrays(out_dir):
  header, tree = checkpoint.read(os.path.join(out_dir, CHECKPOINT_NAME))
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return header.metadata["step"], {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


def assert_same_run(a_dir, b_dir):
  (step_a, a), (step_b, b) = checkpoint_arrays(a_dir), checkpoint_arrays(b_dir)
  assert step_a == step_b and a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  # The metrics agree too, apart from the wall-clock fields, and every step appears exactly once.
  clock = ("seconds", "inner_steps_per_s")
  strip = lambda d: [{k: v for k, v in r.items() if k not in clock} for r in read_metrics(os.path.join(d, METRICS_NAME))]
  assert strip(a_dir) == strip(b_dir)
  assert steps_logged(a_dir) == list(range(1, step_a + 1))


def one_line(err, prefix="metafam: "):
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(prefix), err[-2000:]
  return lines[0]


def snapshot(path):
  """Every file under ``path`` with its bytes and modification time."""
  found = {}
  for root, _, files in os.walk(path):
    for name in files:
      p = os.path.join(root, name)
      with open(p, "rb") as f:
        found[os.path.relpath(p, path)] = (f.read(), os.stat(p).st_mtime_ns)
  return found


# -- preemption ------------------------------------------------------------------------------------------------------
def test_sigterm_checkpoints_the_step_in_flight_and_the_resumed_run_is_bit_identical(tmp_path, cache_dir, capsys):
  run = str(tmp_path / "run")
  proc = meta_train(run, 10 ** 7, cache_dir, extra=["--checkpoint_every=100000"], wait=False)
  wait_for_steps(run, 5, [proc])
  # While it runs, its directory is locked: evaluate and benchmark into it refuse without touching it.
  code = cli.main(["metafam", "evaluate", "--task=quadratic_10", "--optimizer=adam", f"--output_dir={run}",
                   "--inner_steps=8", "--seeds=1", "--progress=false", "--overwrite"])
  assert code == 2 and "is in use by a live metafam run (process" in capsys.readouterr().err
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == EXIT_PREEMPTED == 75, err[-2000:]
  line = one_line(err, "metafam: preempted: stopped by SIGTERM after meta-step ")
  step = int(line.split("after meta-step ")[1].split(":")[0])
  assert line.endswith("run the same command again to resume.") and os.path.join(run, CHECKPOINT_NAME) in line
  # Nothing lost: the checkpoint is at the last logged step, far from the 100,000-step schedule.
  assert checkpoint_arrays(run)[0] == step and steps_logged(run) == list(range(1, step + 1))
  code, _, err = meta_train(run, step + 3, cache_dir, extra=["--checkpoint_every=100000"])
  assert code == 0, err[-2000:]
  reference = str(tmp_path / "reference")
  code, _, err = meta_train(reference, step + 3, cache_dir, extra=["--checkpoint_every=100000"])
  assert code == 0, err[-2000:]
  assert_same_run(run, reference)


def test_sigint_also_stops_with_a_checkpoint(tmp_path, cache_dir):
  run = str(tmp_path / "run")
  proc = meta_train(run, 10 ** 7, cache_dir, extra=["--checkpoint_every=100000"], wait=False)
  wait_for_steps(run, 3, [proc])
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 75, err[-2000:]
  step = int(one_line(err, "metafam: preempted: stopped by SIGINT").split("after meta-step ")[1].split(":")[0])
  assert checkpoint_arrays(run)[0] == step and steps_logged(run) == list(range(1, step + 1))


def test_two_processes_stop_at_the_same_meta_step_when_one_gets_sigterm(tmp_path, cache_dir):
  """JAX's preemption sync point: only process 1 is signalled, both stop and checkpoint at one agreed step."""
  run = str(tmp_path / "run")

  def start(steps):
    port = distributed.free_port()
    return [meta_train(run, steps, cache_dir, wait=False,
                       extra=["--checkpoint_every=100000", "--num_processes=2", f"--process_id={i}",
                              f"--coordinator=127.0.0.1:{port}"]) for i in range(2)]

  procs = start(10 ** 7)
  wait_for_steps(run, 3, procs)
  procs[1].send_signal(signal.SIGTERM)
  errs = [p.communicate(timeout=120)[1] for p in procs]
  assert [p.returncode for p in procs] == [75, 75], errs
  lines = [one_line("\n".join(l for l in e.splitlines() if l.startswith("metafam:"))) for e in errs]
  steps = {int(line.split("after meta-step ")[1].split(":")[0]) for line in lines}
  assert len(steps) == 1, lines
  (step,) = steps
  assert checkpoint_arrays(run)[0] == step and steps_logged(run) == list(range(1, step + 1))
  procs = start(step + 2)  # resumed by both processes, it goes on from there
  for p in procs:
    _, err = p.communicate(timeout=180)
    assert p.returncode == 0, err[-2000:]
  assert steps_logged(run) == list(range(1, step + 3))


@pytest.mark.slow  # test_sigterm_checkpoints_the_step_in_flight_... covers the signal path
def test_sigterm_to_the_local_launcher_stops_every_process_at_one_step(tmp_path, cache_dir):
  run = str(tmp_path / "run")
  launcher = metafam(["launch", "--num_processes=2", "--", "meta-train", f"--output_dir={run}", "--num_steps=10000000",
                      "--checkpoint_every=100000", *TINY], cache_dir, wait=False)
  wait_for_steps(run, 3, [launcher])
  launcher.send_signal(signal.SIGTERM)  # forwarded to both processes as SIGTERM
  _, err = launcher.communicate(timeout=120)
  assert launcher.returncode == 75, err[-2000:]
  lines = [line for line in err.splitlines() if line.startswith("metafam:")]
  assert len(lines) == 2 and all(line.startswith("metafam: preempted: stopped by SIGTERM") for line in lines), err
  steps = {int(line.split("after meta-step ")[1].split(":")[0]) for line in lines}
  assert len(steps) == 1 and checkpoint_arrays(run)[0] == steps.pop()


# -- failing disks ---------------------------------------------------------------------------------------------------
STEPS = 60


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache_dir):
  run = str(tmp_path_factory.mktemp("uninterrupted") / "run")
  code, _, err = meta_train(run, STEPS, cache_dir, extra=["--checkpoint_every=2"])
  assert code == 0, err[-2000:]
  return run


# A failing metrics append is slow: the failing checkpoint write takes the same path (EFBIG -> exit 74 -> resume).
@pytest.mark.parametrize("failing", [pytest.param("metrics", marks=pytest.mark.slow), "checkpoint"])
def test_a_failed_write_keeps_the_last_checkpoint_and_the_resumed_run_is_exact(tmp_path, cache_dir, uninterrupted,
                                                                               failing):
  """Writes fail for real: RLIMIT_FSIZE makes every write past the limit fail with EFBIG ("File too large")."""
  run = str(tmp_path / "run")
  ckpt_size = os.path.getsize(os.path.join(uninterrupted, CHECKPOINT_NAME))
  if failing == "metrics":  # the checkpoint fits; metrics.jsonl outgrows the limit within the run
    limit = ckpt_size + 1024
    assert os.path.getsize(os.path.join(uninterrupted, METRICS_NAME)) > limit + 2048
  else:  # a run of 4 steps exists; its next checkpoint (of the same size up to steps >= 10) is just too large
    code, _, err = meta_train(run, 4, cache_dir, extra=["--checkpoint_every=2"])
    assert code == 0, err[-2000:]
    limit = os.path.getsize(os.path.join(run, CHECKPOINT_NAME)) - 1
  before = snapshot(run) if os.path.isdir(run) else {}
  code, _, err = meta_train(run, STEPS, cache_dir, extra=["--checkpoint_every=2"], fsize=limit)
  assert code == 74, err[-2000:]
  line = one_line(err, "metafam: error: cannot write ")
  name = METRICS_NAME if failing == "metrics" else CHECKPOINT_NAME
  assert os.path.join(run, name) in line and "File too large" in line and "resume" in line
  step, _ = checkpoint_arrays(run)  # the last good checkpoint loads
  if failing == "checkpoint":
    assert step == 4 and snapshot(run)[CHECKPOINT_NAME] == before[CHECKPOINT_NAME]  # untouched
    assert not [n for n in os.listdir(run) if n.endswith(".tmp")]  # and no temporary file left behind
  else:
    assert 2 < step < STEPS
  with open(os.path.join(run, METRICS_NAME), "rb") as f:
    assert f.read().endswith(b"\n")  # the failed append left no partial record
  code, _, err = meta_train(run, STEPS, cache_dir, extra=["--checkpoint_every=2"])  # space freed: resume
  assert code == 0, err[-2000:]
  assert_same_run(run, uninterrupted)


def test_append_line_is_all_or_nothing_under_a_file_size_limit(tmp_path):
  path = str(tmp_path / "log.jsonl")
  code = (f"from metafam.io import append_line\n"
          f"for i in range(100):\n"
          f"  try: append_line({path!r}, '{{\"step\": %d, \"pad\": \"xxxxxxxx\"}}' % i)\n"
          f"  except OSError as e: print(e.errno); break\n")
  proc = subprocess.run(_limited([sys.executable, "-c", code], fsize=100), capture_output=True, text=True,
                        timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
  assert proc.stdout.strip() == "27", proc.stderr  # EFBIG
  with open(path) as f:
    text = f.read()
  lines = text.splitlines()
  assert text.endswith("\n") and len(text) <= 100 and [json.loads(l)["step"] for l in lines] == list(range(len(lines)))
  assert len(text) + len(lines[0]) + 1 > 100  # it stopped because the next whole line would not fit


# -- crashed writers -------------------------------------------------------------------------------------------------
def test_a_metrics_line_cut_by_a_crash_is_dropped_once(tmp_path, cache_dir, uninterrupted):
  out = str(tmp_path / "run")
  code, _, err = meta_train(out, 4, cache_dir, extra=["--checkpoint_every=2"])
  assert code == 0, err[-2000:]
  path = os.path.join(out, METRICS_NAME)
  with open(path, "a") as f:
    f.write('{"grad_norm": 0.1, "meta_lo')  # what a crash in the middle of step 5's record leaves
  with pytest.warns(RuntimeWarning, match="dropped a partial last line"):
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4]
  code, _, err = meta_train(out, STEPS, cache_dir, extra=["--checkpoint_every=2"])
  assert code == 0, err[-2000:]
  shown = [line for line in err.splitlines() if line.startswith("metafam: warning:")]
  assert len(shown) == 1 and "partial last line" in shown[0], err[-2000:]
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # reported once: the resumed run rewrote the file without it
    assert_same_run(out, uninterrupted)


def test_a_bad_line_before_the_last_is_corruption_not_a_crash(tmp_path):
  path = str(tmp_path / METRICS_NAME)
  with open(path, "w") as f:
    f.write('{"step": 1}\n{"step": 2\n{"step": 3}\n')
  with pytest.raises(ValueError, match="line 2 is not a JSON record"):
    read_metrics(path)


# -- two runs, one directory -----------------------------------------------------------------------------------------
def test_a_directory_in_use_is_refused_by_every_command_and_nothing_changes(tmp_path, capsys):
  out = str(tmp_path / "run")
  train(build_trainer(num_tasks=2), 2, key=jax.random.key(0), output_dir=out, progress=False)  # a run's files
  holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from metafam.io import DirectoryLock; "
                             f"DirectoryLock({out!r}).acquire(); print('held', flush=True); time.sleep(600)"],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO))
  try:
    assert holder.stdout.readline().strip() == "held"
    before = snapshot(out)
    capsys.readouterr()
    for args in (["meta-train", "--num_steps=4"] + TINY,
                 ["evaluate", "--task=quadratic_10", "--optimizer=adam", "--overwrite"],
                 ["benchmark", "--task=quadratic_10", "--overwrite"]):
      assert cli.main(["metafam", *args, f"--output_dir={out}"]) == 2, args
      line = one_line(capsys.readouterr().err, "metafam: error: --output_dir ")
      assert f"is in use by a live metafam run (process {holder.pid} holds" in line, line
    with pytest.raises(DirectoryBusyError):  # the library's own loop too
      train(build_trainer(num_tasks=2), 4, output_dir=out, progress=False)
    assert snapshot(out) == before
  finally:
    holder.kill()  # SIGKILL: the holder gets no chance to clean up
    holder.wait()
  with DirectoryLock(out):  # and leaves no stale lock behind
    pass
  train(build_trainer(num_tasks=2), 4, key=jax.random.key(0), output_dir=out, progress=False)
  assert steps_logged(out) == [1, 2, 3, 4]


# -- a run that has gone bad -----------------------------------------------------------------------------------------
class _NaNAfter(GradientEstimator):
  """Gradient 1 and meta-loss 1 for the first ``good`` meta-steps, then a NaN meta-loss (no information)."""

  name = "nan_after"

  def __init__(self, good):
    self.good = good

  def init_worker_state(self, theta, key):
    return jnp.asarray(0, jnp.int32)

  def estimate_fn(self, theta, worker_state, key):
    grad = jax.tree.map(jnp.ones_like, theta)
    loss = jnp.where(worker_state < self.good, 1.0, jnp.nan)
    return GradientEstimate(grad, loss, {"num_nonfinite": jnp.float32(0)}), worker_state + 1

  @property
  def inner_steps_per_estimate(self):
    return 1


def test_a_lock_released_with_restore_leaves_the_directory_as_it_was(tmp_path):
  """What a refused run relies on: `DirectoryLock.release(restore=True)` gives the lock file its bytes and times back,
  or removes it (and the directory, if the lock created it) when there was none."""
  old = tmp_path / "old"
  old.mkdir()
  (old / ".metafam.lock").write_bytes(b"12")
  os.utime(old / ".metafam.lock", ns=(10 ** 18, 10 ** 18))
  before = snapshot(str(old))
  lock = DirectoryLock(str(old)).acquire()
  assert (old / ".metafam.lock").read_bytes() == str(os.getpid()).encode()
  lock.release(restore=True)
  assert snapshot(str(old)) == before and not lock.held
  new = tmp_path / "new" / "run"
  DirectoryLock(str(new)).acquire().release(restore=True)
  assert not new.exists()  # the directory the lock created is removed (its parent, made on the way, stays)
  kept = DirectoryLock(str(new)).acquire()
  assert (new / ".metafam.lock").read_bytes() == str(os.getpid()).encode()
  kept.release()
  assert not (new / ".metafam.lock").exists()  # a run that ends removes its lock file
  DirectoryLock(str(new)).acquire().release()  # and the next one takes the directory as usual


def test_consecutive_skipped_updates_stop_the_run_naming_the_step_and_checkpoint(tmp_path):
  trainer = MetaTrainer(LearnableSGD(0.1), [_NaNAfter(3)], optax.adam(0.1))
  with pytest.raises(RunDivergedError) as e:
    train(trainer, 100, key=jax.random.key(0), output_dir=str(tmp_path), checkpoint_every=4, max_skipped_steps=5,
          progress=False)
  message = str(e.value)
  assert message.startswith("meta-step 8: the last 5 meta-updates were all skipped")
  assert f"{os.path.join(str(tmp_path), CHECKPOINT_NAME)} at meta-step 8" in message and "sigma" in message
  # Skipped updates never touched theta: 3 Adam steps of 0.1 on gradient 1.
  theta, _ = checkpoint.load(os.path.join(str(tmp_path), CHECKPOINT_NAME))
  np.testing.assert_allclose(theta["theta"]["log_lr"], float(LearnableSGD(0.1).init(None)["log_lr"]) - 0.3,
                             rtol=1e-5)
  # max_skipped_steps=None never stops; skips that are not consecutive never add up.
  _, history = train(MetaTrainer(LearnableSGD(0.1), [_NaNAfter(3)], optax.adam(0.1)), 20, key=jax.random.key(0),
                     max_skipped_steps=None, progress=False)
  assert sum(h["update_skipped"] for h in history) == 17
  with pytest.raises(ValueError, match="max_skipped_steps"):
    train(trainer, 1, key=jax.random.key(0), max_skipped_steps=0)


def test_cli_run_gone_bad_exits_3_with_one_line(tmp_path, cache_dir):
  run = str(tmp_path / "run")
  # A learned step 1e30 times too large overflows every lane's parameters: no estimate is ever finite.
  code, _, err = meta_train(run, 1000, cache_dir, extra=["--optimizer=mlp_lopt", "--step_mult=1e30",
                                                         "--max_skipped_steps=5", "--checkpoint_every=2"])
  assert code == 3, err[-2000:]
  # First the two warnings of meta-step 1 (its masked steps, its skipped update), then the one error line.
  warned, error = err.strip().splitlines()[:-1], err.strip().splitlines()[-1]
  assert [w.split(":")[:3] for w in warned] == [["metafam", " warning", " meta-step 1"]] * 2
  assert "100.0% of the pair-steps of the estimate were masked" in warned[0] and "was skipped" in warned[1]
  line = one_line(error, "metafam: error: meta-step 5: the last 5 meta-updates were all skipped")
  assert f"{os.path.join(run, CHECKPOINT_NAME)} at meta-step 4" in line
  assert checkpoint_arrays(run)[0] == 4


# -- non-finite checkpoints ------------------------------------------------------------------------------------------
def test_a_checkpoint_with_non_finite_theta_is_refused_by_every_load_path(tmp_path, capsys, cache_dir):
  out = str(tmp_path / "run")
  code, _, err = meta_train(out, 2, cache_dir, extra=["--checkpoint_every=2"])
  assert code == 0, err[-2000:]
  path = os.path.join(out, CHECKPOINT_NAME)
  # The same file with theta's leaf set to +inf: members rewritten, header (structure, metadata) unchanged.
  header = checkpoint.read_header(path)
  with np.load(path) as npz:
    members = {name: npz[name] for name in npz.files}
  for i, leaf_path in enumerate(checkpoint._leaf_paths(header.structure)):
    if leaf_path.startswith(".theta"):
      members[f"leaf_{i}"] = np.full_like(members[f"leaf_{i}"], np.inf)
  with open(path, "wb") as f:
    np.savez(f, **members)
  before = snapshot(out)
  capsys.readouterr()
  for args in (["meta-train", f"--output_dir={out}", "--num_steps=4"] + TINY,
               ["evaluate", "--task=quadratic_10", "--optimizer=learnable_sgd", f"--checkpoint={path}",
                f"--output_dir={tmp_path / 'eval'}"],
               ["benchmark", "--task=quadratic_10", "--optimizer=learnable_sgd", f"--checkpoint={path}",
                f"--output_dir={tmp_path / 'bench'}"]):
    assert cli.main(["metafam", *args]) == 2, args
    line = one_line(capsys.readouterr().err, "metafam: error: ")
    assert "meta-parameter theta['log_lr'] holds 1 infinite value(s) of 1" in line, line
  assert snapshot(out) == before  # the lock file included: the refused resume gave it its bytes back
  with pytest.raises(CheckpointError, match=r"theta\['log_lr'\] holds 1 infinite"):
    load_theta(path)


# -- memory ----------------------------------------------------------------------------------------------------------
def test_memory_estimate_is_xla_s_buffer_assignment_of_the_meta_step():
  trainer = build_trainer(num_tasks=2)
  estimate = check_memory(trainer, jax.random.key(0))  # fits easily
  state = trainer.init(jax.random.key(0))
  size = lambda x: (jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x).nbytes
  state_bytes = sum(size(x) for x in jax.tree.leaves(state))
  # The arguments are the state (the quadratic family has no data), all donated to the outputs.
  assert estimate.arguments == estimate.aliased == state_bytes
  assert estimate.outputs >= state_bytes and estimate.peak == (estimate.arguments + estimate.outputs
                                                               - estimate.aliased + estimate.temporaries)
  with pytest.raises(resources.InsufficientMemoryError, match=r"needs about .* GiB .* only .* GiB"):
    resources.check_fits(resources.MemoryEstimate(2 ** 62, 0, 0, 0), jax.local_devices()[:1])


def test_host_memory_available_honours_the_address_space_limit():
  code = "from metafam.resources import host_memory_available as a; print(a() <= 3 * 2 ** 30)"
  proc = subprocess.run(_limited([sys.executable, "-c", code], address_space=3 * 2 ** 30), capture_output=True,
                        text=True, timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
  assert proc.stdout.strip() == "True", proc.stderr


def test_cli_refuses_a_run_that_cannot_fit_before_allocating_it(tmp_path, cache_dir):
  run = str(tmp_path / "run")
  started = time.monotonic()
  code, _, err = metafam(["meta-train", f"--output_dir={run}", "--family=fmnist_mlp_family_8x8_32",
                          "--optimizer=learnable_sgd", "--num_tasks=65536", "--num_steps=10",
                          "--progress=false"], cache_dir, address_space=6 * 2 ** 30)
  assert code == 2, err[-2000:]
  line = one_line(err, "metafam: error: the meta-step needs about ")
  need, have = (float(x) for x in re.findall(r"([0-9.]+) GiB", line))
  assert need > have and have < 6  # the number, against the limit it ran under
  assert time.monotonic() - started < 120
  assert not os.path.exists(run)  # refused: the directory it created (and locked) is gone again
