"""A tiny meta-training setup shared by the meta-trainer tests and their resume subprocess."""

import sys

import optax

from metafam.inner import ConstantSchedule
from metafam.optimizers.learned import LearnableSGD
from metafam.outer_trainers import PES, MetaTrainer, TruncatedBPTT
from metafam.taskfamilies.quadratic import QuadraticFamily


def quadratic_family():
  return QuadraticFamily(8, scale_range=(0.5, 2.0))


def build_trainer(num_pairs=8, unroll_length=10, trajectory=50, lr=0.05, with_tbptt=False, devices=None):
  family, lopt = quadratic_family(), LearnableSGD(0.01)
  estimators = [PES(family, lopt, num_pairs=num_pairs, unroll_length=unroll_length,
                    schedule=ConstantSchedule(trajectory), sigma=0.1, loss_kind="meta_loss", devices=devices)]
  if with_tbptt:
    estimators.append(TruncatedBPTT(family, lopt, num_tasks=4, unroll_length=unroll_length,
                                    schedule=ConstantSchedule(trajectory), loss_kind="meta_loss", devices=devices))
  return MetaTrainer(lopt, estimators, optax.adam(lr), clip_grad_norm=10.0, eval_family=family, eval_num_tasks=4,
                     eval_steps=20, config={"test": "meta_setup", "with_tbptt": with_tbptt})


if __name__ == "__main__":  # python meta_setup.py OUTPUT_DIR NUM_STEPS
  import jax
  jax.config.update("jax_threefry_partitionable", False)  # the random streams of the test process (conftest.py)
  trainer = build_trainer(with_tbptt=True)
  trainer.train(int(sys.argv[2]), key=jax.random.key(7), output_dir=sys.argv[1], checkpoint_every=2, progress=False)
