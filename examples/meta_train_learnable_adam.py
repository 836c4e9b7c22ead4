"""Meta-trains LearnableAdam's hyper-parameters with PES on the 8x8 image-MLP family, then evaluates it.

    python examples/meta_train_learnable_adam.py --num_steps 200

The learning rate starts far too low (1e-4); PES on the outer_valid loss raises it within a few hundred meta-steps.
"""

import argparse

import jax
import optax

from metafam.inner import ConstantSchedule, TruncatedStep
from metafam.optimizers import LearnableAdam
from metafam.outer_trainers import PES, MetaTrainer
from metafam.runs import MetaValidation, train
from metafam.taskfamilies import ImageMLPFamily


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--num_steps", type=int, default=200)
  args = parser.parse_args()
  family = ImageMLPFamily((32,), image_size=8, batch_size=128)
  lopt = LearnableAdam(initial_lr=1e-4)
  # The inner configuration: 8 task instances per particle, trajectories of 100 steps (staggered), meta-loss on
  # outer_valid. PES runs 8 antithetic pairs on it, truncations of 10 steps.
  step = TruncatedStep(family, lopt, 8, ConstantSchedule(100), random_initial_iteration=True,
                       meta_loss_split="outer_valid")
  pes = PES(step, unroll_length=10, sigma=0.05)
  trainer = MetaTrainer(lopt, [pes], optax.adam(0.03), clip_grad_norm=1.0)
  # Held-out instances (the same at every call), trained for 100 steps, scored on outer_valid.
  validation = MetaValidation(lopt, [family], num_tasks=8, num_steps=100)
  key = jax.random.key(0)
  before = validation(trainer.initial_theta(key))
  state, history = train(trainer, args.num_steps, key=key)
  after = validation(state.theta)
  hp = lopt.hyperparameters(state.theta)
  print(f"learning rate 1e-4 -> {float(hp['lr']):.2e}; beta1 {float(hp['beta1']):.3f}, beta2 {float(hp['beta2']):.4f}")
  print(f"held-out normalized outer_valid loss after 100 steps: {before['eval_final_loss']:.3f} -> "
        f"{after['eval_final_loss']:.3f}")


if __name__ == "__main__":
  main()
