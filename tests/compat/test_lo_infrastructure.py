"""LO's infrastructure modules under the compat prefix: circular_buffer, jax_utils, filesystem, notebook_utils,
profile, py_utils, tree_utils (LO's parameter names), training.save_state / load_state."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metafam.compat.learned_optimization import circular_buffer, filesystem, jax_utils, notebook_utils, profile
from metafam.compat.learned_optimization import py_utils, training, tree_utils


def test_circular_buffer_keeps_the_last_size_values_in_age_order():
  buf = circular_buffer.CircularBuffer({"a": jax.ShapeDtypeStruct((2,), jnp.float32)}, 3)
  state = buf.init()
  values, position = buf.stack_with_idx(state)
  assert values["a"].shape == (3, 2) and list(position) == [-1, -1, -1]
  for i in range(5):  # adds 0..4: slots hold 3, 4, 2
    state = buf.add(state, {"a": jnp.full((2,), float(i))})
  values, mask = buf.stack_reorder(state)
  np.testing.assert_allclose(values["a"][:, 0], [2.0, 3.0, 4.0])  # oldest first
  np.testing.assert_array_equal(mask, [1, 1, 1])
  _, position = buf.stack_with_idx(state)
  np.testing.assert_array_equal(position, [1, 2, 0])  # slot 0 holds 3 (middle), slot 2 holds 2 (oldest)
  np.testing.assert_allclose(buf.gather_from_present(state, jnp.asarray([-1, -3]))["a"][:, 0], [4.0, 2.0])
  state = buf.add(buf.init(), {"a": jnp.ones(2)})
  _, mask = buf.stack_reorder(state)
  assert int(jnp.sum(mask)) == 1
  with pytest.raises(ValueError, match="size"):
    circular_buffer.CircularBuffer({}, 0)


def test_jax_utils_scan_is_lax_scan_in_and_out_of_jit():
  def f(c, x):
    return c + x, c * x

  xs = jnp.arange(5.0)
  eager = jax_utils.scan(f, 1.0, xs)
  jitted = jax.jit(lambda xs: jax_utils.scan(f, 1.0, xs))(xs)
  reference = jax.lax.scan(f, 1.0, xs)
  for got in (eager, jitted):
    np.testing.assert_allclose(got[0], reference[0])
    np.testing.assert_allclose(got[1], reference[1])
  rev = jax_utils.scan(f, 1.0, xs, reverse=True)
  np.testing.assert_allclose(rev[1], jax.lax.scan(f, 1.0, xs, reverse=True)[1])
  assert not jax_utils.in_jit() and bool(jax.jit(lambda: jnp.asarray(jax_utils.in_jit()))())


def test_jax_utils_conditionals():
  assert jax_utils.maybe_static_cond(True, lambda v: v + 1, lambda v: v - 1, 1) == 2  # decided in Python
  assert int(jax.jit(lambda p: jax_utils.maybe_static_cond(p, lambda v: v + 1, lambda v: v - 1, 1))(False)) == 0
  assert int(jax.jit(lambda p: jax_utils.maybe_do(p, lambda v: v * 3, 2))(True)) == 6
  assert int(jax.jit(lambda p: jax_utils.maybe_do(p, lambda v: v * 3, 2))(False)) == 2


def test_filesystem_local_operations_and_remote_paths(tmp_path):
  d = tmp_path / "a" / "b"
  filesystem.make_dirs(str(d))
  filesystem.make_dirs(str(d))  # exists: fine
  with filesystem.file_open(str(d / "f.txt"), "w") as f:
    f.write("x")
  filesystem.copy(str(d / "f.txt"), str(d / "g.txt"))
  filesystem.rename(str(d / "g.txt"), str(d / "h.txt"))
  assert sorted(p.rsplit("/", 1)[1] for p in filesystem.glob(str(d / "*.txt"))) == ["f.txt", "h.txt"]
  filesystem.remove(str(tmp_path / "a"))
  assert not filesystem.exists(str(tmp_path / "a"))
  with pytest.raises(NotImplementedError, match="tensorflow"):
    filesystem.exists("gs://bucket/x")


def test_notebook_utils_ema_and_colors():
  data = np.asarray([1.0, 3.0, np.nan, 5.0])
  np.testing.assert_allclose(notebook_utils.ema(data, 0.5, ignore_nan=True), [1.0, 2.0, 2.0, 3.5])
  # LO's contract: the whole palette for num <= 10 / <= 20, each color repeated rep times.
  assert notebook_utils.colors_for_num(2, rep=2)[:4] == ["#1f77b4"] * 2 + ["#ff7f0e"] * 2
  assert len(notebook_utils.colors_for_num(2, rep=2)) == 20
  assert len(notebook_utils.colors_for_num(15)) == 20 and len(notebook_utils.colors_for_num(25)) == 25
  colors, labels = notebook_utils.similar_colors(["x/run_rep1", "x/run_rep2", "x/other"])
  assert colors[0] == colors[1] != colors[2] and [l for l, _ in labels] == ["x/other", "x/run"]
  assert notebook_utils.threaded_map(2, lambda v: v * v, [1, 2, 3]) == [1, 4, 9]


def test_py_utils_threaded_map_keeps_order_and_checks_threads():
  assert py_utils.threaded_tqdm_map(2, lambda v: -v, range(6)) == [0, -1, -2, -3, -4, -5]
  with pytest.raises(ValueError, match="threads"):
    py_utils.threaded_tqdm_map(0, abs, [1])


def test_profile_logs_at_debug_level(caplog):
  @profile.wrap()
  def work():
    return 7

  with caplog.at_level(logging.DEBUG, logger=profile.__name__):
    assert work() == 7
  assert any("work took" in r.message for r in caplog.records)


def test_tree_utils_take_lo_keyword_names():
  a, b = {"x": jnp.asarray([1.0, 2.0])}, {"x": jnp.asarray([3.0, 4.0])}
  np.testing.assert_allclose(tree_utils.tree_add(treea=a, treeb=b)["x"], [4.0, 6.0])
  np.testing.assert_allclose(tree_utils.tree_sub(treea=b, scalar_or_treeb=1.0)["x"], [2.0, 3.0])
  np.testing.assert_allclose(tree_utils.tree_dot(treea=a, treeb=b), 11.0)
  np.testing.assert_allclose(tree_utils.tree_norm(val=b), 5.0)
  assert tree_utils.first_dim(a=tree_utils.tree_zip_jnp(xs=[a, b, a])) == 3


def test_training_save_and_load_state_round_trip(tmp_path):
  state = {"w": jnp.arange(3.0), "step": jnp.asarray(4, jnp.int32)}
  path = str(tmp_path / "sub" / "state.npz")
  training.save_state(path, state)
  loaded = training.load_state(path, jax.tree.map(jnp.zeros_like, state))
  np.testing.assert_allclose(loaded["w"], state["w"])
  assert int(loaded["step"]) == 4


def test_timings_helpers():
  from metafam.compat.learned_optimization.time_filter import timings  # pylint: disable=g-import-not-at-top
  calls = []
  mean, stderr = timings.time_jax_fn(lambda: calls.append(1) or jnp.zeros(()), time_measurements=3)
  assert len(calls) == 4 and mean >= 0 and stderr >= 0  # one untimed warm-up call
  mean, _ = timings.timing_for_iterator(iter(range(10 ** 6)), secs=0.01)
  assert 0 <= mean < 1e-3
  with pytest.raises(ValueError, match="num_tasks"):
    timings.time_for_task_family_vmap_unroll_func(None, 0, 5)


@pytest.mark.slow
def test_timings_time_the_vectorized_unroll_on_metafams_engine():
  from metafam.compat.learned_optimization.optimizers import optax_opts  # pylint: disable=g-import-not-at-top
  from metafam.compat.learned_optimization.tasks import quadratics  # pylint: disable=g-import-not-at-top
  from metafam.compat.learned_optimization.time_filter import timings  # pylint: disable=g-import-not-at-top
  family = quadratics.FixedDimQuadraticFamily(4)
  frozen = [timings.time_for_task_family_vmap_unroll_func(family, 2, n, opt=optax_opts.SGD(0.0))() for n in (1, 3)]
  np.testing.assert_allclose(frozen[0], frozen[1], rtol=1e-6)  # learning rate 0: the loss never changes
  moving = timings.time_for_task_family_vmap_unroll_func(family, 2, 3, opt=optax_opts.SGD(0.1))()
  assert float(moving) < float(frozen[0])  # same start (key 0); SGD lowers a quadratic's loss
  per_step, _ = timings.time_for_task_family_vmap_unroll(family, 2, 3, num_time_estimates=1)
  assert 0 < per_step < 1.0
