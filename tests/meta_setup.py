"""A tiny meta-training setup shared by the meta-trainer tests and their resume subprocess."""

import sys

import optax

from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.optimizers.learned import LearnableSGD
from metafam.outer_trainers import PES, MetaTrainer, TruncatedBPTT
from metafam.runs import train
from metafam.taskfamilies.quadratic import QuadraticFamily


def quadratic_family():
  return QuadraticFamily(8, scale_range=(0.5, 2.0))


def build_trainer(num_tasks=8, unroll_length=10, trajectory=50, lr=0.05, with_tbptt=False, devices=None):
  family, lopt = quadratic_family(), LearnableSGD(0.01)
  # One inner configuration, shared: PES runs num_tasks antithetic pairs on it, TBPTT 4 lanes of the same setup.
  step = TruncatedStep(family, lopt, num_tasks, ConstantSchedule(trajectory), random_initial_iteration=True,
                       meta_loss_split="outer_valid", devices=devices)
  estimators = [PES(step, unroll_length=unroll_length, sigma=0.1, loss_kind="meta_loss")]
  if with_tbptt:
    estimators.append(TruncatedBPTT(step.replace(num_tasks=4), unroll_length=unroll_length, loss_kind="meta_loss"))
  return MetaTrainer(lopt, estimators, optax.adam(lr), clip_grad_norm=10.0)


if __name__ == "__main__":  # python meta_setup.py OUTPUT_DIR NUM_STEPS
  import jax
  jax.config.update("jax_threefry_partitionable", False)  # the random streams of the test process (conftest.py)
  trainer = build_trainer(with_tbptt=True)
  train(trainer, int(sys.argv[2]), key=jax.random.key(7), output_dir=sys.argv[1], checkpoint_every=2, progress=False)
