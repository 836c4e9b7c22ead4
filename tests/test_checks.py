"""The shared argument checks of `metafam._checks`."""

import numpy as np
import pytest

from metafam._checks import check_positive, check_positive_int


@pytest.mark.parametrize("value", [0, -1, True, np.bool_(True), float("nan"), float("inf"), "1", None])
def test_check_positive_refuses(value):
  with pytest.raises(ValueError, match=r"x must be a positive number \(finite, not a bool\), got "):
    check_positive("x", value)


def test_check_positive_accepts_and_integer_mode():
  assert check_positive("x", 0.5) == 0.5 and check_positive("x", np.float32(2)) == 2
  assert check_positive("n", 3, integer=True) == 3
  with pytest.raises(ValueError, match=r"n must be a positive int \(finite, not a bool\), got 1.5"):
    check_positive("n", 1.5, integer=True)


@pytest.mark.parametrize("value", [0, -2, True, np.bool_(True), 1.0, np.float64(2), "3", None])
def test_check_positive_int_refuses(value):
  with pytest.raises(ValueError, match="n must be a positive int, got "):
    check_positive_int("n", value)


def test_check_positive_int_accepts_python_and_numpy_ints():
  assert check_positive_int("n", 4) == 4
  out = check_positive_int("n", np.int64(7))
  assert out == 7 and type(out) is int
