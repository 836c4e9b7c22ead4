"""One process of a small PES meta-training run, for tests/test_distributed.py.

    python distributed_driver.py OUT_DIR NUM_STEPS THETA_NPZ [--num_processes N --process_id I --coordinator H:P]
        [--devices D] [--checkpoint_every K] [--sleep S]

Meta-trains `MLPLOpt` with PES on an 8-dimensional quadratic family, the lanes spread over every device of every
process (``D`` CPU devices per process), checkpointing into OUT_DIR; process 0 then saves the final theta to
THETA_NPZ. ``--sleep`` pauses after each meta-step (so a test can kill a process mid-run).
"""

import argparse
import os
import time

import jax
import numpy as np

from metafam import distributed


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("out_dir")
  parser.add_argument("num_steps", type=int)
  parser.add_argument("theta_npz")
  parser.add_argument("--num_processes", type=int, default=1)
  parser.add_argument("--process_id", type=int, default=0)
  parser.add_argument("--coordinator", default=None)
  parser.add_argument("--devices", type=int, default=1)
  parser.add_argument("--checkpoint_every", type=int, default=1)
  parser.add_argument("--sleep", type=float, default=0.0)
  args = parser.parse_args()

  jax.config.update("jax_threefry_partitionable", False)  # the random streams of the test process (conftest.py)
  jax.config.update("jax_num_cpu_devices", args.devices)
  if os.environ.get("METAFAM_TEST_JAX_CACHE"):  # the tests share compiled programs between their runs
    jax.config.update("jax_compilation_cache_dir", os.environ["METAFAM_TEST_JAX_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  distributed.initialize(distributed.ProcessGroup(args.num_processes, args.process_id, args.coordinator,
                                                  timeout_s=30, heartbeat_s=5))
  import optax
  from metafam.inner import ConstantSchedule, TruncatedStep
  from metafam.optimizers import MLPLOpt
  from metafam.outer_trainers import PES, MetaTrainer
  from metafam.runs import train
  from metafam.taskfamilies.quadratic import QuadraticFamily

  family, lopt = QuadraticFamily(8, scale_range=(0.5, 2.0)), MLPLOpt()
  devices = jax.device_count()
  step = TruncatedStep(family, lopt, 4, ConstantSchedule(30), random_initial_iteration=True,
                       meta_loss_split="outer_valid", devices=devices if devices > 1 else None)
  trainer = MetaTrainer(lopt, [PES(step, unroll_length=10, sigma=0.05, loss_kind="meta_loss")], optax.adam(1e-2),
                        clip_grad_norm=10.0)
  log = (lambda record: time.sleep(args.sleep)) if args.sleep else None
  state, _ = train(trainer, args.num_steps, key=jax.random.key(3), output_dir=args.out_dir,
                           checkpoint_every=args.checkpoint_every, progress=False, log_fn=log)
  theta = distributed.to_host(state.theta)
  if distributed.is_main_process():
    flat, _ = jax.tree_util.tree_flatten_with_path(theta)
    np.savez(args.theta_npz, **{jax.tree_util.keystr(path): np.asarray(x) for path, x in flat})
  print(f"process {jax.process_index()} of {jax.process_count()} done at step {int(state.step)}", flush=True)


if __name__ == "__main__":
  try:
    main()
  except distributed.PeerFailureError as e:
    print(f"error: {e}", flush=True)
    distributed.exit_now(1)
