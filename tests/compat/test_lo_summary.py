"""`learned_optimization.summary` under the compat prefix: values come out of jit, vmap and scan, reduced as their
aggregation says; nothing is added to a program traced without collection; writers and host-side merging."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.compat.learned_optimization import summary


def _fn(x):
  """Summaries at the top level, in a scan body, under vmap and inside a nested jit; returns sum(x)."""
  summary.summary("top", x)  # mean over 4 entries
  with summary.summary_scope("outer"):
    def body(c, xi):
      summary.summary("step", 2.0 * xi)  # one scalar per scan step
      summary.summary("steps", xi, aggregation="collect")
      return c + xi, None
    total, _ = jax.lax.scan(body, 0.0, x)
  jax.vmap(lambda z: summary.summary("lanes", z ** 2, aggregation="collect"))(x)
  jax.jit(lambda z: summary.summary("tensor", z + 1.0, aggregation="tensor"))(x)
  summary.summary("total", total, aggregation="none")
  return total


def test_values_come_out_of_jit_vmap_and_scan_reduced_per_aggregation():
  x = jnp.arange(4.0)
  out, metrics = jax.jit(summary.with_summary_output_reduced(_fn))(x)
  assert float(out) == 6.0
  np.testing.assert_allclose(metrics["mean||top"], 1.5)  # mean(0, 1, 2, 3)
  np.testing.assert_allclose(metrics["mean||outer/step"], 3.0)  # mean over steps of 2 x_i
  np.testing.assert_allclose(metrics["collect||outer/steps"], [0, 1, 2, 3])  # one entry per step, in order
  np.testing.assert_allclose(metrics["collect||lanes"], [0, 1, 4, 9])  # one entry per vmap lane
  np.testing.assert_allclose(metrics["tensor||tensor"], [1, 2, 3, 4])
  assert metrics["none||total"].shape == () and float(metrics["none||total"]) == 6.0
  assert set(metrics) == {"mean||top", "mean||outer/step", "collect||outer/steps", "collect||lanes",
                          "tensor||tensor", "none||total"}


def test_repeated_names_are_merged_by_element_count():
  def f(x):
    summary.summary("a", x)  # 3 entries of 1
    summary.summary("a", jnp.asarray(5.0))  # one entry of 5
    return x

  _, metrics = summary.with_summary_output_reduced(f)(jnp.ones(3))
  np.testing.assert_allclose(metrics["mean||a"], (3 * 1.0 + 5.0) / 4)


def test_sample_draws_one_of_the_values_and_needs_a_key():
  def f(x):
    summary.summary("s", x, aggregation="sample")
    return x

  x = jnp.asarray([10.0, 20.0, 30.0])
  draws = {float(summary.with_summary_output_reduced(f)(x, sample_rng_key=jax.random.PRNGKey(i))[1]["sample||s"])
           for i in range(40)}
  # 40 draws from 3 values: every draw is one of them, and missing one value has probability 3 (2/3)^40 < 1e-6.
  assert draws == {10.0, 20.0, 30.0}
  with pytest.raises(ValueError, match="sample_rng_key"):
    summary.with_summary_output_reduced(f)(x)


def test_gradients_pass_through_summaries_unchanged():
  def loss(x):
    return jnp.sum(summary.summary("sq", x ** 2))

  x = jnp.asarray([1.0, -2.0])
  g = jax.grad(lambda x: summary.with_summary_output_reduced(loss)(x)[0])(x)
  np.testing.assert_allclose(g, 2 * x)


def test_nothing_is_added_to_a_program_without_collection():
  def with_summaries(x):
    y = jnp.tanh(x)
    summary.summary("y", jnp.mean(y))
    return jnp.sum(y)

  def without(x):
    return jnp.sum(jnp.tanh(x))

  x = jnp.ones(3)
  assert "lo_compat_summary" not in str(jax.make_jaxpr(with_summaries)(x))
  # The lowered program is the same text (the unused mean is dropped), up to the function's name.
  lowered = [jax.jit(f).lower(x).as_text().replace(f"jit_{f.__name__}", "F") for f in (with_summaries, without)]
  assert lowered[0] == lowered[1]


def test_add_with_summary_adds_the_keyword_and_a_metrics_output():
  def f(x, scale):
    summary.summary("v", x * scale)
    return x * scale

  g = summary.add_with_summary(f, static_argnums=(1,))
  out, metrics = g(jnp.ones(2), 3.0)
  assert metrics == {} and np.allclose(out, 3.0)
  out, metrics = jax.jit(g, static_argnames=("with_summary",), static_argnums=(1,))(jnp.ones(2), 3.0,
                                                                                   with_summary=True)
  np.testing.assert_allclose(metrics["mean||v"], 3.0)
  assert "with_summary" in str(__import__("inspect").signature(g))


def test_bad_input_is_rejected_with_the_argument_named():
  with pytest.raises(ValueError, match="name must be a str"):
    summary.summary(jnp.ones(2), "x")
  with pytest.raises(ValueError, match="aggregation must be one of"):
    summary.summary("x", 1.0, aggregation="median")
  with pytest.raises(ValueError, match="recorded once"):
    summary.with_summary_output_reduced(lambda x: [summary.summary("n", x, "none") for _ in range(2)][0])(
        jnp.ones(()))


def test_aggregate_metric_list_weights_means_by_size_and_concatenates_collects():
  merged = summary.aggregate_metric_list([{"mean||a": np.ones(2), "collect||c": np.asarray([1.0])},
                                          {"mean||a___1": np.full(6, 3.0), "collect||c": np.asarray([2.0, 3.0])}])
  np.testing.assert_allclose(merged["mean||a"], (2 * 1 + 6 * 3) / 8)
  np.testing.assert_allclose(merged["collect||c"], [1, 2, 3])
  np.testing.assert_allclose(summary.aggregate_metric("none||x", [np.ones((1, 1))]), 1.0)
  with pytest.raises(ValueError, match="aggregation"):
    summary.aggregate_metric("x", [1.0])


def test_writers(tmp_path, capsys):
  memory = summary.InMemorySummaryWriter()
  tb = summary.JaxboardWriter(str(tmp_path / "tb"))
  writer = summary.MultiWriter(memory, summary.PrintWriter(lambda tag: tag.startswith("loss")), tb)
  writer.scalar("loss", 0.5, step=3)
  writer.scalar("other", 1.5, step=3)
  writer.histogram("loss_hist", np.asarray([[1.0, 2.0]]), step=4)
  writer.flush()
  assert [float(v) for v in memory.data["loss"][1]] == [0.5] and int(memory.data["loss"][0][0]) == 3
  assert capsys.readouterr().out.splitlines()[0] == "3] loss=0.5"
  records = [json.loads(line) for line in (tmp_path / "tb" / "summaries.jsonl").read_text().splitlines()]
  assert records[0] == {"kind": "scalar", "name": "loss", "step": 3, "value": 0.5}
  assert records[2]["value"] == [1.0, 2.0]


def test_tree_summaries_name_each_leaf():
  params = {"w": jnp.asarray([1.0, -3.0]), "b": jnp.asarray([2.0])}

  def f(p):
    summary.summarize_inner_params(p)
    summary.tree_step("upd", p)
    return 0.0

  _, metrics = summary.with_summary_output_reduced(f)(params)
  np.testing.assert_allclose(metrics["mean||w/mean_abs"], 2.0)
  np.testing.assert_allclose(metrics["mean||b/mean"], 2.0)
  np.testing.assert_allclose(metrics["mean||upd/1_avg_step_size"], 2.0)  # leaves in key order: b, w


def test_summaries_inside_cond_and_while_loop_count_the_path_that_ran():
  from metafam.compat.learned_optimization import summary as S  # pylint: disable=g-import-not-at-top

  def fn(x, pred):
    def taken(v):
      S.summary("branch", v * 2)
      S.summary("value", v, "tensor")
      return v + 1

    def other(v):
      S.summary("branch", jnp.full_like(v, 100.0))
      return v - 1

    y = jax.lax.cond(pred, taken, other, x)

    def body(c):
      i, v = c
      S.summary("loop", i.astype(jnp.float32))
      return i + 1, v + 1.0

    _, y = jax.lax.while_loop(lambda c: c[0] < 4, body, (jnp.int32(0), y))

    def step(c, z):  # a cond inside a scan: marked on the steps with z > 0 only
      return jax.lax.cond(z > 0, lambda c: S.summary("in_scan", c) + 0.0, lambda c: c, c) + 1.0, z

    c, _ = jax.lax.scan(step, 0.0, jnp.asarray([1.0, -1.0, 1.0]))
    return y + c

  wrapped = S.with_summary_output_reduced(fn)
  for run in (wrapped, jax.jit(wrapped)):
    out, metrics = run(jnp.float32(3.0), True)
    assert float(out) == 3.0 + 1 + 4 + 3
    assert float(metrics["mean||branch"]) == 6.0  # only the branch that ran
    assert float(metrics["tensor||value"]) == 3.0
    assert float(metrics["mean||loop"]) == 1.5  # iterations 0, 1, 2, 3
    assert float(metrics["mean||in_scan"]) == 1.0  # (0 + 2) / 2: steps 0 and 2
  _, metrics = wrapped(jnp.float32(3.0), False)
  assert float(metrics["mean||branch"]) == 100.0 and float(metrics["tensor||value"]) == 0.0
  # Without collection the program is unchanged.
  assert float(fn(jnp.float32(3.0), True)) == 11.0
