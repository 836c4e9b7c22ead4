"""Inner-training throughput: metafam's `TruncatedStep.unroll` against baselines measured in the same run.

    python benchmarks/inner_training.py                      # both optimizers, lanes 1 8 64 256
    python benchmarks/inner_training.py --optimizers adam --lanes 64 --repeats 5

Workload: the image-MLP family at 8x8 (64 -> 32 ReLU -> 10, 2,410 params per task, per-instance sampled init scale),
batch 128 of embedded Fashion-MNIST, truncation length 50, one 50-step unroll per call, inner optimizer the per-
parameter MLP learned optimizer (`MLPLOpt`) or Adam. Printed per lane count, in inner steps per second summed over
lanes:

  * metafam: `TruncatedStep.unroll` (resets, masks, on-device batches, non-finite checks included);
  * minimal: a hand-written ``jit(scan(vmap(step)))`` of the same math (same model, loss and optimizer update, data
    gathered on the device), with nothing else: no resets, no flags;
  * naive: a Python loop over tasks calling a jitted single-task step with a host batch (timed on fewer steps);
  * the reference library's throughput on this machine class (../shared/README.md, measured with its own code).

Ratios: minimal/metafam time (target <= 1.25 at 64+ lanes), metafam/naive throughput (target >= 20x at 256 lanes),
metafam/reference throughput (target >= 1.5x). Memory: the compiled program's argument + output + temporary bytes
(XLA's memory analysis) and the process's peak resident set size. Run it alone: a concurrent job skews timings.
"""

from __future__ import annotations

import argparse
import resource
import time

import jax
import jax.numpy as jnp

from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.optimizers.base import Adam
from metafam.optimizers.learned import HandDesigned
from metafam.optimizers.mlp_lopt import MLPLOpt
from metafam.taskfamilies.image_mlp import ImageMLPFamily

# google/learned_optimization on this machine class, inner steps/s (../shared/README.md, section 3).
REFERENCE = {"mlp_lopt": {1: 2.0e3, 8: 3.4e3, 64: 4.1e3, 256: 2.9e3},
             "adam": {1: 5.7e3, 8: 11.8e3, 64: 15.5e3, 256: 18.5e3}}
UNROLL = 50


def make_optimizer(name):
  if name == "adam":
    return None, Adam(3e-3)
  lopt = MLPLOpt()
  theta = lopt.init(jax.random.key(42))
  return theta, lopt


def compiled_bytes(compiled) -> int:
  m = compiled.memory_analysis()
  if m is None:
    return -1
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)


def timed(fn, repeats):
  """Best-of-``repeats`` wall time of ``fn()`` (which must block)."""
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def bench_metafam(family, opt, theta, lanes, repeats):
  ts = TruncatedStep(family, opt, lanes, ConstantSchedule(UNROLL), meta_loss_split=None)
  theta = {} if theta is None else theta
  state = ts.init_step_state(theta, jax.random.key(0))
  keys = jax.random.split(jax.random.key(1), UNROLL)
  mem = compiled_bytes(ts._unroll.lower(theta, state, keys, ts.data).compile())
  box = {"state": state}

  def run():
    box["state"], out = ts.unroll(theta, box["state"], jax.random.key(2), UNROLL)
    out.loss.block_until_ready()

  run()  # compile + warm up
  return timed(run, repeats), mem


def minimal_program(family, opt, lanes):
  """A hand-written jit(scan(vmap(step))) of the same math: the family's model and loss, the optimizer's update."""
  net = family.net

  def init(theta, key):
    k1, k2 = jax.random.split(key)
    cfg = family.sample(k1)
    params = family.task_fn(cfg).init(k2)
    return opt.opt_fn(theta).init(params, num_steps=UNROLL)

  def loss_fn(params, batch):
    logits = net.apply(params, batch["image"])
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, batch["label"][:, None], axis=-1))

  def run(theta, states, data, key):
    inner = opt.opt_fn(theta)

    def step(states, key):
      def one(state, k):
        loss, grad = jax.value_and_grad(loss_fn)(inner.get_params(state), data.sample(k))
        return inner.update(state, grad, loss=loss), loss

      return jax.vmap(one)(states, jax.random.split(key, lanes))

    return jax.lax.scan(step, states, jax.random.split(key, UNROLL))

  return init, jax.jit(run, donate_argnums=1)


def bench_minimal(family, opt, theta, lanes, repeats):
  init, run = minimal_program(family, opt, lanes)
  states = jax.jit(jax.vmap(init, in_axes=(None, 0)))(theta, jax.random.split(jax.random.key(0), lanes))
  data = family.datasets.device_data("train")
  mem = compiled_bytes(run.lower(theta, states, data, jax.random.key(1)).compile())
  box = {"states": states}

  def go():
    box["states"], losses = run(theta, box["states"], data, jax.random.key(2))
    losses.block_until_ready()

  go()
  return timed(go, repeats), mem


def bench_naive(family, opt, theta, lanes, steps):
  """Per-task Python loop: one jitted single-task step per task per step, batches from the host iterator."""
  inner = opt.opt_fn(theta)
  it = family.datasets.train

  @jax.jit
  def step(theta, cfg, state, batch, key):
    task = family.task_fn(cfg)
    loss, grad = jax.value_and_grad(task.loss)(inner.get_params(state), key, batch)
    return opt.opt_fn(theta).update(state, grad, loss=loss), loss

  keys = jax.random.split(jax.random.key(0), lanes)
  cfgs = [family.sample(k) for k in keys]
  states = [inner.init(family.task_fn(c).init(k), num_steps=UNROLL) for c, k in zip(cfgs, keys)]
  step(theta, cfgs[0], states[0], next(it), keys[0])[1].block_until_ready()  # compile
  start = time.perf_counter()
  for s in range(steps):
    for i in range(lanes):
      states[i], loss = step(theta, cfgs[i], states[i], next(it), keys[i])
  loss.block_until_ready()
  return (time.perf_counter() - start) / steps * UNROLL  # seconds per UNROLL steps, all lanes


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--lanes", type=int, nargs="+", default=[1, 8, 64, 256])
  parser.add_argument("--optimizers", nargs="+", default=["mlp_lopt", "adam"], choices=["mlp_lopt", "adam"])
  parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (best is kept)")
  parser.add_argument("--naive_steps", type=int, default=10, help="steps timed for the naive per-task loop")
  args = parser.parse_args()
  family = ImageMLPFamily((32,), image_size=8, batch_size=128, activations=("relu",), label_noise_range=(0.0, 0.0))
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {family.name}, batch 128, unroll {UNROLL}; "
        f"best of {args.repeats} calls; inner steps/s summed over lanes")
  for name in args.optimizers:
    theta, opt = make_optimizer(name)
    if theta is None:  # a plain Optimizer: wrap it for the minimal and naive programs as well
      opt, theta = HandDesigned(opt), {}
    print(f"\n== inner optimizer: {name}")
    print(f"{'lanes':>5} {'metafam':>9} {'minimal':>9} {'naive':>8} {'reference':>9} | {'mf/min time':>11} "
          f"{'mf/naive':>8} {'mf/ref':>6} | {'mf MB':>6} {'min MB':>6}")
    for lanes in args.lanes:
      t_mf, mem_mf = bench_metafam(family, opt, theta, lanes, args.repeats)
      t_min, mem_min = bench_minimal(family, opt, theta, lanes, args.repeats)
      t_naive = bench_naive(family, opt, theta, lanes, args.naive_steps)
      rate = lambda t: UNROLL * lanes / t
      ref = REFERENCE[name].get(lanes)
      print(f"{lanes:>5} {rate(t_mf):>9,.0f} {rate(t_min):>9,.0f} {rate(t_naive):>8,.0f} "
            f"{(f'{ref:,.0f}' if ref else '-'):>9} | {t_mf / t_min:>11.2f} {t_naive / t_mf:>8.1f} "
            f"{(f'{rate(t_mf) / ref:.2f}' if ref else '-'):>6} | {mem_mf / 2**20:>6.1f} {mem_min / 2**20:>6.1f}",
            flush=True)
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(f"\nprocess peak RSS: {peak:,.0f} MB. 'mf/min time' = metafam time / minimal time (1.00 = no overhead).")


if __name__ == "__main__":
  main()
