"""The README's worked custom task + family example trains to its noise floor."""

import os
import runpy

import numpy as np

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def test_custom_task_family_example_reaches_the_noise_floor():
  module = runpy.run_path(os.path.join(EXAMPLES, "custom_task_family.py"), run_name="example")
  losses, floor = module["main"](num_tasks=16, num_steps=300)
  assert losses.shape == (300, 16)
  # Least squares with fresh batches of 32: at the optimum the expected loss is noise^2; allow 25% for the
  # variance of the last 20 batches and the remaining optimization error.
  assert float(np.mean(losses[-20:])) < 1.25 * float(floor) + 1e-3
  assert float(np.mean(losses[0])) > 10 * float(floor)
