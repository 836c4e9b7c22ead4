"""Trains a vmapped batch of task instances sampled from a family on the embedded Fashion-MNIST and prints losses.

    python examples/train_family.py --num_tasks 32 --num_steps 300

Every instance has its own config (activation, initializer scale, label noise), params and Adam state; all of them
train in one jitted `lax.scan` over `vmap`, with batches gathered on the device from the split handed over once.
"""

from __future__ import annotations

import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from metafam.optimizers import Adam
from metafam.taskfamilies import ImageMLPFamily

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_tasks", 32, "Task instances trained in parallel.", lower_bound=1)
flags.DEFINE_integer("num_steps", 300, "Inner training steps per instance.", lower_bound=1)
flags.DEFINE_integer("steps_per_call", 50, "Steps fused into one jitted call.", lower_bound=1)
flags.DEFINE_integer("image_size", 8, "Side of the resized images.", lower_bound=1)
flags.DEFINE_float("learning_rate", 3e-3, "Adam learning rate.", lower_bound=0.0)
flags.DEFINE_integer("seed", 0, "Random seed.")


def main(argv):
  del argv
  family = ImageMLPFamily((32,), image_size=FLAGS.image_size, batch_size=128)
  opt = Adam(FLAGS.learning_rate)
  train, test = family.datasets.device_data("train"), family.datasets.device_data("test")

  def init(key):
    k1, k2 = jax.random.split(key)
    cfg = family.sample(k1)
    return cfg, opt.init(family.task_fn(cfg).init(k2))

  def eval_loss(cfg, state, key):  # clean labels on the held-out split
    task = family.task_fn(dict(cfg, label_noise=jnp.zeros_like(cfg["label_noise"])))
    return task.loss_and_aux(opt.get_params(state), key, test.sample(key))

  def step(carry, key):
    cfgs, states = carry

    def one(cfg, state, k):
      kb, kl = jax.random.split(k)
      loss, grad = jax.value_and_grad(family.task_fn(cfg).loss)(opt.get_params(state), kl, train.sample(kb))
      return opt.update(state, grad, loss=loss), loss

    states, losses = jax.vmap(one)(cfgs, states, jax.random.split(key, FLAGS.num_tasks))
    return (cfgs, states), losses

  @jax.jit
  def run(cfgs, states, key):
    keys = jax.random.split(key, FLAGS.steps_per_call)
    (cfgs, states), losses = jax.lax.scan(step, (cfgs, states), keys)
    return states, losses

  key = jax.random.key(FLAGS.seed)
  cfgs, states = jax.jit(jax.vmap(init))(jax.random.split(key, FLAGS.num_tasks))
  evaluate = jax.jit(jax.vmap(eval_loss, in_axes=(0, 0, None)))
  loss0, aux0 = evaluate(cfgs, states, jax.random.key(1))
  print(f"{FLAGS.num_tasks} instances of {family.name}; test loss at init: mean {float(loss0.mean()):.3f}")

  start, done = time.perf_counter(), 0
  with tqdm(total=FLAGS.num_steps, desc="inner steps", unit="step") as bar:
    while done < FLAGS.num_steps:
      states, losses = run(cfgs, states, jax.random.fold_in(key, done))
      done += FLAGS.steps_per_call
      bar.update(FLAGS.steps_per_call)
      bar.set_postfix(train_loss=f"{float(losses[-1].mean()):.3f}")
  elapsed = time.perf_counter() - start

  loss, aux = evaluate(cfgs, states, jax.random.key(1))
  act = np.asarray(cfgs["activation"])
  print(f"{'task':>4} {'activation':>10} {'init_scale':>10} {'label_noise':>11} {'test loss':>9} {'accuracy':>8}")
  for i in range(FLAGS.num_tasks):
    print(f"{i:>4} {family.activations[act[i]]:>10} {float(cfgs['init_scale'][i]):>10.2f} "
          f"{float(cfgs['label_noise'][i]):>11.3f} {float(loss[i]):>9.3f} {float(aux['accuracy'][i]):>8.3f}")
  print(f"test loss: {float(loss0.mean()):.3f} at init -> {float(loss.mean()):.3f} after {done} steps "
        f"(mean accuracy {float(aux['accuracy'].mean()):.3f}); "
        f"{done * FLAGS.num_tasks / elapsed:,.0f} inner steps/s incl. compile")


if __name__ == "__main__":
  app.run(main)
