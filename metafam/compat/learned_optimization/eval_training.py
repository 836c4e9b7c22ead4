"""`learned_optimization.eval_training`: training curves as the reference's dict, trained by metafam's evaluation
engine (`metafam.evaluation.Runner`: jitted scans of `metafam.inner.step.train_step`, one program per chunk).

`single_task_training_curves(task, opt, num_steps, key, eval_every, eval_batches, last_eval_batches, eval_task)`
trains ``num_steps + 1`` updates, as the reference does, and evaluates before update ``i`` for every ``i`` that is a
multiple of ``eval_every`` on the ``train``, ``outer_valid`` and ``test`` splits (``last_eval_batches`` batches when
``i == num_steps``, else ``eval_batches``; ``eval_batches=0`` skips evaluation). Keys of the result:
``train/xs``, ``train/loss`` (``f32[num_steps + 1]``), ``eval/xs``, ``eval/<split>/loss``,
``eval/<split>/loss_normalized``, ``eval/<split>/<aux name>``, ``eval/eval_batches``, ``eval/last_eval_batches``.

`multi_task_training_curves(task_family, learned_opt, theta, n_tasks, key=..., steps, steps_per_jit, eval_every,
splits, with_aux_values, ...)` trains ``n_tasks`` sampled tasks with ``learned_opt.opt_fn(theta)`` (vmapped) and
evaluates at every multiple of ``steps_per_jit`` that is a multiple of ``eval_every`` and at the end: ``train/xs`` and
``train/loss`` ``[n_tasks, steps]``, ``eval/xs`` and ``eval/<split>/loss`` / ``norm_loss`` / ``aux/<name>`` (for the
names in ``with_aux_values``) ``[n_tasks, E]``. ``steps`` must be a multiple of ``steps_per_jit`` (ValueError, as in
the reference). ``n_devices`` is ignored (metafam places the lanes itself); ``task_params`` replaces the sampled
configs; ``seed`` gives the key when ``key`` is None.

Differences on purpose: randomness follows metafam's evaluation engine (step ``t`` uses ``fold_in(train_key, t)``),
so the numbers are not the reference's draw for draw; ``metrics_every``/``summary_writer``/``device`` are accepted
and ignored (no oryx summaries).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from metafam._checks import check_positive_int
from metafam.evaluation.evaluate import Runner

__all__ = ["single_task_training_curves", "multi_task_training_curves"]

# The reference's type aliases.
OptState = Any
TaskParam = Any
Data = Any
PRNGKey = jax.Array


def _eval_batches(datasets: Any, split: str, num: int) -> list:
  if datasets is None:
    return [None] * num
  iterator = datasets.split(split)
  return [jax.tree.map(jnp.asarray, next(iterator)) for _ in range(num)]


def _evaluate(obj, vmapped, cfg, params, state, key, batches):
  """Mean ``(loss, normalized loss, aux)`` over ``batches`` (one key per batch) of a task, or (``vmapped``) of the
  tasks of family ``obj`` at configs ``cfg``."""

  def one(c, p, s, k, batch):
    task = obj.task_fn(c) if vmapped else obj
    loss, _, aux = task.loss_with_state_and_aux(p, s, k, batch)
    return loss, task.normalizer(loss), aux

  if vmapped:
    one = jax.vmap(one, in_axes=(0, 0, 0, 0, None))
  results = []
  for i, batch in enumerate(batches):
    k = jax.random.fold_in(key, i)
    results.append(one(cfg, params, state, jax.random.split(k, jax.tree.leaves(params)[0].shape[0]) if vmapped
                       else k, batch))
  return jax.tree.map(lambda *xs: jnp.mean(jnp.stack([jnp.asarray(x, jnp.float32) for x in xs]), axis=0), *results)


_EVALUATE = jax.jit(_evaluate, static_argnums=(0, 1))


def _numpy(tree):
  return jax.tree.map(np.asarray, tree)


def single_task_training_curves(task: Any, opt: Any, num_steps: int, key: jax.Array, eval_every: int = 10,
                                eval_batches: int = 5, last_eval_batches: int = 20, eval_task: Optional[Any] = None,
                                device: Any = None, metrics_every: Optional[int] = None,
                                summary_writer: Any = None) -> Dict[str, np.ndarray]:
  num_steps = check_positive_int("num_steps", num_steps)
  eval_every = check_positive_int("eval_every", eval_every)
  eval_task = task if eval_task is None else eval_task
  splits = ("train", "outer_valid", "test")
  runner = Runner(task, opt, splits=splits)
  keys = runner.keys(key)
  cfg, opt_state = runner.init(keys, num_steps)
  points = list(range(0, num_steps + 1, eval_every)) if eval_batches else []
  evals, losses, done = [], [], 0
  for point in points + [num_steps + 1]:
    if point > done:
      opt_state, chunk = runner.train(opt_state, cfg, keys, done, point - done)
      losses.append(np.asarray(chunk))
      done = point
    if point <= num_steps:
      params, state = runner.params(opt_state), runner.model_state(opt_state)
      count = last_eval_batches if point == num_steps else eval_batches
      row = {}
      for s in splits:
        batches = _eval_batches(eval_task.datasets, s, count)
        k = jax.random.fold_in(jax.random.fold_in(keys.eval, point), splits.index(s))
        loss, normalized, aux = _numpy(_EVALUATE(eval_task, False, None, params, state, k, batches))
        row[f"eval/{s}/loss"], row[f"eval/{s}/loss_normalized"] = loss, normalized
        row.update({f"eval/{s}/{name}": value for name, value in aux.items()})
      evals.append(row)
  result = {"train/xs": np.arange(num_steps + 1), "train/loss": np.concatenate(losses)}
  if eval_batches:
    result["eval/xs"] = np.asarray(points)
    result["eval/last_eval_batches"] = np.asarray(last_eval_batches)
    result["eval/eval_batches"] = np.asarray(eval_batches)
    result.update({name: np.stack([row[name] for row in evals]) for name in evals[0]})
  return result


def multi_task_training_curves(task_family: Any, learned_opt: Any, theta: Any, n_tasks: int,
                               seed: Optional[int] = None, key: Optional[jax.Array] = None,
                               task_params: Optional[Any] = None, n_devices: Optional[int] = None,
                               n_eval_batches_vec: int = 1, n_eval_batches: int = 1, last_eval_batches: int = 1,
                               eval_every: int = 10, steps_per_jit: int = 10, eval_just_at_end: bool = False,
                               steps: int = 10000, splits: Sequence[str] = ("train",),
                               with_aux_values: Sequence[str] = ()) -> Dict[str, np.ndarray]:
  n_tasks = check_positive_int("n_tasks", n_tasks)
  steps_per_jit = check_positive_int("steps_per_jit", steps_per_jit)
  if steps % steps_per_jit:
    raise ValueError(f"Please set steps and steps_per_jit to be multiples of each other. Got steps:{steps} "
                     f"steps_per_jit{steps_per_jit}")
  if key is None:
    key = jax.random.PRNGKey(0 if seed is None else seed)
  runner = Runner(task_family, learned_opt.opt_fn(theta), num_members=n_tasks, splits=tuple(splits))
  keys = runner.keys(key)
  cfg, opt_state = runner.init(keys, steps)
  if task_params is not None:  # the given configs, freshly initialized
    cfg = task_params
    init_params = jax.vmap(lambda c, k: task_family.task_fn(c).init_with_state(k))(cfg, keys.init)
    opt_state = jax.vmap(lambda p, s: runner.optimizer.init(p, model_state=s, num_steps=steps))(*init_params)
  points = [] if eval_just_at_end else [i for i in range(0, steps, steps_per_jit) if i % eval_every == 0]
  points.append(steps)
  per_eval = n_eval_batches * n_eval_batches_vec
  losses, evals, done = [], [], 0
  for point in points:
    while done < point:
      opt_state, chunk = runner.train(opt_state, cfg, keys, done, steps_per_jit)
      losses.append(np.asarray(chunk))
      done += steps_per_jit
    params, state = runner.params(opt_state), runner.model_state(opt_state)
    count = last_eval_batches * n_eval_batches_vec if point == steps else per_eval
    row = {}
    for s in splits:
      batches = _eval_batches(task_family.datasets, s, count)
      k = jax.random.fold_in(jax.random.fold_in(keys.shared_eval, point), list(splits).index(s))
      loss, normalized, aux = _numpy(_EVALUATE(task_family, True, cfg, params, state, k, batches))
      row[f"eval/{s}/loss"], row[f"eval/{s}/norm_loss"] = loss, normalized
      for name in with_aux_values:
        row[f"eval/{s}/aux/{name}"] = aux[name]
    evals.append(row)
  return {
      "train/xs": np.tile(np.arange(steps)[None], [n_tasks, 1]),
      "train/loss": np.concatenate(losses, axis=0).T,
      "eval/xs": np.tile(np.asarray(points)[None], [n_tasks, 1]),
      "eval/last_eval_batches": np.asarray(last_eval_batches),
      "eval/eval_batches": np.asarray(per_eval),
      **{name: np.stack([row[name] for row in evals], axis=1) for name in evals[0]},
  }
