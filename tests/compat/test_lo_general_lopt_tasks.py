"""`research.general_lopt.tasks`: VeLO's MLP task list on four datasets, and its (timed, so unavailable) phases."""

import jax
import numpy as np
import pytest

from metafam.compat.learned_optimization.research.general_lopt.tasks import fast_mlp_diff_data as fmd
from metafam.compat.learned_optimization.research.general_lopt.tasks import parametric
from metafam.compat.learned_optimization.tasks.datasets.base import DatasetUnavailableError


def test_named_tasks_are_four_datasets_times_eight_seeds():
  assert len(fmd.TASKS) == 32 and all(callable(getattr(fmd, name)) for name in fmd.TASKS)
  assert [len(entry) for entry in fmd.jun24_fast_mlp_diff_data_task_list()] == [1, 1, 1, 1]


def test_fashion_mnist_family_trains_offline_and_its_weights_are_reparameterized():
  task = fmd.Jun24FastMLPEval_TaskFamily_fashion_mnist_Seed0()
  params = task.init(jax.random.key(0))
  # 8x8 inputs, 32 hidden units, 10 classes: (64 + 1) * 32 + (32 + 1) * 10 parameters.
  assert sum(np.size(p) for p in jax.tree.leaves(params)) == 65 * 32 + 33 * 10
  batch = next(task.datasets.train)
  assert batch["image"].shape == (fmd.inner_bs, 8, 8, 1)
  loss = float(task.loss(params, jax.random.key(1), batch))
  # Near chance (log 10 = 2.30) at initialization, but per-tensor weight scales in [0.01, 100] move it: only finite.
  assert np.isfinite(loss)
  # Different task-family seeds draw different reparameterizations of the same MLP.
  other = fmd._get_task(1, 3)
  other_params = other.init(jax.random.key(0))
  assert jax.tree.structure(other_params) == jax.tree.structure(params)
  assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(other_params)))


def test_datasets_metafam_cannot_serve_fail_only_when_a_batch_is_requested(monkeypatch):
  monkeypatch.delenv("METAFAM_CIFAR10_DIR", raising=False)
  for build in (fmd.cifar_task, fmd.svhn_task):
    task = build()  # building reads nothing
    with pytest.raises(DatasetUnavailableError):
      next(task.datasets.train)


@pytest.mark.parametrize("fn", [parametric.phase_one_distribution, parametric.phase_two_distribution])
def test_phase_distributions_need_the_timing_models(fn):
  with pytest.raises(NotImplementedError, match="runtime models"):
    fn(jax.random.key(0))
