"""The meta-training loop: PES meta-training finds the grid-search learning rate; checkpoints resume exactly."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meta_setup import build_trainer, quadratic_family
from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.optimizers.learned import LearnableSGD
from metafam.runs import CheckpointError, MetaValidation, train
from metafam.runs.run_dir import restore, run_identity
from metafam.taskfamilies.quadratic import QuadraticFamily

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the helper meta_setup.py is


def grid_search_log_lr(trajectory=50, lanes=256):
  """The meta-objective (mean loss after each update over a whole trajectory) on a grid of learning rates."""
  family, lopt = quadratic_family(), LearnableSGD()
  step = TruncatedStep(family, lopt, lanes, ConstantSchedule(trajectory), meta_loss_split="same_batch")
  grid = np.linspace(np.log(0.01), np.log(1.2), 41)

  @jax.jit
  def objective(log_lr):
    theta = {"log_lr": log_lr}
    lanes_state = step.init_fn(theta, jax.random.key(0))
    _, out = step.unroll_fn(theta, lanes_state, jax.random.split(jax.random.key(1), trajectory))
    return jnp.mean(out.meta_loss)

  values = np.array([float(objective(jnp.float32(g))) for g in grid])
  return grid[np.nanargmin(values)], values


def test_pes_meta_training_moves_log_lr_to_the_grid_search_optimum():
  best, values = grid_search_log_lr()
  trainer = build_trainer()
  state, history = train(trainer, 300, key=jax.random.key(0), progress=False)
  start, final = np.log(0.01), float(state.theta["log_lr"])
  # The optimum is far from the start (log 0.01 = -4.6); PES must close most of the gap.
  assert best - start > 3.0
  assert abs(final - best) < 0.25 * abs(best - start), (final, best)
  losses = np.array([h["meta_loss"] for h in history])
  assert losses[-30:].mean() < 0.5 * losses[:30].mean()
  assert all(np.isfinite(h["grad_norm"]) for h in history)


# In-process resumes of every estimator: tests/test_conformance.py (row ESTIMATORS); a killed process resumed:
# tests/runs/test_failures.py.
@pytest.mark.slow
def test_kill_and_resume_in_a_new_process_equals_an_uninterrupted_run(tmp_path):
  n = 6
  trainer = build_trainer(with_tbptt=True)
  straight, _ = train(trainer, n, key=jax.random.key(7), progress=False)
  out = str(tmp_path / "run")
  env = dict(os.environ, PYTHONPATH=TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
  for steps in (n // 2, n):  # first process stops at n/2 (a checkpoint), the second resumes from it
    subprocess.run([sys.executable, os.path.join(TESTS, "meta_setup.py"), out, str(steps)], check=True, env=env,
                   capture_output=True, timeout=600)
  resumed = restore(trainer, os.path.join(out, "checkpoint.npz"), trainer.init(jax.random.key(7)),
                    run_identity(trainer))
  assert int(resumed.step) == n
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7),
               straight, resumed)
  with open(os.path.join(out, "metrics.jsonl")) as f:
    steps = [json.loads(line)["step"] for line in f]
  assert steps == list(range(1, n + 1))


def test_checkpoint_from_another_run_or_corrupted_is_refused(tmp_path):
  trainer = build_trainer()
  state, _ = train(trainer, 2, key=jax.random.key(0), output_dir=str(tmp_path), progress=False)
  ckpt = tmp_path / "checkpoint.npz"
  before = ckpt.read_bytes()
  other = build_trainer(with_tbptt=True)
  with pytest.raises(CheckpointError, match="different run"):
    train(other, 4, output_dir=str(tmp_path), progress=False)
  assert ckpt.read_bytes() == before  # nothing was overwritten
  ckpt.write_bytes(before[: len(before) // 2])
  with pytest.raises(CheckpointError, match="corrupted"):
    train(trainer, 4, output_dir=str(tmp_path), progress=False)


def test_meta_validation_scores_the_same_instances_of_every_family_at_every_check():
  lopt = LearnableSGD(0.01)
  families = [quadratic_family(), QuadraticFamily(4, scale_range=(1.0, 1.0))]
  validation = MetaValidation(lopt, families, num_tasks=4, num_steps=20)
  good, bad = {"log_lr": jnp.log(jnp.float32(0.5))}, lopt.init(None)
  first, again = validation(good, 1), validation(good, 500)
  assert first == again  # fixed instances and batches: the meta-step does not enter
  worse = validation(bad, 1)
  names = validation.names
  assert names == [families[0].name, families[1].name] and len(set(names)) == 2
  for name in names:
    # SGD at rate 0.5 against 0.01 on quadratics of curvature about 1, 20 steps: the first converges, the second
    # has barely moved.
    assert first[f"eval/{name}/final_loss"] < 0.01 * worse[f"eval/{name}/final_loss"]
    assert first[f"eval/{name}/final_loss_sd"] >= 0
    assert first[f"eval/{name}/mean_loss"] >= first[f"eval/{name}/final_loss"]
  np.testing.assert_allclose(worse["eval_final_loss"], np.mean([worse[f"eval/{n}/final_loss"] for n in names]))
  # The numbers are the per-instance curves' (one program): the mean and spread of the last step over instances.
  curves = validation.instance_curves(bad)[names[0]]
  assert curves.shape == (20, 4)
  np.testing.assert_allclose(worse[f"eval/{names[0]}/final_loss"], curves[-1].mean(), rtol=1e-6)
  np.testing.assert_allclose(worse[f"eval/{names[0]}/final_loss_sd"], curves[-1].std(), rtol=1e-6)
  with pytest.raises(ValueError, match="eval_every needs evaluate="):
    train(build_trainer(), 2, eval_every=1, progress=False)
  with pytest.raises(ValueError, match="evaluate= needs eval_every="):
    train(build_trainer(), 2, evaluate=validation, progress=False)
  with pytest.raises(ValueError, match="num_tasks"):
    MetaValidation(lopt, families, num_tasks=0)
  with pytest.raises(ValueError, match="split must be one of .*'outer_valid'.*got 'valid'"):
    MetaValidation(lopt, families, split="valid")
  good_curve = validation.instance_curves(good)[names[0]].mean(axis=1)
  assert np.all(np.diff(good_curve) < 0)  # deterministic gradient descent at a stable rate: every step improves


def test_meta_optimizer_schedule_warms_up_decays_and_holds():
  from metafam.outer_trainers import meta_optimizer
  lr, decay = 1e-2, 1000
  tx = meta_optimizer(lr, decay)  # warmup min(100, 1000 // 10) = 100
  ones = jnp.ones(3)

  @jax.jit
  def rates(state):
    def step(state, _):
      update, state = tx.update(ones, state)
      return state, -update[0]  # Adam's step on a constant gradient is the learning rate (eps 1e-8 aside)
    return jax.lax.scan(step, state, None, length=2001)[1]

  got = np.asarray(rates(tx.init(ones)))
  # Linear warmup from 0 over 100 steps, cosine from lr to 0.1 lr over steps 100..1000, then 0.1 lr for good.
  want = {0: 0.0, 50: 0.5 * lr, 100: lr, 550: lr * (0.1 + 0.9 * 0.5), 1000: 0.1 * lr, 2000: 0.1 * lr}
  for t, rate in want.items():
    np.testing.assert_allclose(got[t], rate, rtol=1e-4, atol=1e-9)
  assert np.all(np.diff(got[100:1001]) <= 1e-9) and np.all(np.diff(got[:101]) >= 0)
  # decay_steps=0: Adam at a constant rate.
  const = meta_optimizer(lr)
  update, _ = const.update(ones, const.init(ones))
  np.testing.assert_allclose(-np.asarray(update), lr, rtol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(learning_rate=float("nan")), "learning_rate must be a positive number"),
    (dict(learning_rate=1e-3, decay_steps=-1), r"decay_steps must be an int >= 0 \(0: constant learning rate\), got -1"),
    (dict(learning_rate=1e-3, decay_steps=2.5), "decay_steps must be an int >= 0"),
    (dict(learning_rate=1e-3, decay_steps=100, warmup_steps=100), r"warmup_steps must be an int in \[0, decay_steps"),
    (dict(learning_rate=1e-3, end_fraction=1.5), r"end_fraction must lie in \[0, 1\], got 1.5"),
])
def test_meta_optimizer_bad_arguments_are_named(kwargs, message):
  from metafam.outer_trainers import meta_optimizer
  with pytest.raises(ValueError, match=message):
    meta_optimizer(**kwargs)


def test_loop_dispatches_the_next_meta_step_before_fetching_metrics(tmp_path):
  """The loop never leaves the device idle between meta-steps: step k's record is made after step k + 1 was
  dispatched, except where the host needs step k's state (a checkpoint, an evaluation, the last step), which is
  recorded before the next dispatch. Its records are the metrics `step` returns, in one copy (`step_packed`)."""
  trainer = build_trainer(num_tasks=2, unroll_length=2, trajectory=6)
  dispatched, seen = [], []
  original = trainer.step_packed

  def counting(state):
    dispatched.append(1)
    return original(state)

  trainer.step_packed = counting
  state = trainer.init(jax.random.key(3))
  reference = build_trainer(num_tasks=2, unroll_length=2, trajectory=6)
  ref_state, ref_metrics = reference.init(jax.random.key(3)), []
  for _ in range(7):
    ref_state, metrics = reference.step(ref_state)
    ref_metrics.append({k: float(v) for k, v in jax.device_get(metrics).items()})
  validation = MetaValidation(trainer.learned_opt, [quadratic_family()], num_tasks=4, num_steps=20)
  _, history = train(trainer, 7, state=state, output_dir=str(tmp_path), checkpoint_every=3, evaluate=validation,
                     eval_every=5, progress=False,
                     log_fn=lambda record: seen.append((record["step"], len(dispatched))))
  assert [s for s, _ in seen] == [1, 2, 3, 4, 5, 6, 7]
  # Steps 3 and 6 (checkpoints), 5 (evaluation) and 7 (the last) are recorded before the next dispatch.
  assert seen == [(1, 2), (2, 3), (3, 3), (4, 5), (5, 5), (6, 6), (7, 7)]
  for record, ref in zip(history, ref_metrics):
    assert {k: record[k] for k in ref} == ref  # bit for bit what `step` returns
  assert "eval_final_loss" in history[4] and "eval_final_loss" not in history[3]
  lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [line["step"] for line in lines] == list(range(1, 8))
