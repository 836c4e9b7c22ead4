"""Non-finite values are never silent: NaN rows in the data, a vector loss and a non-finite lane each get a message
naming them through `Trainer`, `TruncatedStep`, PES and the meta-training loop, and the good lanes are unchanged."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metafam import PES, ConstantSchedule, MetaTrainer, Task, TaskFamily, TruncatedStep
from metafam.datasets.base import ArraySplit, Datasets
from metafam.nonfinite import NonFiniteError, NonFiniteWarning
from metafam.optimizers.base import SGD
from metafam.optimizers.learned import LearnableSGD
from metafam.runs.loop import train
from metafam.training import Trainer


class _Rows(Task):
  """``mean((x * p)^2)`` over a batch of rows ``x``; ``nan_rows`` of the training rows are NaN."""

  def __init__(self, nan_rows=0.0, vector=False):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    if nan_rows:
      x[rng.random(200) < nan_rows] = np.nan
    clean = rng.normal(size=(200, 4)).astype(np.float32)
    self.datasets = Datasets(*(ArraySplit({"x": a}, batch_size=32, seed=i) for i, a in enumerate((x, clean, clean,
                                                                                                   clean))))
    self.vector, self.name = vector, "rows"

  def init(self, key):
    return jnp.ones((4,))

  def loss(self, params, key, batch):
    losses = jnp.square(batch["x"] * params)
    return losses if self.vector else jnp.mean(losses)


def _fit(task, **kwargs):
  return Trainer(task, SGD(0.1), eval_every=20, progress=False, **kwargs).fit(100, key=jax.random.key(0))


def test_trainer_names_nan_rows_in_the_data_and_keeps_the_fraction():
  with pytest.warns(NonFiniteWarning) as record:
    result = _fit(_Rows(nan_rows=0.05))
  (warning,) = record
  message = str(warning.message)
  losses = result.history.train_losses
  first = int(np.argmax(~np.isfinite(losses)))
  assert message.startswith("Trainer on task 'rows': non-finite train loss in ")
  assert f"of 100 steps ({100 * np.mean(~np.isfinite(losses)):.1f}%), the first at step {first};" in message
  assert "look for NaN or infinite values in the training data" in message and "final params are non-finite" in message
  assert "'inner_valid' loss was non-finite at 5 of 6 evaluations" in message
  assert result.nonfinite_fraction == pytest.approx(np.mean(~np.isfinite(losses))) and result.first_nonfinite_step == first
  with pytest.raises(NonFiniteError, match="on_nonfinite='raise' stopped the run after step 20"):
    _fit(_Rows(nan_rows=0.05), on_nonfinite="raise")


def test_trainer_on_finite_data_is_silent_and_unchanged_by_the_check():
  with warnings.catch_warnings():
    warnings.simplefilter("error", NonFiniteWarning)
    checked = _fit(_Rows(), ensemble_size=2)
  plain = _fit(_Rows(), ensemble_size=2, on_nonfinite="ignore")  # the program without the count
  np.testing.assert_array_equal(checked.final_params, plain.final_params)
  np.testing.assert_array_equal(checked.history.train_losses, plain.history.train_losses)
  assert checked.nonfinite_fraction == 0.0 and checked.first_nonfinite_step is None
  with pytest.raises(ValueError, match="on_nonfinite must be one of 'warn', 'raise', 'ignore'"):
    Trainer(_Rows(), SGD(0.1), on_nonfinite="loud")


def test_a_vector_loss_is_refused_with_the_task_and_its_shape():
  message = r"task 'rows': its loss must be a scalar \(one number per batch\), got an array of shape \(32, 4\)"
  with pytest.raises(ValueError, match=message):
    _fit(_Rows(vector=True))
  step = TruncatedStep(_Family(poison=False, vector=True), SGD(0.1), 4)
  state = step.init_step_state({}, jax.random.key(0))
  with pytest.raises(ValueError, match=r"task 'quad': its loss must be a scalar .* shape \(3,\)"):
    step.unroll({}, state, jax.random.key(1), 2)


class _Quad(Task):
  def __init__(self, cfg, poison, vector):
    self.cfg, self.poison, self.vector, self.name = cfg, poison, vector, "quad"

  def init(self, key):
    return jax.random.normal(key, (3,))

  def loss(self, params, key, batch):
    losses = jnp.square(params) * (1.0 + self.cfg)
    loss = losses if self.vector else jnp.sum(losses)
    return jnp.where(self.poison & (self.cfg < 0.3), jnp.nan, loss)  # the instances with cfg < 0.3 are poisoned


class _Family(TaskFamily):
  """Instances ``cfg ~ U(0, 1)``; with ``poison`` those with ``cfg < 0.3`` have a NaN loss, the others are the same."""
  datasets = None

  def __init__(self, poison, vector=False):
    self.poison, self.vector, self.name = poison, vector, "quad_family"

  def sample(self, key):
    return jax.random.uniform(key)

  def task_fn(self, cfg):
    return _Quad(cfg, self.poison, self.vector)


def _unroll(poison, **kwargs):
  step = TruncatedStep(_Family(poison), SGD(0.1), 8, ConstantSchedule(5), **kwargs)
  return step.unroll({}, step.init_step_state({}, jax.random.key(0)), jax.random.key(1), 10)[1]


def test_truncated_step_names_the_masked_lanes_and_leaves_the_others_unchanged():
  with warnings.catch_warnings():
    warnings.simplefilter("error", NonFiniteWarning)
    clean = _unroll(False)
  with pytest.warns(NonFiniteWarning) as record:
    out = _unroll(True)
  mask, codes = np.asarray(out.mask), np.asarray(out.nonfinite)
  assert 0 < mask.sum() < mask.size and np.array_equal(codes != 0, mask == 0) and set(codes.ravel()) == {0, 1}
  lanes = np.flatnonzero((mask == 0).any(axis=0))
  step, lane = (int(i[0]) for i in np.nonzero(mask == 0))
  (warning,) = record
  assert str(warning.message) == (
      f"TruncatedStep on family 'quad_family': {int((mask == 0).sum())} of 80 steps ({100 * np.mean(mask == 0):.1f}%) "
      f"of this unroll (10 steps x 8 lanes) were masked because a value went non-finite (the loss in "
      f"{int((mask == 0).sum())}); lanes {', '.join(map(str, lanes))} ({len(lanes)} of 8), the first at step {step} "
      f"of lane {lane}. A masked step reports loss 0 and mask 0 (UnrollOutput.nonfinite says what went non-finite) "
      "and ends its lane's trajectory; the other lanes are unaffected. on_nonfinite='raise' raises, 'ignore' skips "
      "this check.")
  good = mask.min(axis=0) > 0
  assert good.any()
  for field in ("loss", "meta_loss", "normalized_loss", "iteration"):  # bit for bit
    np.testing.assert_array_equal(np.asarray(getattr(out, field))[:, good], np.asarray(getattr(clean, field))[:, good])
  with pytest.raises(NonFiniteError, match=r"of this unroll \(10 steps x 8 lanes\) were masked"):
    _unroll(True, on_nonfinite="raise")
  with warnings.catch_warnings():
    warnings.simplefilter("error", NonFiniteWarning)
    _unroll(True, on_nonfinite="ignore")


def _pes(poison, **kwargs):
  return PES(TruncatedStep(_Family(poison), LearnableSGD(0.1), 4, ConstantSchedule(5), **kwargs), unroll_length=3,
             sigma=0.01)


def test_pes_reports_the_fraction_of_masked_pair_steps_and_its_good_lanes_are_unchanged():
  theta = LearnableSGD(0.1).init(jax.random.key(0))
  results = {}
  for poison in (False, True):
    pes = _pes(poison)
    worker = pes.init_worker_state(theta, jax.random.key(1))
    with warnings.catch_warnings(record=True) as record:
      warnings.simplefilter("always", NonFiniteWarning)
      estimate, worker = pes.estimate(theta, worker, jax.random.key(2), with_unroll_info=True)
    results[poison] = estimate, worker, [str(w.message) for w in record]
  (clean, clean_worker, clean_messages), (bad, bad_worker, messages) = results[False], results[True]
  assert clean_messages == [] and float(clean.metrics["nonfinite_fraction"]) == 0.0
  pair_masked = np.asarray(bad.unroll_info.mask) == 0  # the positive particles; a poisoned instance is in both
  fraction = float(bad.metrics["nonfinite_fraction"])
  assert fraction == pytest.approx(pair_masked.mean()) and 0 < fraction < 1
  assert messages == [f"PES on family 'quad_family': {int(pair_masked.sum())} of 12 pair-steps ({100 * fraction:.1f}%) "
                      f"of the estimate were masked because a value went non-finite (the loss in "
                      f"{int(bad.metrics['nonfinite_loss'])} lane-steps); the estimate is over the others "
                      "(GradientEstimate.metrics['nonfinite_fraction'])."]
  good = ~pair_masked.any(axis=0)  # pairs that never met a poisoned instance: their lanes are those of the clean run
  lanes = np.repeat(good, 2)
  assert good.any()
  for a, b in zip(jax.tree.leaves(bad_worker.lanes.opt_state), jax.tree.leaves(clean_worker.lanes.opt_state)):
    np.testing.assert_array_equal(np.asarray(a)[lanes], np.asarray(b)[lanes])


def test_the_meta_training_loop_warns_at_the_first_masked_meta_step_and_sums_up():
  trainer = MetaTrainer(LearnableSGD(0.1), [_pes(True, on_nonfinite="ignore")], optax.adam(1e-2))
  with pytest.warns(NonFiniteWarning) as record:
    _, history = train(trainer, 4, key=jax.random.key(0), progress=False)
  messages = [str(w.message) for w in record]
  masked = [h for h in history if h["nonfinite_fraction"] > 0]
  assert len(masked) >= 2 and all(0 <= h["nonfinite_fraction"] <= 1 for h in history)
  first = masked[0]
  assert messages[0].startswith(f"meta-step {first['step']}: PES on family 'quad_family': "
                                f"{100 * first['nonfinite_fraction']:.1f}% of the pair-steps of the estimate were masked")
  assert "It is the first meta-step of this session with masked steps" in messages[0]
  assert messages[-1].startswith(f"meta-training to meta-step 4: {len(masked)} meta-steps had masked (non-finite) inner "
                                 "steps")
  strict = MetaTrainer(LearnableSGD(0.1), [_pes(True, on_nonfinite="ignore")], optax.adam(1e-2), on_nonfinite="raise")
  with pytest.raises(NonFiniteError, match=f"meta-step {first['step']}: PES"):
    train(strict, 4, key=jax.random.key(0), progress=False)
