"""Inner-training throughput: metafam's `TruncatedStep.unroll` against baselines measured in the same run.

    python benchmarks/inner_training.py                      # both optimizers, lanes 1 8 64 256, 2 devices
    python benchmarks/inner_training.py --optimizers adam --lanes 64 --rounds 9 --devices 1
    python benchmarks/inner_training.py --reference_src /tmp/lo/learned_optimization-0.0.1   # + the reference library
    python benchmarks/inner_training.py --lanes 256 1024 4096 --devices 1 --skip naive ref_style   # on a GPU

Workload: the image-MLP family at 8x8 (64 -> 32 ReLU -> 10, 2,410 params per task, per-instance sampled init scale),
batch 128 of embedded Fashion-MNIST, truncation length 50, one 50-step unroll per call, inner optimizer the per-
parameter MLP learned optimizer (`MLPLOpt`), Adam, or (``--optimizers adafac_mlp_lopt adafac_muon_mlp_lopt``)
`AdafacMLPLOpt` without and with its orthogonalized-momentum feature, which the reference library's 0.0.1 release
lacks (no LO columns). Printed per lane count, in inner steps per second summed
over lanes:

  * metafam: `TruncatedStep.unroll` on one device (resets, masks, on-device batches, non-finite checks included);
  * minimal: a hand-written ``jit(scan(vmap(step)))`` of the same math (same model, loss and optimizer update, data
    gathered on the device), with nothing else: no resets, no flags; one device;
  * metafam xN: `TruncatedStep(devices=N)`: the lanes split over N devices (on CPU, N cores: the script asks JAX
    for ``--devices`` CPU devices), each device running its share of the lanes as its own program;
  * ref-style: our re-implementation of the reference library's design, measured in this run: one jitted scan over
    ``vmap(lax.cond(is_done, reset, train))`` (a batched cond runs both branches) with batches assembled on the host,
    one ``next()`` per lane per step, copied to the device per unroll;
  * naive: a Python loop over tasks calling a jitted single-task step with a host batch (timed on fewer steps);
  * LO / LO dev (only with ``--reference_src DIR``): the reference library itself, google/learned_optimization
    0.0.1, run from its unpacked source in this process (see `reference_lo.py` for the setup): its
    `truncated_unroll` with its own MLPLOpt or Adam on the same model and data, with batches assembled on the host per
    call as LO does ("LO"), and with one fixed batch stack already on the device ("LO dev", its jitted engine alone);
  * published: the reference library's own figures on this machine class (../shared/README.md), for runs without LO.

The timed programs run round-robin, ``--rounds`` calls each, and the median call is reported (the machine's speed
drifts by tens of percent over minutes; interleaving keeps the ratios fair). Ratios: metafam/minimal time on one
device (target <= 1.25 at 64+ lanes); the best metafam configuration against naive (target >= 20x at 256 lanes),
against ref-style, and against the reference library (target >= 1.5x): measured in this run with ``--reference_src``,
otherwise its published figures. FLOP rate: XLA's cost analysis of one lane's inner step (the task's loss and
gradient plus the optimizer's update) times the best inner steps/s, against the fp32 matmul peak measured at the
start of the run (a 2048 x 2048 product on one device, all cores; target >= 50% at 8+ lanes). Memory: the compiled program's argument + output + temporary bytes (XLA's memory
analysis) and the process's peak resident set size.
``--other_reset`` adds a column timing `TruncatedStep` with the reset strategy its platform does not default to
("mf cond" on an accelerator, where the default "select" avoids a per-step host round trip; "mf select" on a CPU).
``--skip naive ref_style`` leaves out the slow host-driven baselines (at thousands of lanes they take minutes).
``--markdown PATH`` also writes the table as Markdown; ``--smoke`` runs every code path on a tiny workload (4 hidden
units, batches of 8, 2 lanes, one round).
Run it alone: a concurrent job skews timings.
"""

from __future__ import annotations

import argparse
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

import bench_common  # benchmarks/ is on sys.path when this runs as a script
from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.optimizers.base import Adam
from metafam.optimizers.learned import HandDesigned
from metafam.optimizers.registry import get_learned_optimizer

# google/learned_optimization on this machine class, inner steps/s (../shared/README.md, section 3).
REFERENCE = {"mlp_lopt": {1: 2.0e3, 8: 3.4e3, 64: 4.1e3, 256: 2.9e3},
             "adam": {1: 5.7e3, 8: 11.8e3, 64: 15.5e3, 256: 18.5e3}}
UNROLL = 50


def make_optimizer(name):
  if name == "adam":
    return None, Adam(3e-3)
  lopt = get_learned_optimizer(name)
  theta = lopt.init(jax.random.key(42))
  return theta, lopt


def compiled_bytes(compiled) -> int:
  m = compiled.memory_analysis()
  if m is None:
    return -1
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)


def setup_metafam(family, opt, theta, lanes, devices, reset="auto"):
  """A blocking call running one 50-step unroll, and the compiled program's bytes."""
  ts = TruncatedStep(family, opt, lanes, ConstantSchedule(UNROLL), meta_loss_split=None, devices=devices,
                     reset=reset)
  theta = ts.place_theta({} if theta is None else theta)
  box = {"state": ts.init_step_state(theta, jax.random.key(0))}
  keys = jax.random.split(jax.random.key(1), UNROLL)
  # The static argument as `unroll` passes it, so that this compilation is the one the calls reuse.
  mem = compiled_bytes(ts._unroll.lower(ts, theta, box["state"], keys, theta_is_batched=False).compile())

  def run():
    box["state"], out = ts.unroll(theta, box["state"], jax.random.key(2), UNROLL)
    out.loss.block_until_ready()
  return run, mem


def loss_fn(net, params, batch):
  logits = net.apply(params, batch["image"])
  logp = jax.nn.log_softmax(logits)
  return -jnp.mean(jnp.take_along_axis(logp, batch["label"][:, None], axis=-1))


def fresh_state(family, opt, theta, key):
  k1, k2 = jax.random.split(key)
  params = family.task_fn(family.sample(k1)).init(k2)
  return opt.opt_fn(theta).init(params, num_steps=UNROLL)


def lane_step_flops(family, opt, theta) -> float:
  """Floating-point operations of one inner step of one lane (batch gather, the task's loss and gradient, the
  optimizer's update), from XLA's cost analysis of that step compiled alone (no loop: XLA counts a loop body once)."""
  data = family.datasets.device_data("train")

  def one(theta, state, data, k):
    inner = opt.opt_fn(theta)
    loss, grad = jax.value_and_grad(loss_fn, argnums=1)(family.net, inner.get_params(state), data.sample(k))
    return inner.update(state, grad, loss=loss)

  state = jax.jit(lambda th, k: fresh_state(family, opt, th, k))(theta, jax.random.key(0))
  cost = jax.jit(one).lower(theta, state, data, jax.random.key(1)).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get("flops", float("nan")))


def matmul_peak(size: int = 2048, calls: int = 7) -> float:
  """The machine's fp32 matrix-multiply rate in FLOP/s: the best of ``calls`` ``[size, size] @ [size, size]``
  products (all cores of one device), measured now, in this run."""
  a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
  mm = jax.jit(lambda a: a @ a)
  mm(a).block_until_ready()
  best = float("inf")
  for _ in range(calls):
    start = time.perf_counter()
    mm(a).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 / best


def minimal_run_fn(family, opt, lanes, num_steps=UNROLL):
  """The minimal program, ``run_fn(theta, states, data, key) -> (states, losses)``: a hand-written
  jit(scan(vmap(step))) of the same math (the family's model and loss, the optimizer's update), nothing else."""
  def run_fn(theta, states, data, key):
    inner = opt.opt_fn(theta)

    def step(states, key):
      def one(state, k):
        loss, grad = jax.value_and_grad(loss_fn, argnums=1)(family.net, inner.get_params(state), data.sample(k))
        return inner.update(state, grad, loss=loss), loss

      return jax.vmap(one)(states, jax.random.split(key, lanes))

    return jax.lax.scan(step, states, jax.random.split(key, num_steps))
  return run_fn


def setup_minimal(family, opt, theta, lanes):
  """`minimal_run_fn` jitted (states donated), ready to time."""
  data = family.datasets.device_data("train")
  run_jit = jax.jit(minimal_run_fn(family, opt, lanes), donate_argnums=1)
  init = jax.jit(jax.vmap(lambda th, k: fresh_state(family, opt, th, k), in_axes=(None, 0)))
  box = {"states": init(theta, jax.random.split(jax.random.key(0), lanes))}
  mem = compiled_bytes(run_jit.lower(theta, box["states"], data, jax.random.key(1)).compile())

  def run():
    box["states"], losses = run_jit(theta, box["states"], data, jax.random.key(2))
    losses.block_until_ready()
  return run, mem


def setup_ref_style(family, opt, theta, lanes):
  """The reference library's design, re-implemented: vmap of a per-lane cond(is_done, reset, train), host data."""
  it = family.datasets.train

  def lane_step(theta, carry, key, batch):
    state, cfg, t = carry
    k_reset, k_loss = jax.random.split(key)

    def train(_):
      inner = opt.opt_fn(theta)
      task = family.task_fn(cfg)
      loss, grad = jax.value_and_grad(task.loss)(inner.get_params(state), k_loss, batch)
      return (inner.update(state, grad, loss=loss), cfg, t + 1), loss

    def reset(_):
      k1, k2 = jax.random.split(k_reset)
      new_cfg = family.sample(k1)
      new_state = opt.opt_fn(theta).init(family.task_fn(new_cfg).init(k2), num_steps=UNROLL)
      return (new_state, new_cfg, jnp.zeros_like(t)), jnp.zeros(())

    return jax.lax.cond(t >= UNROLL, reset, train, None)

  def run_fn(theta, carry, key, batches):
    def step(carry, xs):
      key, batch = xs
      return jax.vmap(lane_step, in_axes=(None, 0, 0, 0))(theta, carry, jax.random.split(key, lanes), batch)

    return jax.lax.scan(step, carry, (jax.random.split(key, UNROLL), batches))

  run_jit = jax.jit(run_fn, donate_argnums=1)
  keys = jax.random.split(jax.random.key(0), lanes)
  cfgs = jax.vmap(family.sample)(keys)
  states = jax.vmap(lambda k: fresh_state(family, opt, theta, k))(keys)
  box = {"carry": (states, cfgs, jnp.zeros((lanes,), jnp.int32))}

  def host_batches():  # [UNROLL, lanes, ...]: one next() per lane per step, stacked and copied once per unroll
    steps = [jax.tree.map(lambda *xs: np.stack(xs), *[next(it) for _ in range(lanes)]) for _ in range(UNROLL)]
    return jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *steps))

  mem = compiled_bytes(run_jit.lower(theta, box["carry"], jax.random.key(1), host_batches()).compile())

  def run():
    box["carry"], losses = run_jit(theta, box["carry"], jax.random.key(2), host_batches())
    losses.block_until_ready()
  return run, mem


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
  parser.add_argument("--optimizers", nargs="+", default=["mlp_lopt", "adam"],
                      choices=["mlp_lopt", "adam", "adafac_mlp_lopt", "adafac_muon_mlp_lopt"])
  parser.add_argument("--other_reset", action="store_true",
                      help="also time metafam with the reset strategy its platform does not default to (a column "
                           "'mf select' on a CPU, 'mf cond' on an accelerator; TruncatedStep's reset argument)")
  parser.add_argument("--rounds", type=int, default=7, help="timed calls per program (the median is reported)")
  parser.add_argument("--naive_steps", type=int, default=10, help="steps timed for the naive per-task loop")
  parser.add_argument("--devices", type=int, default=2,
                      help="devices for the sharded metafam run (CPU: cores; JAX is asked for this many CPU devices)")
  parser.add_argument("--reference_src", metavar="DIR",
                      help="unpacked learned_optimization source: time the reference library in this run")
  parser.add_argument("--skip", nargs="+", default=[], choices=["ref_style", "naive"],
                      help="baselines to leave out (the host-driven ones are slow at thousands of lanes)")
  bench_common.add_flags(parser)
  args = parser.parse_args()
  if args.smoke:
    args.lanes, args.rounds, args.naive_steps = [2], 1, 1
  if args.devices > 1:
    jax.config.update("jax_num_cpu_devices", args.devices)  # before JAX starts its CPU backend
  lo = None
  if args.reference_src:
    import reference_lo  # benchmarks/ is on sys.path when this runs as a script
    lo = reference_lo.load(args.reference_src)
  devices = min(args.devices, len(jax.devices()))
  family = bench_common.image_mlp_family(args.smoke)
  batch = family.datasets.abstract_batch["image"].shape[0]
  print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} device(s); {family.name}, batch "
        f"{batch}, unroll {UNROLL}; median of {args.rounds} interleaved calls; inner steps/s summed over lanes")
  size, calls = (64, 1) if args.smoke else (2048, 7)
  peak = matmul_peak(size, calls)
  print(f"measured fp32 matmul peak ({size} x {size} product, best of {calls}, one device, all cores): "
        f"{peak / 1e9:.1f} GFLOP/s")
  # TruncatedStep's reset="auto": "cond" on a CPU, "select" elsewhere; --other_reset also times the other one.
  other_reset = "select" if jax.devices()[0].platform == "cpu" else "cond"
  cols = (["metafam"] + (["other_reset"] if args.other_reset else []) + ["minimal", "sharded", "ref_style"]
          + (["lo", "lo_dev"] if lo else []) + ["naive"])
  cols = [c for c in cols if c not in args.skip]
  heads = {"sharded": f"mf x{devices}", "ref_style": "ref-style", "lo": "LO", "lo_dev": "LO dev",
           "other_reset": f"mf {other_reset}"}
  ratios = ["best/naive", "best/ref-style"] + (["best/LO", "best/LO dev"] if lo else ["best/published"])
  table = []
  for name in args.optimizers:
    theta, opt = make_optimizer(name)
    if theta is None:  # a plain Optimizer: wrap it for the baselines as well
      opt, theta = HandDesigned(opt), {}
    flops = lane_step_flops(family, opt, theta)
    print(f"\n== inner optimizer: {name}; XLA cost analysis: {flops / 1e6:.2f} MFLOP per lane per inner step")
    print(f"{'lanes':>5} " + " ".join(f"{heads.get(c, c):>9}" for c in cols) + f" | {'mf/min time':>11} "
          + " ".join(f"{r:>{max(len(r), 6)}}" for r in ratios) + f" | {'GFLOP/s':>7} {'% peak':>6}"
          + f" | {'mf MB':>6} {'min MB':>6}")
    for lanes in args.lanes:
      runs, mems = {}, {}
      runs["metafam"], mems["metafam"] = setup_metafam(family, opt, theta, lanes, None)
      if args.other_reset:
        runs["other_reset"], _ = setup_metafam(family, opt, theta, lanes, None, reset=other_reset)
      runs["minimal"], mems["minimal"] = setup_minimal(family, opt, theta, lanes)
      if devices > 1 and lanes % devices == 0:
        runs["sharded"], _ = setup_metafam(family, opt, theta, lanes, devices)
      if "ref_style" in cols:
        runs["ref_style"], _ = setup_ref_style(family, opt, theta, lanes)
      if lo and name in REFERENCE:  # LO 0.0.1 has no AdafacMLPLOpt: its columns stay empty
        runs["lo"], runs["lo_dev"] = reference_lo.setup_inner(lo, family, name, lanes, UNROLL)
      times = bench_common.round_robin(runs, args.rounds)
      if "naive" in cols:
        times["naive"] = bench_naive(family, opt, theta, lanes, args.naive_steps)
      rate = {k: UNROLL * lanes / t for k, t in times.items()}
      best = max(rate.get("sharded", 0.0), rate["metafam"])
      baselines = {"best/naive": rate.get("naive"), "best/ref-style": rate.get("ref_style"), "best/LO": rate.get("lo"),
                   "best/LO dev": rate.get("lo_dev"), "best/published": REFERENCE.get(name, {}).get(lanes)}
      print(f"{lanes:>5} " + " ".join(f"{rate[c]:>9,.0f}" if c in rate else f"{'-':>9}" for c in cols)
            + f" | {times['metafam'] / times['minimal']:>11.2f} "
            + " ".join(f"{best / baselines[r]:>{max(len(r), 6)}.2f}" if baselines[r] else f"{'-':>{max(len(r), 6)}}"
                       for r in ratios)
            + f" | {best * flops / 1e9:>7.1f} {best * flops / peak:>6.0%}"
            + f" | {mems['metafam'] / 2**20:>6.1f} {mems['minimal'] / 2**20:>6.1f}", flush=True)
      table.append([name, lanes] + [rate[c] if c in rate else "-" for c in cols]
                   + [times["metafam"] / times["minimal"]]
                   + [f"{best / baselines[r]:.2f}x" if baselines[r] else "-" for r in ratios]
                   + [f"{best * flops / peak:.0%}", mems["metafam"] / 2 ** 20])
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(f"\nprocess peak RSS: {rss:,.0f} MB. 'GFLOP/s' = best inner steps/s x XLA's FLOPs per lane step; '% peak' "
        f"= that / the measured matmul peak. 'mf/min time' = metafam time / minimal time on one device (1.00 = no "
        f"overhead); 'best' = the faster of metafam on one device and metafam x{devices}.")
  bench_common.write_markdown(args.markdown, [bench_common.markdown_table(
      f"Inner training, inner steps/s summed over lanes ({family.name}, unroll {UNROLL})",
      ["optimizer", "lanes"] + [heads.get(c, c) for c in cols] + ["mf/min time"] + ratios + ["% peak", "mf MB"],
      table, [f"`python benchmarks/inner_training.py{' --smoke' if args.smoke else ''}`: median of {args.rounds} "
              f"interleaved calls; 'best' = the faster of metafam on one device and on {devices}; '% peak' against "
              f"a {size} x {size} fp32 matrix product measured in the run ({peak / 1e9:,.0f} GFLOP/s)."])])


if __name__ == "__main__":
  main()
