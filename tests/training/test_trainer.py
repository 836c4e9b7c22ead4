"""Trainer: history, callbacks, early stopping, keep-best params, ensembles and argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.datasets.base import ArraySplit, Datasets
from metafam.evaluation import tree_take
from metafam.optimizers.base import SGD
from metafam.tasks.base import Task
from metafam.training import Callback, EarlyStopping, Trainer


class _Pull(Task):
  """``0.5 * mean_b (p - x_b)^2`` from ``p0 = 0``. Train rows are 2 and every validation row is 1, so SGD moves
  ``p_t = 2 (1 - (1 - lr)^t)`` past the validation optimum: the validation loss falls, then rises."""

  def __init__(self):
    def split(value, seed):
      return ArraySplit({"x": np.full((16, 1), value, np.float32)}, batch_size=4, seed=seed)
    self.datasets = Datasets(split(2.0, 0), split(1.0, 1), split(1.0, 2), split(1.0, 3))

  def init(self, key):
    return jnp.zeros((1,), jnp.float32)

  def loss(self, params, key, batch):
    return 0.5 * jnp.mean(jnp.square(params[None] - batch["x"]))


PULL, OPT, LR = _Pull(), SGD(0.1), 0.1


def _p(t):
  return 2.0 * (1.0 - (1.0 - LR) ** np.asarray(t, np.float64))


def _valid(t):
  return 0.5 * (_p(t) - 1.0) ** 2  # evaluated at steps 0, 2, 4, ...: lowest at step 6


def _trainer(**kwargs):
  return Trainer(PULL, OPT, **dict(dict(eval_every=2, eval_batches=2, progress=False), **kwargs))


def test_early_stopping_stops_at_the_expected_eval_and_keeps_the_best_params():
  early = EarlyStopping(monitor="inner_valid", patience=2)
  result = _trainer(callbacks=[early]).fit(100, key=jax.random.key(0))
  hist = result.history
  # Valid losses at 0..10: 0.5, 0.19, 0.049, 0.0020 (best, step 6), 0.0097, 0.046 -> two evals without improvement.
  np.testing.assert_array_equal(hist.eval_steps, [0, 2, 4, 6, 8, 10])
  np.testing.assert_allclose(hist.curve("inner_valid"), _valid(hist.eval_steps), rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(hist.train_losses, 0.5 * (_p(np.arange(10)) - 2.0) ** 2, rtol=1e-5)
  assert result.stopped_step == 10 and early.stopped_step == 10 and hist.num_steps == 10
  assert result.best_step == 6 and early.best_step == 6
  np.testing.assert_allclose(result.best_loss, _valid(6), rtol=1e-4)
  np.testing.assert_allclose(result.params, [_p(6)], rtol=1e-5)
  np.testing.assert_allclose(result.final_params, [_p(10)], rtol=1e-5)
  assert int(result.opt_state.iteration) == 10


def test_min_delta_demands_larger_improvements():
  early = EarlyStopping(patience=2, min_delta=0.35)
  result = _trainer(callbacks=[early]).fit(100)
  # 0.5 -> 0.19 is not 0.35 better (wait 1); 0.049 is (best, step 4); 0.0020 and 0.0097 are not -> stop at 8.
  assert early.best_step == 4 and result.stopped_step == 8
  assert result.best_step == 6  # keep-best still returns the lowest loss seen
  np.testing.assert_allclose(result.params, [_p(6)], rtol=1e-5)


def test_keep_best_without_early_stopping():
  best = _trainer().fit(20)
  assert best.stopped_step is None and best.history.eval_steps.tolist() == list(range(0, 21, 2))
  assert best.best_step == 6
  np.testing.assert_allclose(best.params, [_p(6)], rtol=1e-5)
  np.testing.assert_allclose(best.final_params, [_p(20)], rtol=1e-5)
  last = _trainer(keep_best=False).fit(20)
  np.testing.assert_allclose(last.params, [_p(20)], rtol=1e-5)
  np.testing.assert_array_equal(last.params, last.final_params)


class _Recorder(Callback):

  def __init__(self, stop_at=None):
    self.stop_at, self.begins, self.steps, self.losses, self.evals, self.ends = stop_at, 0, [], [], [], []

  def on_train_begin(self, trainer):
    self.begins += 1

  def on_step(self, trainer, step, loss):
    self.steps.append(step)
    self.losses.append(loss)
    if step == self.stop_at:
      trainer.stop_training = True

  def on_eval(self, trainer, step, losses):
    self.evals.append((step, dict(losses)))

  def on_train_end(self, trainer, result):
    self.ends.append(result)


def test_callbacks_see_every_step_and_eval():
  rec = _Recorder()
  trainer = _trainer(eval_every=3, eval_splits=("inner_valid", "test"), callbacks=[rec])
  result = trainer.fit(7)
  assert rec.begins == 1 and rec.steps == list(range(7)) and len(rec.ends) == 1 and rec.ends[0] is trainer.result
  np.testing.assert_allclose(rec.losses, result.history.train_losses)
  assert [s for s, _ in rec.evals] == [0, 3, 6, 7] == result.history.eval_steps.tolist()
  for i, (step, losses) in enumerate(rec.evals):
    assert set(losses) == {"inner_valid", "test"} and isinstance(losses["test"], float)
    np.testing.assert_allclose(losses["test"], _valid(step), rtol=1e-4, atol=1e-7)
    assert losses["test"] == result.history.curve("test")[i]
  with pytest.raises(KeyError, match="outer_valid"):
    result.history.curve("outer_valid")


def test_a_stop_requested_mid_chunk_ends_training_at_the_next_eval():
  rec = _Recorder(stop_at=3)
  result = _trainer(eval_every=4, keep_best=False, callbacks=[rec]).fit(40)
  assert result.stopped_step == 4 and result.history.num_steps == 4 and rec.steps == [0, 1, 2, 3]
  np.testing.assert_allclose(result.params, [_p(4)], rtol=1e-5)


def test_progress_bar_shows_train_and_monitored_loss(capsys):
  _trainer(progress=True).fit(4)
  err = capsys.readouterr().err
  assert "train_loss" in err and "inner_valid" in err and "4/4" in err


def test_arguments_are_checked_up_front():
  cases = [(dict(eval_every=0), ValueError, "eval_every"), (dict(eval_batches=0), ValueError, "eval_batches"),
           (dict(monitor="valid"), ValueError, "monitor"), (dict(monitor="test"), ValueError, "eval_splits"),
           (dict(eval_splits=("inner_valid", "dev")), ValueError, "eval_splits"),
           (dict(callbacks=[EarlyStopping(monitor="test")]), ValueError, "eval_splits"),
           (dict(callbacks=[object()]), TypeError, "callbacks"), (dict(ensemble_size=0), ValueError, "ensemble_size"),
           (dict(same_batches=True), ValueError, "ensemble_size"), (dict(same_init=True), ValueError, "ensemble_size")]
  for kwargs, error, match in cases:
    with pytest.raises(error, match=match):
      _trainer(**kwargs)
  with pytest.raises(ValueError, match="num_steps"):
    _trainer().fit(0)
  with pytest.raises(TypeError, match="task"):
    Trainer("task", OPT)
  with pytest.raises(TypeError, match="optimizer"):
    Trainer(PULL, "sgd")
  with pytest.raises(ValueError, match="monitor"):
    EarlyStopping(monitor="valid")
  with pytest.raises(ValueError, match="patience"):
    EarlyStopping(patience=0)
  with pytest.raises(ValueError, match="min_delta"):
    EarlyStopping(min_delta=-1.0)


# -- ensembles ----------------------------------------------------------------------------------------------------
class _Regression(Task):
  """``0.5 * mean_b (w . x_b - y_b)^2`` on random data, ``w ~ N(0, 1)``: batches and inits both matter."""

  def __init__(self):
    rng = np.random.default_rng(0)

    def split(i):
      x = rng.standard_normal((64, 3)).astype(np.float32)
      y = (x @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.standard_normal(64)).astype(np.float32)
      return ArraySplit({"x": x, "y": y}, batch_size=8, seed=i)
    self.datasets = Datasets(*(split(i) for i in range(4)))

  def init(self, key):
    return jax.random.normal(key, (3,), jnp.float32)

  def loss(self, params, key, batch):
    return 0.5 * jnp.mean(jnp.square(batch["x"] @ params - batch["y"]))


REGRESSION = _Regression()


def _fit_ensemble(use_device_data=None, **kwargs):
  trainer = Trainer(REGRESSION, OPT, eval_every=5, eval_batches=2, progress=False, ensemble_size=3,
                    use_device_data=use_device_data, **kwargs)
  return trainer.fit(10, key=jax.random.key(1))


def _rows_identical(x):
  return all(np.array_equal(x[0], x[i]) for i in range(1, len(x)))


def _rows_distinct(x):
  return all(not np.allclose(x[i], x[j]) for i in range(len(x)) for j in range(i))


@pytest.mark.parametrize("use_device_data", [None, False], ids=["device", "host"])
def test_ensemble_same_vs_different_batches(use_device_data):
  same = _fit_ensemble(use_device_data, same_batches=True, same_init=True)
  assert same.history.train_losses.shape == (3, 10) and same.history.curve("inner_valid").shape == (3, 3)
  assert same.params.shape == (3, 3) and same.final_params.shape == (3, 3)
  assert _rows_identical(same.history.train_losses) and _rows_identical(same.final_params)
  assert _rows_identical(same.history.curve("inner_valid"))
  assert same.history.train_losses[0, -1] < 0.5 * same.history.train_losses[0, 0]  # it learns

  diff = _fit_ensemble(use_device_data, same_batches=False, same_init=True)
  assert _rows_distinct(diff.history.train_losses[:, :1])  # same params, different first batches
  assert _rows_distinct(diff.final_params)
  assert _rows_identical(diff.history.curve("inner_valid")[:, :1])  # same init, shared evaluation batches
  np.testing.assert_array_equal(tree_take(diff.history.train_losses, 0)[0], diff.history.train_losses[0, 0])


def test_ensemble_different_inits_with_same_batches_differ():
  res = _fit_ensemble(same_batches=True)
  inits = res.history.curve("inner_valid")[:, 0]
  assert _rows_distinct(inits[:, None]) and _rows_distinct(res.final_params)


def test_ensemble_early_stopping_and_keep_best():
  early = EarlyStopping(patience=2)
  result = _trainer(ensemble_size=2, callbacks=[early]).fit(100)
  assert result.stopped_step == 10 and result.best_step == 6 and result.history.train_losses.shape == (2, 10)
  np.testing.assert_allclose(result.params, [[_p(6)], [_p(6)]], rtol=1e-5)
  np.testing.assert_allclose(result.final_params, [[_p(10)], [_p(10)]], rtol=1e-5)
