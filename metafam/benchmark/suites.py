"""Named benchmark suites: a plain dict from suite name to registered task names (`metafam.tasks.registry.TASKS`).

* ``tiny``: two tasks that compile and train in seconds (the tests and the CLI's ``--quick`` path).
* ``small``: the Fashion-MNIST image MLPs at 8x8 and 16x16 and the 8x8 autoencoder and VAE: the registered tasks
  that train fast on CPU. The conv and language-model tasks, several times slower to tune there, are left out
  (timings: docs/performance/inner-loop.md).
* ``full``: every registered task.
* ``heldout``: 17 tasks unlike meta-training's 8x8 Fashion-MNIST MLPs (`metafam.tasks.registry.HELDOUT_SUITE`):
  other widths (64-1024 units), depths (1-4 hidden layers), resolutions (16x16, 28x28), architectures (conv nets with
  and without LayerNorm, autoencoders, VAEs, an MLP-Mixer, a character LSTM and transformer), data (MNIST digits, Shakespeare) and
  batch sizes (32-256), each with its own horizon (`HORIZONS`, 200 to 2,000 steps). Its tuned baselines ship as a
  data file (`metafam.benchmark.baselines`), so evaluating an optimizer on it trains only that optimizer. It is the
  project's *development* suite: design choices, ablations and early stopping are chosen on it.
* ``test``: 12 tasks at the sizes people train (`metafam.tasks.registry.TEST_SUITE`): the full Fashion-MNIST at
  28x28 (read from ``$METAFAM_FASHION_MNIST_DIR`` or Debian's ``dataset-fashion-mnist``) and the Shakespeare corpus,
  10^5 to 7x10^5 parameters (and a convex logistic regression), MLPs of 2, 3, 4 and 6 layers, a CNN, an autoencoder,
  a VAE, an LSTM and a transformer LM, horizons of 1,000 and 2,000 steps (`TEST_HORIZONS`). Nothing is tuned on it: a
  shipped optimizer is scored on it once (`metafam.benchmark.evaluate_suite(..., suite="test", confirm_test=True)`).
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple, Union

from metafam._registry import lookup
from metafam.tasks.base import Task
from metafam.tasks.registry import HELDOUT_SUITE, TASKS, TEST_SUITE, get_task

# The heldout and test suites' horizons (inner steps of one run) per task, in generation order, read from the one
# table of each suite's tasks (`metafam.tasks.registry.HELDOUT_SUITE`, `TEST_SUITE`): a task is added there.
HORIZONS: Dict[str, int] = {name: task.horizon for name, task in HELDOUT_SUITE.items()}
TEST_HORIZONS: Dict[str, int] = {name: task.horizon for name, task in TEST_SUITE.items()}

SUITES: Dict[str, List[str]] = {
    "tiny": ["quadratic_10", "fmnist_mlp_8x8_32"],
    "small": ["fmnist_mlp_8x8_32", "fmnist_mlp_8x8_64x64_tanh", "fmnist_mlp_16x16_64_gelu",
              "fmnist_mlp_16x16_128x32", "fmnist_ae_8x8_32x8x32", "fmnist_vae_8x8_32_z4"],
    "full": list(TASKS),
    "heldout": list(HORIZONS),
    "test": list(TEST_HORIZONS),
}


def list_suites() -> List[str]:
  return sorted(SUITES)


def check_user_data(tasks: str) -> None:
  """ValueError naming the task (or suite) and how to supply its data when a task of ``tasks`` (a task or suite name)
  needs data the user supplies and none is found (`metafam.tasks.registry.check_task_data`); reads no data."""
  from metafam.tasks.registry import check_task_data
  for name in SUITES.get(tasks, [tasks]):
    try:
      check_task_data(name)
    except FileNotFoundError as e:
      raise ValueError(f"--{'suite' if tasks in SUITES else 'task'} {tasks}: {e}") from None


def get_suite(name: str) -> List[str]:
  """The task names of suite ``name`` (a new list); `UnknownNameError` (a KeyError) listing the suites if unknown."""
  return list(lookup(SUITES, name, "suite"))


def resolve_tasks(tasks: Union[str, Task, Sequence[Union[str, Task]]]) -> List[Tuple[str, Task]]:
  """``[(name, Task)]`` from a suite name, a registered task name, a `Task`, or a list of names and `Task`s.

  A registered task is named by its registry name, a `Task` object by ``task.name``. Names must be unique.
  """
  if isinstance(tasks, Task):
    tasks = [tasks]
  elif isinstance(tasks, str):  # a suite name wins over a task of the same name
    tasks = list(lookup({**{t: [t] for t in TASKS}, **SUITES}, tasks, "suite or task"))
  out: List[Tuple[str, Task]] = []
  for t in tasks:
    if isinstance(t, Task):
      out.append((t.name, t))
    elif isinstance(t, str):
      out.append((t, get_task(t)))
    else:
      raise TypeError(f"a task must be a registered task name or a metafam Task, got {type(t).__name__}.")
  names = [n for n, _ in out]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"task names must be unique, got duplicates {duplicates}.")
  if not out:
    raise ValueError("no tasks given.")
  return out
