"""metafam.evaluation.report: the meta-train report (summary.json and plots) from a synthetic history and comparison."""

import json
import math
import os
import sys

import numpy as np
import pytest

from metafam.evaluation.comparison import score_comparison
from metafam.evaluation.report import ema, meta_train_summary, validation_series, write_meta_train_report

T, N = 20, 4


def comparison():
  t = np.arange(1, 4 * T + 1, dtype=np.float64)[:, None]
  adam = np.exp(-0.05 * t) * np.ones((1, N))
  learned = {name: np.exp(-0.05 * speed * t[:T]) * np.ones((1, N))
             for name, speed in (("learned (init)", 0.5), ("learned (final)", 2.0))}
  return score_comparison("synthetic", adam[:T], adam, learned, adam_lr=1e-2,
                          adam_select_scores={1e-3: 0.5, 1e-2: 0.3, 1e-1: math.inf})


HISTORY = [{"step": s, "meta_loss": float("nan") if s == 3 else 1.0 / s, "grad_norm": 1.0} for s in range(1, 13)]
HISTORY[5].update({"eval_final_loss": 0.4, "eval_final_loss_sd": 0.1, "eval/a/final_loss": 0.5,
                   "eval/a/final_loss_sd": 0.1, "eval/b/final_loss": 0.3, "eval/b/final_loss_sd": 0.1})
HISTORY[11].update({"eval_final_loss": 0.2, "eval_final_loss_sd": 0.05, "eval/a/final_loss": 0.25,
                    "eval/a/final_loss_sd": float("inf"), "eval/b/final_loss": 0.15, "eval/b/final_loss_sd": 0.05})


def test_report_writes_the_summary_and_plots(tmp_path):
  pytest.importorskip("matplotlib")
  cmp, config = comparison(), {"family": "synthetic", "seed": 0}
  written = write_meta_train_report(str(tmp_path), HISTORY, cmp, config, meta_steps=12, train_seconds=3.5,
                                    inner_steps_per_meta_step=160)
  assert written == ["summary.json", "meta_loss.png", "inner_curves.png", "meta_validation.png"]
  assert sorted(os.listdir(tmp_path)) == sorted(written)  # no temporary files left behind
  for name in written[1:]:
    assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  text = (tmp_path / "summary.json").read_text()
  summary = json.loads(text)
  assert text == json.dumps(summary, indent=2, sort_keys=True) + "\n"
  assert set(summary) == {"config", "meta_steps", "train_seconds_this_session", "meta_step_seconds_total",
                          "inner_steps_total", "eval", "meta_loss_first_10", "meta_loss_last_10"}
  assert summary["inner_steps_total"] == 12 * 160
  assert summary["meta_step_seconds_total"] == pytest.approx(sum(h.get("seconds", 0.0) for h in HISTORY))
  assert summary["config"] == config and summary["meta_steps"] == 12 and summary["train_seconds_this_session"] == 3.5
  assert summary["eval"] == json.loads(json.dumps(cmp.to_json()))
  assert summary["eval"]["learned"]["learned (final)"]["speedup"]["value"] == pytest.approx(2.0)  # c(2t) vs c(t)
  assert summary["eval"]["adam"]["select_scores"]["0.1"] is None  # a diverged lr's inf score
  assert summary["meta_loss_first_10"] == [1.0, 0.5, None] + [1.0 / s for s in range(4, 11)]
  assert summary["meta_loss_last_10"] == [None] + [1.0 / s for s in range(4, 13)]  # steps 3..12
  assert summary == json.loads(json.dumps(meta_train_summary(HISTORY, cmp, config, 12, 3.5, 160)))


def test_validation_series_reads_the_checks_per_family_and_their_mean():
  series = validation_series(HISTORY)
  assert list(series) == ["a", "b", "mean over families"]
  np.testing.assert_array_equal(series["a"]["step"], [6, 12])
  np.testing.assert_array_equal(series["a"]["final_loss"], [0.5, 0.25])
  np.testing.assert_array_equal(series["a"]["final_loss_sd"], [0.1, np.inf])
  np.testing.assert_array_equal(series["mean over families"]["final_loss"], [0.4, 0.2])
  assert validation_series(HISTORY[:5]) == {}
  old = [{"step": 4, "meta_loss": 1.0, "eval_final_loss": 0.3}]  # a record of a run from before the families
  assert list(validation_series(old)) == ["held-out loss"] and np.isnan(validation_series(old)["held-out loss"][
      "final_loss_sd"][0])


def test_without_matplotlib_only_the_summary_is_written(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
  written = write_meta_train_report(str(tmp_path), [], comparison(), {}, meta_steps=0, train_seconds=0.0)
  assert written == ["summary.json"] and os.listdir(tmp_path) == ["summary.json"]
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["meta_loss_first_10"] == [] and summary["meta_loss_last_10"] == []


def test_ema_is_bias_corrected_and_skips_nan():
  out = ema([2.0, float("nan"), 4.0], 0.5)
  assert out[0] == 2.0 and out[1] == 2.0 and out[2] == pytest.approx((0.25 * 2 + 0.5 * 4) / 0.75)
  assert math.isnan(ema([float("nan")], 0.5)[0])
