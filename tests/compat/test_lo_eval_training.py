"""`eval_training` of the learned_optimization compat layer: LO's dict of curves, with values checked against a
hand-written training loop on a data-free quadratic (where the curve does not depend on the keys)."""

import jax
import numpy as np
import pytest

from metafam.compat.learned_optimization import eval_training
from metafam.compat.learned_optimization.learned_optimizers import base as lopt_base
from metafam.compat.learned_optimization.optimizers import optax_opts
from metafam.compat.learned_optimization.tasks import quadratics


def test_single_task_curves_match_a_plain_sgd_loop():
  task = quadratics.QuadraticTask(4)
  res = eval_training.single_task_training_curves(task, optax_opts.SGD(0.1), 6, jax.random.PRNGKey(0),
                                                  eval_every=3, eval_batches=2, last_eval_batches=4)
  np.testing.assert_array_equal(res["train/xs"], np.arange(7))
  np.testing.assert_array_equal(res["eval/xs"], [0, 3, 6])
  assert int(res["eval/eval_batches"]) == 2 and int(res["eval/last_eval_batches"]) == 4
  # The curve of sum(p^2) under SGD(0.1) shrinks by 0.8**2 per step from the initial loss.
  first = res["train/loss"][0]
  np.testing.assert_allclose(res["train/loss"], first * 0.64 ** np.arange(7), rtol=1e-5)
  for split in ("train", "outer_valid", "test"):
    np.testing.assert_allclose(res[f"eval/{split}/loss"], res["train/loss"][[0, 3, 6]], rtol=1e-5)
    np.testing.assert_allclose(res[f"eval/{split}/loss_normalized"], res[f"eval/{split}/loss"], rtol=1e-6)


def test_single_task_curves_with_data_and_no_eval():
  res = eval_training.single_task_training_curves(quadratics.BatchQuadraticTask(), optax_opts.Adam(0.01), 5,
                                                  jax.random.PRNGKey(1), eval_every=2, eval_batches=0)
  assert set(res) == {"train/xs", "train/loss"} and res["train/loss"].shape == (6,)
  assert np.all(np.isfinite(res["train/loss"]))


def test_multi_task_curves_eval_matches_train_on_a_data_free_family():
  family = quadratics.FixedDimQuadraticFamily(5)
  lopt = lopt_base.LearnableSGD(initial_lr=0.1)
  theta = lopt.init(jax.random.PRNGKey(0))
  res = eval_training.multi_task_training_curves(family, lopt, theta, n_tasks=3, key=jax.random.PRNGKey(2),
                                                 eval_every=4, steps_per_jit=2, steps=8,
                                                 splits=("train", "test"), with_aux_values=())
  assert res["train/loss"].shape == (3, 8)
  np.testing.assert_array_equal(res["eval/xs"], np.tile([0, 4, 8], (3, 1)))
  # Without data, evaluating after i updates gives the training loss of step i.
  np.testing.assert_allclose(res["eval/train/loss"][:, :2], res["train/loss"][:, [0, 4]], rtol=1e-5)
  np.testing.assert_allclose(res["eval/test/loss"], res["eval/train/loss"], rtol=1e-6)
  assert len(set(np.round(res["train/loss"][:, 0], 4))) == 3  # three different sampled tasks
  assert np.all(res["train/loss"][:, -1] < res["train/loss"][:, 0])
  with pytest.raises(ValueError):
    eval_training.multi_task_training_curves(family, lopt, theta, n_tasks=2, steps=9, steps_per_jit=2)


def test_multi_task_curves_report_requested_aux_only():
  family = quadratics.FixedDimQuadraticFamilyData(4)
  lopt = lopt_base.LearnableSGD()
  res = eval_training.multi_task_training_curves(family, lopt, lopt.init(jax.random.PRNGKey(0)), n_tasks=2,
                                                 key=jax.random.PRNGKey(0), eval_every=2, steps_per_jit=2, steps=4,
                                                 with_aux_values=("l1",))
  assert "eval/train/aux/l1" in res and "eval/train/aux/l2" not in res
  assert res["eval/train/aux/l1"].shape == (2, 3)
  assert np.all(res["eval/train/aux/l1"] > 0)
