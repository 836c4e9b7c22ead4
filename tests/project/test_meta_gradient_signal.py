"""The statistics of experiments/meta_gradient_signal.py on synthetic draws with known answers (numpy only, no JAX
program is compiled: the script's measurement itself is too slow for the suite and is not run here).

Each tolerance is a few standard errors of the statistic at the sizes used (worked out next to it), so a correct
implementation fails with negligible probability for the fixed seeds, and a wrong scale (a missing sqrt(n), ddof,
a biased |mu|^2) moves the statistic far outside it.
"""

import importlib.util
import math
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SPEC = importlib.util.spec_from_file_location("meta_gradient_signal",
                                               os.path.join(ROOT, "experiments", "meta_gradient_signal.py"))
mgs = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault(_SPEC.name, mgs)  # dataclasses look their module up while the class is created
_SPEC.loader.exec_module(mgs)


def test_t_of_coordinates_with_a_known_snr():
  # n = 64 draws, every coordinate's mean is 0.5 of its sd (sds spread over two decades: t is scale-free), so
  # t_j = |mean| / (sd / 8) follows the noncentral t with 63 degrees of freedom and delta = 8 * 0.5 = 4: median
  # 4.017, sd 1.08. Over 4,000 coordinates the sample median's standard error is about 1.25 * 1.08 / sqrt(4000) =
  # 0.021; the tolerance 0.1 is about 5 of them.
  rng = np.random.default_rng(0)
  n, d, snr = 64, 4000, 0.5
  sd = np.exp(rng.uniform(np.log(0.1), np.log(10.0), d))
  draws = snr * sd * np.where(rng.random(d) < 0.5, -1, 1) + sd * rng.standard_normal((n, d))
  stats = mgs.signal_statistics(draws)
  assert stats["n"] == n and stats["d"] == d
  assert stats["median_t"] == pytest.approx(4.017, abs=0.1)
  assert stats["median_r"] == pytest.approx(4.017 / 8, abs=0.1 / 8)
  assert stats["frac_t_gt_2"] > 0.95  # P(t > 2) for delta = 4 is about 0.97
  np.testing.assert_allclose(stats["t"] / math.sqrt(n), stats["r"])


def test_t_without_signal_is_students_t():
  # With mean 0, |t_j| follows |t_63|: median 0.678 (its 75% quantile), P(|t| > 2) = 0.0498. Standard errors over
  # 4,000 coordinates: about 1.25 * 0.85 / sqrt(4000) = 0.017 for the median, sqrt(0.05 * 0.95 / 4000) = 0.0034
  # for the fraction; tolerances 0.06 and 0.015 (over 3.5 and 4 standard errors).
  rng = np.random.default_rng(1)
  stats = mgs.signal_statistics(rng.standard_normal((64, 4000)))
  assert stats["median_t"] == pytest.approx(0.678, abs=0.06)
  assert stats["frac_t_gt_2"] == pytest.approx(0.0498, abs=0.015)
  assert stats["rho2"] == pytest.approx(0.0, abs=0.01)  # |mu|^2 = 0: the U-statistic is centred on 0


def test_whole_vector_snr_and_half_cosine():
  # Isotropic unit noise in d = 400 dimensions around a mean with |mu|^2 = 4: rho^2 = 4 / 400 = 0.01. With n = 1024
  # the U-statistic's sd is sqrt(2 d / n^2 + 4 |mu|^2 / n) = 0.128 (3.2% of 4), the total variance's 0.2%: rtol
  # 0.12 is nearly 4 standard errors. The half means (512 draws each) have cosine about |mu|^2 / (|mu|^2 + 2 d / n)
  # = 0.837, with an sd of about 0.03 (tolerance 0.1); the cross-fitted projection's SNR is about
  # |mu| / 1 = 2 less what the fitted direction's error loses (cos 0.91 with mu: about 1.8; tolerance 0.4).
  rng = np.random.default_rng(2)
  n, d = 1024, 400
  mu = rng.standard_normal(d)
  mu *= 2.0 / np.linalg.norm(mu)
  stats = mgs.signal_statistics(mu + rng.standard_normal((n, d)))
  assert stats["rho2"] == pytest.approx(0.01, rel=0.12)
  # Its standard error: the U-statistic's sd worked out above, 0.128, over the total variance 400 (the estimate of
  # Var(g . mu) and tr(Sigma^2) from 1,024 draws is good to a few percent).
  assert stats["rho2_se"] == pytest.approx(0.128 / 400, rel=0.1)
  assert stats["rho"] == pytest.approx(0.1, rel=0.06)
  assert stats["total_var"] == pytest.approx(d, rel=0.02)
  assert stats["cos_half"] == pytest.approx(4 / (4 + 2 * d / n), abs=0.1)
  assert stats["proj_snr"] == pytest.approx(1.8, abs=0.4)


def test_noise_free_linear_es_has_efficiency_one_and_pairs_add_up():
  # The ES ceiling: an antithetic pair on a noise-free linear loss estimates (z . grad) z, z ~ N(0, I_d), whose
  # rho^2 is exactly 1 / (d + 1), so `es_efficiency` is 1. With d = 30 and n = 8,000 pairs the U-statistic's
  # relative sd is about sqrt(4 grad' Sigma grad / n) / |grad|^2 = sqrt(8 / 8000) = 3.2% and the heavy-tailed
  # variances add about 2% more: tolerance 0.15 (over 4 standard errors). Means of P = 8 pairs (1,000 of them) have
  # 8 times the rho^2 (relative sd about 4%: tolerance 0.2).
  rng = np.random.default_rng(3)
  n, d = 8000, 30
  grad = rng.standard_normal(d)
  z = rng.standard_normal((n, d))
  pairs = (z @ grad)[:, None] * z
  stats = mgs.signal_statistics(pairs)
  assert mgs.es_efficiency(stats["rho2"], d) == pytest.approx(1.0, abs=0.15)
  grouped = mgs.group_means(pairs, 8)
  assert grouped.shape == (n // 8, d)
  np.testing.assert_allclose(grouped[1], pairs[8:16].mean(axis=0))
  assert mgs.signal_statistics(grouped)["rho2"] == pytest.approx(8 / (d + 1), rel=0.2)
  # Two independent 8-pair estimates: cosine about rho^2 / (1 + rho^2) = 0.205 (sd of the mean over 500 pairs of
  # estimates about 0.2 / sqrt(500) = 0.009).
  assert mgs.mean_pairwise_cosine(grouped) == pytest.approx((8 / 31) / (1 + 8 / 31), abs=0.05)


def test_pairs_for_unit_snr():
  assert mgs.pairs_for_unit_snr(3.0, 256) == pytest.approx(32.0)  # r^2 = (9 - 1) / 256 per pair
  assert mgs.pairs_for_unit_snr(1.2, 256) == math.inf  # t^2 < 2: not resolved


@pytest.mark.parametrize("bad, match", [(np.zeros(10), "2-D"), (np.zeros((3, 5)), "at least 4"),
                                        (np.full((8, 2), np.nan), "finite")])
def test_statistics_refuse_bad_input(bad, match):
  with pytest.raises(ValueError, match=match):
    mgs.signal_statistics(bad)


def test_group_means_refuses_bad_groups():
  with pytest.raises(ValueError, match="positive int"):
    mgs.group_means(np.zeros((8, 2)), 0)
  with pytest.raises(ValueError, match="no group"):
    mgs.group_means(np.zeros((3, 2)), 4)


def test_zero_variance_coordinates():
  draws = np.zeros((8, 3))
  draws[:, 1] = 2.0  # constant and non-zero: infinitely significant
  draws[:, 2] = np.arange(8.0)
  t = mgs.signal_statistics(draws)["t"]
  assert t[0] == 0.0 and t[1] == math.inf and np.isfinite(t[2])


def test_settings_and_arguments():
  assert mgs.Setting("a", lengths=(100, 2000)).burn_in == 100  # the longest trajectory in truncations of 20
  assert mgs.Setting("b", estimator="full_es").burn_in == 0
  assert mgs.Setting("c", estimator="truncated_es").inner_steps_per_pair == 60
  for kwargs, match in [({"estimator": "es"}, "estimator"), ({"unroll_length": 0}, "unroll_length"),
                        ({"lengths": (10, 5)}, "lengths"), ({"loss_kind": "final"}, "loss_kind"),
                        ({"estimator": "full_es", "lengths": (10, 20)}, "full_es"), ({"theta": "x"}, "theta")]:
    with pytest.raises(ValueError, match=match):
      mgs.Setting("bad", **kwargs)
  assert [s.name for s in mgs.parse_args(["--only", "base,pes_20"]).settings] == ["base", "pes_20"]
  for argv in (["--only", "nope"], ["--pairs-total", "4"], ["--pairs-total", "16", "--only", "direct_p8"]):
    with pytest.raises(SystemExit):
      mgs.parse_args(argv)


def test_direction_cosine_is_corrected_for_noise():
  # Two expectations at a known angle (cosine 0.6), each seen through unit isotropic noise in d = 200 dimensions
  # with |mu|^2 = 1 and n = 2,000 draws: the raw cosine of the two sample means is about 0.6 / (1 + d / n) = 0.55,
  # the corrected one 0.6. Numerator and norms have relative sds of about 2-5% here; tolerance 0.06. Draw i of both
  # sets shares its noise (as settings drawn with the same keys may): the cross-fitted halves make that harmless.
  rng = np.random.default_rng(4)
  n, d = 2000, 200
  e1, e2 = np.eye(d)[0], np.eye(d)[1]
  mu_a, mu_b = e1, 0.6 * e1 + 0.8 * e2
  noise = rng.standard_normal((n, d))
  a, b = mu_a + noise, mu_b + 0.5 * noise + math.sqrt(0.75) * rng.standard_normal((n, d))
  assert mgs.direction_cosine(a, b) == pytest.approx(0.6, abs=0.06)
  alternating = np.outer(np.tile([1.0, -1.0], 32), rng.standard_normal(d))  # U-statistic < 0: no direction
  assert math.isnan(mgs.direction_cosine(alternating, b))
  with pytest.raises(ValueError, match="same d"):
    mgs.direction_cosine(a, b[:, :10])
