"""Updating lanes in blocks (`TruncatedStep(lane_chunk=...)`, `Runner(lane_chunk=...)`) computes what one vmap over
all lanes computes."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.inner.runner import Runner
from metafam.inner.step import auto_lane_chunk
from metafam.optimizers import Adam, LearnableSGD, MLPLOpt, newton_schulz
from metafam.optimizers.muon_lopt import MuonResidualLOpt
from metafam.tasks.registry import get_task
from metafam.taskfamilies import QuadraticFamily

FAMILY = QuadraticFamily(6, scale_range=(0.5, 2.0))


def _run(lopt, theta, lane_chunk, lanes=12):
  step = TruncatedStep(FAMILY, lopt, lanes, ConstantSchedule(5), random_initial_iteration=True,
                       meta_loss_split="outer_valid", donate=False, lane_chunk=lane_chunk)
  state = step.init_step_state(theta, jax.random.key(1))
  keys = jax.random.split(jax.random.key(2), 8)  # crosses resets (trajectories of 5)

  def meta_loss(theta):
    lanes_out, out = step.unroll_fn(theta, state, keys)
    return jnp.mean(out.meta_loss), (lanes_out, out)

  (value, aux), grad = jax.jit(jax.value_and_grad(meta_loss, has_aux=True))(theta)
  return value, grad, aux


@pytest.mark.parametrize("lane_chunk", [pytest.param(4, marks=pytest.mark.slow), 5])  # 5: the last block is partial
def test_blocks_equal_one_vmap_up_to_rounding(lane_chunk):
  lopt = MLPLOpt()
  theta = lopt.init(jax.random.key(0))
  whole, blocks = _run(lopt, theta, None), _run(lopt, theta, lane_chunk)
  # Values and the meta-gradient through the unroll (reverse mode through the blocks' scan): float32 rounding of
  # differently batched products only (measured max abs difference 2.4e-7 on the image-MLP family).
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(blocks)):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f":
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    else:
      np.testing.assert_array_equal(a, b)


def test_auto_blocks_lanes_only_on_a_cpu():
  """Blocks keep a block's working set in a CPU's cache; on an accelerator they would only run one after another."""
  assert auto_lane_chunk(16, "cpu") == 16 and auto_lane_chunk(None, "cpu") is None
  assert auto_lane_chunk(16, "gpu") is None and auto_lane_chunk(16, "tpu") is None
  assert TruncatedStep(FAMILY, MLPLOpt(), 4, devices=jax.devices("cpu")[:1]).lane_chunk == 16
  assert TruncatedStep(FAMILY, MLPLOpt(), 4).lane_chunk == auto_lane_chunk(16, jax.default_backend())


def test_auto_takes_the_learned_optimizers_block_size():
  assert (TruncatedStep(FAMILY, MLPLOpt(), 4, devices=jax.devices("cpu")[:1]).lane_chunk == MLPLOpt.lane_chunk
          == 16)
  assert TruncatedStep(FAMILY, Adam(1e-3), 4).lane_chunk is None
  assert TruncatedStep(FAMILY, LearnableSGD(), 4).lane_chunk is None
  assert TruncatedStep(FAMILY, MLPLOpt(), 4, lane_chunk=None).lane_chunk is None
  # Newton-Schulz optimizers: one lane at a time on a CPU (batched matrix products are slow there), else one vmap
  assert MuonResidualLOpt().lane_chunk == newton_schulz.lane_chunk() == (1 if jax.default_backend() == "cpu" else None)
  for bad in (0, -1, 2.5, True, "big"):
    with pytest.raises((ValueError, TypeError), match="lane_chunk"):
      TruncatedStep(FAMILY, MLPLOpt(), 4, lane_chunk=bad)


def test_runner_blocks_equal_one_vmap_and_check_the_argument():
  """Muon on 3 members of a small image MLP, updates in blocks of 2 (the last one partial) or one vmap: the same
  training losses and evaluations up to float32 rounding of differently batched products (Newton-Schulz amplifies
  it: measured max relative difference 1.1e-7 over 12 steps; bound 1e-4)."""
  task = get_task("fmnist_mlp_8x8_32")
  out = []
  for chunk in (None, 2):
    runner = Runner(task, optax.contrib.muon(0.02), num_members=3, lane_chunk=chunk, splits=("inner_valid",))
    keys = runner.keys(jax.random.key(0))
    cfg, state = runner.init(keys, 12)
    state, losses = runner.train(state, cfg, keys, 0, 12)
    out.append((np.asarray(losses), np.asarray(runner.evaluate(state, cfg, keys, 12)["inner_valid"])))
  for a, b in zip(*out):
    np.testing.assert_allclose(a, b, rtol=1e-4)
  assert np.all(out[0][0][-1] < out[0][0][0])  # it trained
  for bad in (0, 1.5, "big"):
    with pytest.raises((ValueError, TypeError), match="lane_chunk"):
      Runner(task, optax.adam(1e-3), num_members=3, lane_chunk=bad)
