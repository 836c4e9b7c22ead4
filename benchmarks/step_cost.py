"""What one optimizer step costs: the pretrained learned optimizers against Adam and Muon on plain-JAX models.

    python benchmarks/step_cost.py                                  # MLPs of 1.9M and 4.1M params and a CNN
    python benchmarks/step_cost.py --mlp_widths 3200 --cnn_channels 128 256 512 --markdown step_cost.md   # 12.8M
    python benchmarks/step_cost.py --mlp_widths 128 --cnn_channels --members 21 --lane_chunk 1 3   # 21 at once

The models are written in plain JAX the way a user would (no metafam `Task`): MLPs ``784 -> W -> W -> 10`` (ReLU) for
each width W of ``--mlp_widths`` (1024: 1.86M parameters, 1664: 4.09M, 3200: 12.8M) and, unless ``--cnn_channels``
is empty, a CNN on 28x28x1 images (three 3x3 convolutions with the given channels, the last two with stride 2, ReLU,
global mean pooling, a dense layer to 10 classes), softmax cross-entropy on a fixed random batch of ``--batch``
images (the cost does not depend on the values). The optimizers, all at learning rate 1e-3: ``optax.adam``,
``optax.contrib.muon`` (Newton-Schulz-orthogonalized momentum for the matrices, Adam for the rest; convolution
kernels get Adam), every shipped pretrained optimizer through `metafam.pretrained.optax_transform`, and the
registered learned optimizers named by ``--learned`` at their initial meta-parameters (e.g. ``muon_residual_lopt``,
which is Muon at init: its ratio to Muon is the cost of its learned residual).
For every (model, optimizer) two jitted programs are timed round-robin, ``--rounds`` calls each after a warm-up
(the median is reported): the update alone (``update(grads, state, params)``) and the whole train step (loss,
gradient, update, ``optax.apply_updates``). Printed per model: milliseconds, the ratios to Adam's and Muon's times
measured in the same run, and the optimizer state's bytes per parameter byte. ``--markdown PATH`` also writes the
table as Markdown; ``--smoke`` runs every code path on tiny models (width 16, channels 4 8 8, batch 8, one round;
with ``--members``, 2 members, blocks of 1 and no CNN). With ``--members M`` each model trains M copies at once
(vmapped, as a learning-rate sweep or a seed study does; times are per call for all M) and ``--lane_chunk K ...``
adds every optimizer again with its update applied to blocks of K members in sequence
(`metafam.inner.step.map_lanes`, what `Runner(lane_chunk=K)` does).
Run it alone: a concurrent job skews timings.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax

import bench_common  # benchmarks/ is on sys.path when this runs as a script
import metafam.pretrained
from metafam.inner.step import map_lanes
from metafam.optimizers.registry import get_learned_optimizer, takes_step_mult


def mlp(widths):
  """``(init(key) -> params, apply(params, images) -> logits)`` of an MLP 784 -> widths -> 10 with ReLU."""
  sizes = [28 * 28, *widths, 10]

  def init(key):
    keys = jax.random.split(key, len(sizes) - 1)
    return [{"w": jax.random.normal(k, (m, n)) / jnp.sqrt(m), "b": jnp.zeros(n)}
            for k, m, n in zip(keys, sizes[:-1], sizes[1:])]

  def apply(params, images):
    x = images.reshape(images.shape[0], -1)
    for layer in params[:-1]:
      x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]
  return init, apply


def cnn(channels):
  """A CNN on 28x28x1: 3x3 convolutions with ``channels`` (strides 1, 2, 2, ...), ReLU, mean pool, dense to 10."""
  def init(key):
    keys = jax.random.split(key, len(channels) + 1)
    ins = [1, *channels[:-1]]
    convs = [{"w": jax.random.normal(k, (3, 3, c_in, c_out)) / jnp.sqrt(9 * c_in), "b": jnp.zeros(c_out)}
             for k, c_in, c_out in zip(keys, ins, channels)]
    dense = {"w": jax.random.normal(keys[-1], (channels[-1], 10)) / jnp.sqrt(channels[-1]), "b": jnp.zeros(10)}
    return {"convs": convs, "dense": dense}

  def apply(params, images):
    x = images
    for i, conv in enumerate(params["convs"]):
      x = jax.lax.conv_general_dilated(x, conv["w"], (1, 1) if i == 0 else (2, 2), "SAME",
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
      x = jax.nn.relu(x + conv["b"])
    return x.mean(axis=(1, 2)) @ params["dense"]["w"] + params["dense"]["b"]
  return init, apply


RUN_LENGTH = 1000  # num_steps for a pretrained optimizer with a learned schedule (generalist_v2)


def optimizers(learning_rate=1e-3, learned=(), muon_ns_steps=()):
  """Name -> optax transformation: Adam, Muon, Muon with each of ``muon_ns_steps`` Newton-Schulz iterations (named
  ``muon, N NS steps``), every shipped pretrained optimizer and the registered learned optimizers ``learned`` at
  their initial meta-parameters (named ``NAME (init)``)."""
  opts = {"adam": optax.adam(learning_rate), "muon": optax.contrib.muon(learning_rate)}
  opts.update({f"muon, {n} NS steps": optax.contrib.muon(learning_rate, ns_steps=n) for n in muon_ns_steps})
  for name in metafam.pretrained.list():  # a step's cost does not depend on the run length a learned schedule reads
    opts[name] = metafam.pretrained.optax_transform(name, learning_rate, num_steps=RUN_LENGTH)
  for name in learned:
    lopt = get_learned_optimizer(name, step_mult=learning_rate)
    opts[f"{name} (init)"] = lopt.as_optax(lopt.init(jax.random.key(0)))
  return opts


def tree_bytes(tree) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "nbytes"))


def setup(model, opt, batch, members=None, chunk=None):
  """Blocking calls of the update alone and of the whole train step, and the state's bytes per parameter byte.
  With ``members``, that many models train at once (vmapped, each from its own init), and their updates run in
  blocks of ``chunk`` members in sequence (`metafam.inner.step.map_lanes`; None: one vmap)."""
  init, apply = model
  images = jax.random.normal(jax.random.key(1), (batch, 28, 28, 1))
  labels = jax.random.randint(jax.random.key(2), (batch,), 0, 10)

  def loss_fn(params):
    logp = jax.nn.log_softmax(apply(params, images))
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))

  if members is None:
    params, value_and_grad, opt_init, opt_update = init(jax.random.key(0)), jax.value_and_grad(loss_fn), opt.init, \
        opt.update
  else:
    params = jax.vmap(init)(jax.random.split(jax.random.key(0), members))
    value_and_grad, opt_init = jax.vmap(jax.value_and_grad(loss_fn)), jax.vmap(opt.init)
    opt_update = lambda g, s, p: map_lanes(opt.update, (0, 0, 0), (g, s, p), chunk)
  state = jax.jit(opt_init)(params)
  grads = jax.jit(value_and_grad)(params)[1]
  update = jax.jit(opt_update)

  @jax.jit
  def train_step(params, state):
    loss, grads = value_and_grad(params)
    updates, state = opt_update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  box = {"params": params, "state": state}

  def run_update():
    jax.block_until_ready(update(grads, state, params))

  def run_step():
    box["params"], box["state"], loss = train_step(box["params"], box["state"])
    jax.block_until_ready(loss)
  return run_update, run_step, tree_bytes(state) / tree_bytes(params), tree_bytes(params) // 4 // (members or 1)



def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--mlp_widths", type=int, nargs="*", default=[1024, 1664],
                      help="one MLP 784 -> W -> W -> 10 per width W")
  parser.add_argument("--cnn_channels", type=int, nargs="*", default=[64, 128, 256],
                      help="the CNN's convolution channels (none: no CNN)")
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--rounds", type=int, default=5, help="timed calls per program (the median is reported)")
  parser.add_argument("--members", type=int, default=None,
                      help="train this many models of each kind at once (vmapped, as a sweep or a seed study does)")
  parser.add_argument("--lane_chunk", type=int, nargs="*", default=[],
                      help="with --members: also time every optimizer with its update in blocks of this many "
                           "members in sequence (ratios stay against one-vmap Adam and Muon)")
  parser.add_argument("--learned", nargs="*", default=[],
                      help="registered learned optimizers (with a step_mult) to add at their initial theta, e.g. "
                           "muon_residual_lopt")
  parser.add_argument("--muon_ns_steps", type=int, nargs="*", default=[],
                      help="also optax's Muon with this many Newton-Schulz iterations (its default is 5)")
  bench_common.add_flags(parser)
  args = parser.parse_args()
  if any(n < 1 for n in args.muon_ns_steps):
    parser.error(f"--muon_ns_steps must be positive integers, got {args.muon_ns_steps}")
  bad = [n for n in args.learned if not takes_step_mult(n)]
  if bad:
    parser.error(f"--learned: {', '.join(bad)} is not a registered learned optimizer with a step_mult")
  if args.smoke:
    args.mlp_widths, args.cnn_channels, args.batch, args.rounds = [16], [4, 8, 8], 8, 1
  if args.smoke and args.members:
    args.members, args.lane_chunk, args.cnn_channels = 2, [1], []
  if (any(w < 1 for w in args.mlp_widths + args.cnn_channels + args.lane_chunk) or args.batch < 1
      or args.rounds < 1 or (args.members is not None and args.members < 1)):
    parser.error("--mlp_widths, --cnn_channels, --batch, --rounds, --members and --lane_chunk must be positive")
  if args.lane_chunk and args.members is None:
    parser.error("--lane_chunk needs --members")
  models = {f"MLP 784-{w}-{w}-10": mlp([w, w]) for w in args.mlp_widths}
  if args.cnn_channels:
    models[f"CNN {'-'.join(map(str, args.cnn_channels))}"] = cnn(args.cnn_channels)
  if args.members:
    models = {f"{name}, {args.members} at once": model for name, model in models.items()}
  opts = {(name, None): opt for name, opt in optimizers(learned=args.learned,
                                                             muon_ns_steps=args.muon_ns_steps).items()}
  opts.update({(name, k): opt for k in args.lane_chunk for (name, _), opt in list(opts.items())})
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; batch {args.batch}; median of {args.rounds} "
        f"interleaved calls; optimizers {', '.join(dict.fromkeys(n for n, _ in opts))}")
  runs, info = {}, {}
  for model_name, model in models.items():
    for (opt_name, chunk), opt in opts.items():
      opt_name = opt_name if chunk is None else f"{opt_name}, blocks of {chunk}"
      run_update, run_step, state_ratio, num_params = setup(model, opt, args.batch, args.members, chunk)
      runs[model_name, opt_name, "update"], runs[model_name, opt_name, "step"] = run_update, run_step
      info[model_name, opt_name] = state_ratio, num_params
  times = bench_common.round_robin(runs, args.rounds)
  columns = ["model", "params", "optimizer", "update ms", "step ms", "update / Adam", "update / Muon",
             "step / Adam", "step / Muon", "state bytes / param bytes"]
  print("\n" + " | ".join(columns))
  rows = []
  for model_name in models:
    for opt_name in [name if k is None else f"{name}, blocks of {k}" for name, k in opts]:
      t = {kind: times[model_name, opt_name, kind] for kind in ("update", "step")}
      ref = {(o, kind): times[model_name, o, kind] for o in ("adam", "muon") for kind in ("update", "step")}
      state_ratio, num_params = info[model_name, opt_name]
      row = [model_name, num_params, opt_name, 1e3 * t["update"], 1e3 * t["step"],
             f"{t['update'] / ref['adam', 'update']:.2f}x", f"{t['update'] / ref['muon', 'update']:.2f}x",
             f"{t['step'] / ref['adam', 'step']:.2f}x", f"{t['step'] / ref['muon', 'step']:.2f}x",
             f"{state_ratio:.2f}"]
      rows.append(row)
      print(" | ".join(f"{v:,.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else v
                       for v in row), flush=True)
  bench_common.write_markdown(args.markdown, [bench_common.markdown_table(
      "Step cost: pretrained learned optimizers against Adam and Muon", columns, rows,
      [f"`python benchmarks/step_cost.py{' --smoke' if args.smoke else ''}`: batch {args.batch}, median of "
       f"{args.rounds} interleaved calls; ratios measured in the same run; state bytes per parameter byte "
       f"(float32 params)."])])


if __name__ == "__main__":
  main()
