"""Named benchmark suites: a plain dict from suite name to registered task names (`metafam.tasks.registry.TASKS`).

* ``tiny``: two tasks that compile and train in seconds (the tests and the CLI's ``--quick`` path).
* ``small``: the Fashion-MNIST image MLPs at 8x8 and 16x16 and the 8x8 autoencoder and VAE: the registered tasks
  that train fast on CPU (a 7-rate x 2-seed Adam sweep of 400 steps plus one 2-seed run of 200 steps took 20-45 s per
  task on two busy cores). The conv and language-model tasks are left out: the same sweep took 160 s (LSTM) and
  260 s (16x16 conv) there.
* ``full``: every registered task.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple, Union

from metafam._registry import lookup
from metafam.tasks.base import Task
from metafam.tasks.registry import TASKS, get_task

SUITES: Dict[str, List[str]] = {
    "tiny": ["quadratic_10", "fmnist_mlp_8x8_32"],
    "small": ["fmnist_mlp_8x8_32", "fmnist_mlp_8x8_64x64_tanh", "fmnist_mlp_16x16_64_gelu",
              "fmnist_mlp_16x16_128x32", "fmnist_ae_8x8_32x8x32", "fmnist_vae_8x8_32_z4"],
    "full": list(TASKS),
}


def list_suites() -> List[str]:
  return sorted(SUITES)


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
