"""Paired statistics (`metafam.benchmark.paired`) against hand-computed values and their definitions."""

import itertools

import numpy as np
import pytest

from metafam.benchmark import paired


# Two runs (rows) of two tasks (columns).
A = [[3.0, 1.0], [1.0, 1.0]]
B = [[2.0, 1.0], [2.0, 0.0]]


def test_probability_of_improvement_by_hand():
  # Task 0: a {3, 1} vs b {2, 2}: 3 > 2 twice, 1 < 2 twice -> 2/4. Task 1: a {1, 1} vs b {1, 0}: two ties (1/2 each)
  # and two wins -> 3/4. Mean over tasks: 5/8.
  p = paired.probability_of_improvement(A, B)
  assert p.value == pytest.approx(0.625, abs=0)
  assert p.statistic == "probability_of_improvement" and p.num_tasks == 2 and p.num_excluded == 0
  assert p.low <= p.value <= p.high
  # The reverse comparison: per task 1 - P (ties count half on both sides).
  assert paired.probability_of_improvement(B, A).value == pytest.approx(0.375, abs=0)


def test_probability_of_improvement_matches_its_definition():
  rng = np.random.default_rng(3)
  a = rng.integers(0, 4, size=(3, 5)).astype(float)  # small integers: many ties
  b = rng.integers(0, 4, size=(4, 5)).astype(float)
  per_task = []
  for m in range(5):
    s = [1.0 if x > y else 0.5 if x == y else 0.0 for x, y in itertools.product(a[:, m], b[:, m])]
    per_task.append(sum(s) / len(s))
  assert paired.probability_of_improvement(a, b).value == pytest.approx(np.mean(per_task), rel=1e-12)


def test_probability_of_improvement_interval():
  # One run per task: every bootstrap resample is the table itself, so the interval has zero width.
  p = paired.probability_of_improvement([[2.0, 0.0, 5.0]], [[1.0, 1.0, 5.0]])
  assert (p.value, p.low, p.high) == (pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.5))
  # A clearly better on every task and run: P = 1 with a degenerate interval at 1.
  rng = np.random.default_rng(0)
  b = rng.normal(size=(3, 12))
  p = paired.probability_of_improvement(b + 10.0, b)
  assert p.value == p.low == p.high == 1.0
  # Same distribution: the interval holds 0.5 (a statistical fact for these draws' sizes, not a pinned number).
  a = rng.normal(size=(5, 40))
  p = paired.probability_of_improvement(a, rng.normal(size=(5, 40)), num_resamples=500)
  assert p.low < 0.5 < p.high and 0.0 < p.high - p.low < 0.3


def test_iqm_difference_by_hand():
  # Pooled a = [3, 1, 1, 1] -> sorted [1, 1, 1, 3], IQM = mean([1, 1]) = 1; pooled b = [2, 1, 2, 0] -> [0, 1, 2, 2],
  # IQM = mean([1, 2]) = 1.5. Difference -0.5.
  d = paired.difference(A, B)
  assert d.statistic == "iqm difference"
  assert d.value == pytest.approx(-0.5, abs=1e-15)
  assert d.low <= d.value <= d.high
  assert paired.difference(A, B, statistic="mean").value == pytest.approx(1.5 - 1.25)


def test_paired_difference_cancels_shared_seed_noise():
  rng = np.random.default_rng(1)
  seeds = rng.normal(scale=5.0, size=(3, 10))  # large per-(seed, task) effects that A and B share
  shift = 0.25
  d = paired.difference(seeds + shift, seeds)
  # A = B + c on every run: every paired resample differs by exactly c (the IQM is translation equivariant).
  assert d.value == pytest.approx(shift) and d.low == pytest.approx(shift) and d.high == pytest.approx(shift)
  # Identical scores: exactly zero.
  z = paired.difference(seeds, seeds)
  assert z.value == z.low == z.high == 0.0


def test_nonfinite_tasks_are_left_out_of_both():
  a = [[1.0, np.nan, 3.0], [2.0, 1.0, 3.0]]
  b = [[0.0, 1.0, np.inf], [0.0, 1.0, 1.0]]
  p = paired.probability_of_improvement(a, b)
  assert p.num_tasks == 1 and p.num_excluded == 2 and p.value == 1.0
  d = paired.difference(a, b)
  assert d.num_tasks == 1 and d.value == pytest.approx(1.5)
  empty = paired.difference([[np.nan]], [[1.0]])
  assert empty.num_tasks == 0 and np.isnan(empty.value)


@pytest.mark.parametrize("call, match", [
    (lambda: paired.probability_of_improvement([1.0, 2.0], [[1.0, 2.0]]), "a must be a \\[runs, tasks\\]"),
    (lambda: paired.probability_of_improvement([[1.0, 2.0]], [[1.0]]), "same tasks"),
    (lambda: paired.difference([[1.0], [2.0]], [[1.0]]), "paired comparison needs the same runs"),
    (lambda: paired.difference(A, B, statistic="mode"), "statistic must be one of"),
    (lambda: paired.difference(A, B, confidence=1.0), "confidence must lie in"),
    (lambda: paired.probability_of_improvement(A, B, num_resamples=0), "num_resamples must be a positive"),
])
def test_bad_input_is_named(call, match):
  with pytest.raises(ValueError, match=match):
    call()
