"""A conv net's training step inside a training loop: XLA's convolution against `metafam.tasks.conv.conv2d_same`.

    python benchmarks/conv_in_loop.py [--lanes 1 21] [--steps 50] [--markdown PATH]

Trains the test suite's conv net (28x28x1 input, four 3x3 stride-2 convolutions of 16, 32, 64 and 128 channels, ReLU,
global average pool, a linear layer to 10 classes; batch 32) by SGD for ``--steps`` steps inside one ``lax.scan``,
once with every convolution a ``lax.conv_general_dilated`` (what ``hk.Conv2D`` computes) and once with
`conv2d_same` (the slices of the padded input times the reshaped kernel, what the built-in conv tasks compute), and
vmapped over ``--lanes`` models at once (a rate grid). It prints milliseconds per training step and the ratio, timed
round-robin in one run, and checks that both give the same loss curve up to float rounding. Also the step alone
(jitted, outside any loop), where XLA's convolution is fast: the gap is the loop's.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from bench_common import add_flags, markdown_table, round_robin, write_markdown
from metafam.tasks.conv import conv2d_same

CHANNELS = (1, 16, 32, 64, 128)


def xla_conv(x, w, stride):
  return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def make_loss(conv):
  def loss(params, batch):
    x = batch["image"]
    for w, b in params["convs"]:
      x = jax.nn.relu(conv(x, w, 2) + b)
    logits = jnp.mean(x, axis=(1, 2)) @ params["out"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), batch["label"][:, None], axis=1))
  return loss


def init(key, channels):
  keys = jax.random.split(key, len(channels))
  convs = [(jax.random.normal(k, (3, 3, a, b)) / np.sqrt(9 * a), jnp.zeros(b))
           for k, a, b in zip(keys, channels[:-1], channels[1:])]
  return {"convs": convs, "out": jax.random.normal(keys[-1], (channels[-1], 10)) / np.sqrt(channels[-1])}


def training_loop(loss):
  def run(params, batches):
    def step(params, batch):
      value, grads = jax.value_and_grad(loss)(params, batch)
      return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), value
    return jax.lax.scan(step, params, batches)
  return run


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lanes", type=int, nargs="+", default=[1, 21], help="models trained at once (vmapped)")
  parser.add_argument("--steps", type=int, default=50, help="training steps per timed loop")
  parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds (the median is reported)")
  add_flags(parser)
  args = parser.parse_args()
  if min(args.lanes) < 1 or args.steps < 1 or args.rounds < 1:
    parser.error("--lanes, --steps and --rounds must be positive")
  channels, batch, size = ((1, 4, 8), 4, 8) if args.smoke else (CHANNELS, 32, 28)
  steps, rounds = (3, 1) if args.smoke else (args.steps, args.rounds)
  key = jax.random.key(0)
  batches = {"image": jax.random.normal(key, (steps, batch, size, size, 1)),
             "label": jax.random.randint(jax.random.fold_in(key, 1), (steps, batch), 0, 10)}
  rows = []
  for lanes in args.lanes:
    params = jax.vmap(lambda k: init(k, channels))(jax.random.split(key, lanes))
    runs, curves = {}, {}
    for name, conv in (("lax.conv_general_dilated", xla_conv), ("conv2d_same", conv2d_same)):
      loop = jax.jit(jax.vmap(training_loop(make_loss(conv)), in_axes=(0, None)))
      curves[name] = np.asarray(loop(params, batches)[1])
      runs[f"{name}, loop"] = lambda loop=loop: jax.block_until_ready(loop(params, batches))
      step = jax.jit(jax.vmap(jax.grad(make_loss(conv)), in_axes=(0, None)))
      one = jax.tree.map(lambda b: b[0], batches)
      runs[f"{name}, step alone"] = lambda step=step: jax.block_until_ready(step(params, one))
    np.testing.assert_allclose(curves["conv2d_same"], curves["lax.conv_general_dilated"], rtol=1e-3)
    seconds = round_robin(runs, rounds)
    loop_ms = {n: seconds[f"{n}, loop"] / steps * 1e3 for n in curves}
    alone_ms = {n: seconds[f"{n}, step alone"] * 1e3 for n in curves}
    rows.append((lanes, loop_ms["lax.conv_general_dilated"], loop_ms["conv2d_same"],
                 f"{loop_ms['lax.conv_general_dilated'] / loop_ms['conv2d_same']:.2f}x",
                 alone_ms["lax.conv_general_dilated"], alone_ms["conv2d_same"]))
  columns = ["models at once", "XLA conv, ms/step in loop", "conv2d_same, ms/step in loop", "speedup in loop",
             "XLA conv, step alone (ms)", "conv2d_same, step alone (ms)"]
  table = markdown_table("A conv net's training step in a loop", columns, rows,
                         notes=["Loss curves of the two agree to 1e-3 (float rounding only)."])
  print(table)
  write_markdown(args.markdown, [table])


if __name__ == "__main__":
  main()
