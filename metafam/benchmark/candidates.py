"""What a suite scores: a candidate, resolved and checked before any training.

    evaluate_suite(lambda lr: optax.contrib.schedule_free_adamw(lr, warmup_steps=20))   # a factory: tuned per task
    evaluate_suite(schedule_factory(my_factory))          # a factory that takes an optax schedule, said so
    evaluate_suite(optax.adam(1e-3), name="adam-1e-3")    # a whole transformation: untuned, under its name
    evaluate_suite("ademamix")                            # a registered optax factory, tuned like the baselines
    evaluate_suite((MLPLOpt(), "run/checkpoint.npz"))     # a learned optimizer with its meta-parameters

The contract (`resolve`):

* **A factory** is any callable of a float learning rate that returns an ``optax.GradientTransformation``; its own
  keyword arguments, warmups and betas are its business. The suite tunes the rate per task (and, if asked, the
  schedule): each step the factory is called with that step's rate as a number (``optax.inject_hyperparams`` holds
  the per-lane rate and evaluates the schedule), so it never sees a function. A factory with a ``num_steps``
  parameter also gets the task's horizon.
* **A schedule factory** (`schedule_factory`) takes an optax schedule ``count -> rate`` instead, as every optax
  alias does; the registered names (`metafam.optimizers.optax_zoo.OPTAX_FACTORIES`, ``sgd``, ``sgdm``) are used so,
  which keeps the shipped baselines' numbers.
* **A whole transformation** or a metafam `Optimizer` is scored untuned, as it is, under ``name`` (required for a
  transformation: its settings are not in its type).
* **A learned optimizer** is ``(LearnedOptimizer, theta or checkpoint path)``.

Everything is checked here, before any task trains: a factory is called once with a float rate and its
transformation traced on a small pytree (`check_factory`); anything else gets one line saying what was given and
what is accepted. A candidate named like one of the suite's baselines is labelled ``"<name> (candidate)"``, so tables,
files and plots never show two optimizers under one name.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import optax

from metafam.optimizers.base import Optimizer
from metafam.optimizers.learned import LearnedOptimizer

CANDIDATE_SUFFIX = " (candidate)"
_PROBE_RATE = 1e-3


@dataclasses.dataclass(frozen=True)
class ScheduleFactory:
  """A factory marked as taking an optax schedule ``count -> learning rate`` (see the module docstring)."""
  fn: Callable[..., optax.GradientTransformation]

  def __call__(self, *args: Any, **kwargs: Any) -> optax.GradientTransformation:
    return self.fn(*args, **kwargs)

  @property
  def __name__(self) -> str:  # the label a candidate gets by default
    return getattr(self.fn, "__name__", type(self.fn).__name__)


def schedule_factory(fn: Callable[..., optax.GradientTransformation]) -> ScheduleFactory:
  """``fn`` marked as taking an optax schedule as its learning rate (e.g. ``optax.adam`` itself)."""
  if isinstance(fn, ScheduleFactory):
    return fn
  if not callable(fn):
    raise TypeError(f"schedule_factory needs a callable, got {type(fn).__name__}.")
  return ScheduleFactory(fn)


def takes_schedule(factory: Any) -> bool:
  """Whether ``factory`` was marked by `schedule_factory`."""
  return isinstance(factory, ScheduleFactory)


def horizon_kwargs(factory: Any, horizon: int) -> dict:
  """``{"num_steps": horizon}`` for a factory with a ``num_steps`` parameter (a rule that reads the run's length),
  else ``{}``."""
  fn = factory.fn if isinstance(factory, ScheduleFactory) else factory
  try:
    return {"num_steps": horizon} if "num_steps" in inspect.signature(fn).parameters else {}
  except (TypeError, ValueError):  # a callable without an inspectable signature takes the rate alone
    return {}


def at_schedule(factory: Any, schedule: Callable[[jax.Array], jax.Array], horizon: int
                ) -> optax.GradientTransformation:
  """``factory``'s transformation following ``schedule``: passed as it is to a `ScheduleFactory`; for a factory of a
  float, `optax.inject_hyperparams` evaluates the schedule at each update and calls the factory with the number."""
  extra = horizon_kwargs(factory, horizon)
  if takes_schedule(factory):
    return factory(schedule, **extra)

  def at_rate(learning_rate):
    return factory(learning_rate, **extra)
  return optax.inject_hyperparams(at_rate)(schedule)


def _probe_params():
  return {"w": jnp.zeros((3, 2), jnp.float32), "b": jnp.zeros((2,), jnp.float32)}


def check_factory(factory: Any, argument: str = "candidate") -> None:
  """Raises ValueError (one line) unless ``factory`` builds a transformation that initializes and updates a small
  pytree at a constant schedule (`at_schedule`; traced by ``jax.eval_shape``, nothing compiled or trained)."""
  what = "schedule factory" if takes_schedule(factory) else "factory of a float learning rate"
  if not takes_schedule(factory):
    try:
      out = factory(_PROBE_RATE, **horizon_kwargs(factory, 8))
    except Exception as e:  # the user's code: any failure is reported as what it is
      raise ValueError(f"{argument}: the {what} failed when called with learning rate {_PROBE_RATE} "
                       f"({type(e).__name__}: {e}); if it takes an optax schedule, wrap it in "
                       "metafam.benchmark.schedule_factory.") from None
    if not isinstance(out, optax.GradientTransformation):
      hint = (" (an optax schedule? a candidate factory maps a learning rate to a transformation, e.g. "
              "lambda lr: optax.adam(lr))") if jnp.ndim(out) == 0 and not callable(out) else ""
      raise ValueError(f"{argument}: the factory returned {type(out).__name__}, not an "
                       f"optax.GradientTransformation{hint}.")
  params = _probe_params()

  def one_update(params):
    tx = at_schedule(factory, lambda count: _PROBE_RATE * jnp.ones_like(count, jnp.float32), 8)
    state = tx.init(params)
    updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
    return updates
  try:
    updates = jax.eval_shape(one_update, params)
  except Exception as e:  # the user's code
    raise ValueError(f"{argument}: the {what} cannot be scheduled per step ({type(e).__name__}: "
                     f"{str(e).splitlines()[0] if str(e) else ''}).") from None
  if jax.tree.structure(updates) != jax.tree.structure(params):
    raise ValueError(f"{argument}: the {what}'s updates do not have the params' structure.")


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A resolved candidate.

  Attributes:
    name: its label in tables, files and plots (never a baseline's).
    kind: ``"factory"`` (its rate tuned per task) or ``"fixed"`` (scored as it is).
    factory: the factory of a ``"factory"`` candidate (a `ScheduleFactory` when it takes a schedule).
    optimizer: what a ``"fixed"`` candidate trains: an `Optimizer`, an optax transformation or a
      ``(LearnedOptimizer, theta or path)`` pair.
    source: what was given (for fingerprints of learned optimizers' meta-parameters).
  """
  name: str
  kind: str
  factory: Any = None
  optimizer: Any = None
  source: Any = None

  @property
  def tuned(self) -> bool:
    return self.kind == "factory"


def _registered(name: str) -> Any:
  from metafam._registry import lookup
  from metafam.optimizers.optax_zoo import OPTAX_FACTORIES
  from metafam.pretrained import PRETRAINED, optax_transform
  if name in PRETRAINED:
    def pretrained(learning_rate, num_steps):
      return optax_transform(name, learning_rate, num_steps=num_steps)
    pretrained.__name__ = name
    return schedule_factory(pretrained)
  from metafam._registry import UnknownNameError
  try:
    return schedule_factory(lookup(OPTAX_FACTORIES, name, "optimizer") if name in OPTAX_FACTORIES else
                            lookup({**OPTAX_FACTORIES, **PRETRAINED}, name, "optimizer"))
  except UnknownNameError as e:
    raise ValueError(f"{e}; or give a factory as module:function (e.g. optax.contrib:prodigy).") from None


def import_factory(path: str, argument: str = "--optimizer") -> Callable[..., Any]:
  """The callable named by ``"package.module:function"`` (the user's code: importing it runs it, as ``python -m``
  would), with one-line errors for a missing module or attribute."""
  module_name, _, attr = path.partition(":")
  if not module_name or not attr:
    raise ValueError(f"{argument} {path!r}: expected a registered name or module:function.")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"{argument} {path!r}: cannot import {module_name!r} ({e}).") from None
  obj = module
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise ValueError(f"{argument} {path!r}: {module_name!r} has no attribute {attr!r}.")
    obj = getattr(obj, part)
  if not callable(obj):
    kind = type(obj).__name__
    raise ValueError(f"{argument} {path!r} is {'an' if kind[:1] in 'aeiou' else 'a'} {kind}, not a callable.")
  return obj


ACCEPTED = ("a factory lr -> optax.GradientTransformation, metafam.benchmark.schedule_factory(f), a registered "
            "optimizer name, an optax transformation with name=..., a metafam Optimizer or a (LearnedOptimizer, "
            "theta or checkpoint path) pair")


def resolve(candidate: Any, name: Optional[str] = None, baselines: Sequence[str] = (),
            argument: str = "candidate") -> Candidate:
  """The `Candidate` of what was given (module docstring), checked; a label in ``baselines`` gets
  `CANDIDATE_SUFFIX`. Raises ValueError (one line) for anything else."""
  from metafam.benchmark.runner import _is_learned_pair
  if name is not None and (not isinstance(name, str) or not name.strip()):
    raise ValueError(f"name must be a non-empty string, got {name!r}.")
  if isinstance(candidate, str):
    factory = import_factory(candidate, argument) if ":" in candidate else _registered(candidate)
    if ":" in candidate:
      check_factory(factory, argument)
    result = Candidate(name or candidate.rpartition(":")[2], "factory", factory=factory, source=candidate)
  elif isinstance(candidate, optax.GradientTransformation):
    if name is None:
      raise ValueError(f"{argument} is a whole optax transformation, scored untuned at its own settings: give it a "
                       "name (name='adam-1e-3'), or pass a factory of the learning rate to have it tuned.")
    result = Candidate(name, "fixed", optimizer=candidate, source=candidate)
  elif isinstance(candidate, Optimizer):
    result = Candidate(name or candidate.name, "fixed", optimizer=candidate, source=candidate)
  elif _is_learned_pair(candidate):
    result = Candidate(name or candidate[0].name, "fixed", optimizer=candidate, source=candidate)
  elif isinstance(candidate, LearnedOptimizer):
    raise ValueError(f"{argument} is a LearnedOptimizer without meta-parameters: pass (lopt, theta) or (lopt, "
                     "checkpoint path).")
  elif callable(candidate):
    check_factory(candidate, argument)
    label = getattr(candidate, "__name__", None)
    result = Candidate(name or (label if label and label != "<lambda>" else "candidate"), "factory",
                       factory=candidate, source=candidate)
  else:
    raise ValueError(f"{argument} must be {ACCEPTED}; got {type(candidate).__name__}.")
  if result.name in baselines:
    result = dataclasses.replace(result, name=result.name + CANDIDATE_SUFFIX)
  return result

