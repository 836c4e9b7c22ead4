"""Per-step cost of metafam's vectorized unroll against the minimal ``jit(scan(vmap(step)))``, from the compiled
programs alone: no accelerator needed.

    python benchmarks/lowered_cost.py                              # MLPLOpt and Adam, 4,096 lanes, lowered for CUDA
    python benchmarks/lowered_cost.py --lanes 64 1024 --optimizers adam

For each optimizer and lane count it builds the programs `inner_training.py` times (8x8 image-MLP family, batch 128,
`inner_training.setup_minimal`'s math) and reports, per inner step and lane:

  * FLOPs and bytes from XLA's cost analysis of the program lowered for CUDA (``lowering_platforms=("cuda",)``,
    before XLA's optimizations: no fusion, so "bytes" counts every operation's operands and result), and of the
    same program compiled for this machine's CPU (after fusion: bytes a fused program moves);
  * the structure that costs time on an accelerator whatever the FLOPs: loops inside the step (``while``: a lane
    block loop serializes the update) and conditionals (``case``: on a GPU each one copies its predicate to the
    host and waits for the device, in every step).

XLA's cost analysis counts a loop's body once, whatever its trip count, so the per-step figures come from two
straight-line programs (the unroll's scans fully unrolled, `jax.lax.scan` with ``unroll=True``) of 1 and 2 steps: the
difference is one step, random draws included. A conditional counts as its costlier branch, i.e. as if the fresh
lanes of a reset were computed in every step, which ``reset="select"`` does.

Programs: "minimal"; "metafam" as it runs on an accelerator (``lane_chunk="auto"`` and ``reset="auto"`` resolved for
a GPU: one vmap over the lanes, select resets); "metafam, train part" (the same unroll traced with its reset branch
never taken: what a step costs besides resetting lanes); "metafam (CPU choices)" (lane blocks of the learned optimizer's
``lane_chunk`` and a per-step conditional reset, what an accelerator ran before). ``--smoke``: 4 lanes, tiny model.
Deterministic (no timing): it can run beside other jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import re

import jax
from jax._src.lax.control_flow import loops

import bench_common  # benchmarks/ is on sys.path when this runs as a script
import inner_training
from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.inner.step import auto_lane_chunk
from metafam.optimizers.learned import HandDesigned


@contextlib.contextmanager
def _unrolled_scans():
  """`jax.lax.scan` (and what `jax.lax.map` builds on) fully unrolled while tracing: straight-line programs whose
  cost analysis counts every step."""
  original = loops.scan

  def scan(*args, **kwargs):
    kwargs["unroll"] = True
    return original(*args, **kwargs)

  loops.scan, jax.lax.scan = scan, scan
  try:
    yield
  finally:
    loops.scan, jax.lax.scan = original, original


@contextlib.contextmanager
def _conds_never_taken():
  """`jax.lax.cond` replaced by its false branch while tracing: with ``reset="cond"``, the unroll without its resets
  (the train part of a step alone), for the breakdown."""
  original = jax.lax.cond
  jax.lax.cond = lambda pred, true_fn, false_fn, *operands: false_fn(*operands)
  try:
    yield
  finally:
    jax.lax.cond = original


def _costs(program, args):
  """(FLOPs, bytes) lowered for CUDA and (FLOPs, bytes) compiled for the CPU of ``jit(program)(*args)``."""
  traced = jax.jit(program).trace(*args)
  cuda = traced.lower(lowering_platforms=("cuda",)).cost_analysis()
  cpu = traced.lower().compile().cost_analysis()
  cpu = cpu[0] if isinstance(cpu, (list, tuple)) else cpu
  return (cuda["flops"], cuda["bytes accessed"]), (cpu["flops"], cpu["bytes accessed"])


def per_step(build, lanes):
  """Per-step, per-lane (CUDA FLOPs, CUDA bytes, CPU FLOPs, CPU bytes) of ``build(num_steps) -> (program, args)``;
  and the number of ``while`` and ``case`` ops inside the rolled 2-step program's step."""
  with _unrolled_scans():
    one, two = (_costs(*build(n)) for n in (1, 2))
  step = [(b - a) / lanes for pa, pb in zip(one, two) for a, b in zip(pa, pb)]
  program, args = build(2)
  text = jax.jit(program).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  # The unroll's own scan is the outermost while; count what sits inside it (draws are made before it).
  whiles = len(re.findall(r"stablehlo\.while", text)) - 1
  cases = len(re.findall(r"stablehlo\.case|\"stablehlo\.if\"", text))
  return step, whiles, cases


def metafam_program(family, opt, theta, lanes, lane_chunk, reset):
  step = TruncatedStep(family, opt, lanes, ConstantSchedule(inner_training.UNROLL), meta_loss_split=None,
                       lane_chunk=lane_chunk, reset=reset, donate=False)
  state = jax.eval_shape(lambda: step.init_fn(theta, jax.random.key(0)))

  def build(num_steps):
    def program(step, theta, state, key):
      return step.unroll_fn(theta, state, jax.random.split(key, num_steps))
    return program, (step, theta, state, jax.random.key(1))
  return build


def minimal_program(family, opt, theta, lanes):
  data = family.datasets.device_data("train")
  states = jax.eval_shape(jax.vmap(lambda th, k: inner_training.fresh_state(family, opt, th, k), in_axes=(None, 0)),
                          theta, jax.random.split(jax.random.key(0), lanes))

  def build(num_steps):
    return inner_training.minimal_run_fn(family, opt, lanes, num_steps), (theta, states, data, jax.random.key(1))
  return build


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--lanes", type=int, nargs="+", default=[4096])
  parser.add_argument("--optimizers", nargs="+", default=["mlp_lopt", "adam"],
                      choices=["mlp_lopt", "adam", "adafac_mlp_lopt"])
  bench_common.add_flags(parser)
  args = parser.parse_args()
  if args.smoke:
    args.lanes = [4]
  family = bench_common.image_mlp_family(args.smoke)
  print(f"jax {jax.__version__}; {family.name}; per inner step and lane: FLOPs and bytes of the program lowered for "
        "CUDA (unfused) and compiled for this CPU (fused); loops and conditionals inside the step")
  columns = ["optimizer", "lanes", "program", "MFLOP (CUDA)", "MB (CUDA)", "MFLOP (CPU)", "MB (CPU)",
             "FLOPs / minimal", "bytes / minimal (CUDA)", "bytes / minimal (CPU)", "loops in step", "conds in step"]
  rows = []
  for name in args.optimizers:
    theta, opt = inner_training.make_optimizer(name)
    if theta is None:
      opt, theta = HandDesigned(opt), {}
    cpu_chunk = auto_lane_chunk(getattr(opt, "lane_chunk", None), "cpu")
    for lanes in args.lanes:
      programs = {"minimal": minimal_program(family, opt, theta, lanes),
                  "metafam": metafam_program(family, opt, theta, lanes, None, "select"),
                  "metafam, train part (no reset)": metafam_program(family, opt, theta, lanes, None, "cond"),
                  "metafam (CPU choices)": metafam_program(family, opt, theta, lanes, cpu_chunk, "cond")}
      base = None
      for label, build in programs.items():
        if label.endswith("(no reset)"):
          with _conds_never_taken():
            step, whiles, cases = per_step(build, lanes)
        elif label.endswith("(CPU choices)") and cpu_chunk is not None and lanes > cpu_chunk:
          # Unrolling its lane-block loop would trace lanes / chunk copies of the update; its per-step costs are
          # metafam's (the same operations in blocks), so only its structure is read.
          step, whiles, cases = per_step(metafam_program(family, opt, theta, lanes, None, "cond"), lanes)
          whiles += 1
        else:
          step, whiles, cases = per_step(build, lanes)
        base = base or step
        row = [name, lanes, label] + [v / 1e6 for v in step] + [
            step[0] / base[0], step[1] / base[1], step[3] / base[3], whiles, cases]
        rows.append(row)
        print(" | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row), flush=True)
  bench_common.write_markdown(args.markdown, [bench_common.markdown_table(
      "Per-step cost of the unroll, from XLA's cost analysis (no timing)", columns, rows,
      [f"`python benchmarks/lowered_cost.py{' --smoke' if args.smoke else ''}`: per inner step and lane, the "
       "difference of fully unrolled 1- and 2-step programs; CUDA = lowered for CUDA before XLA's optimizations "
       "(unfused), CPU = compiled for this CPU (fused). A conditional counts as its costlier branch."])])


if __name__ == "__main__":
  main()
