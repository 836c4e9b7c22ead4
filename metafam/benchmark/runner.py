"""Benchmarking optimizers on a suite of tasks against learning-rate-tuned baselines.

    from metafam.benchmark import run_benchmark
    result = run_benchmark("small", {"adam-1e-3": optax.adam(1e-3), "lopt": (MLPLOpt(), "run/checkpoint.npz")},
                           num_steps=300, num_seeds=2)

For every task: each tuned baseline (default: Adam) is swept over the learning-rate grid by
`metafam.benchmark.sweep.tune_learning_rate` (rates x seeds vmapped in one program) and its selected rate's curves
join the results as ``"<name>-tuned"``; then every optimizer trains S seeds in one vmapped program
(`metafam.evaluation.train_and_evaluate_vectorized`). All runs of a task share one key, so seed ``s`` starts from
the same initialization and sees the same batches whichever optimizer trains it.

The reference baseline (``reference``, default ``"adam"``) is swept for ``baseline_factor * num_steps`` steps, its
rate selected at ``num_steps``; the longer curve lets `speedup_over_baseline` resolve speedups up to
``baseline_factor`` (beyond that they are capped and flagged). Metrics use the seed-mean normalized loss of
``metric_split`` (default ``test``).
"""

from __future__ import annotations

import dataclasses
import os
import time
import zlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from metafam._registry import lookup
from metafam.evaluation import metrics
from metafam.evaluation.metrics import Aggregate, RunCurves, normalize
from metafam.benchmark.suites import resolve_tasks
from metafam.benchmark.sweep import (DEFAULT_SPLITS, TUNABLE, SweepResult, check_learning_rates,
                                     default_learning_rates, tune_learning_rate)
from metafam._checks import check_positive_int
from metafam.evaluation.evaluate import train_and_evaluate_vectorized
from metafam.inner.runner import check_splits
from metafam.optimizers.base import OptaxOptimizer, Optimizer
from metafam.optimizers.learned import LearnedOptimizer
from metafam.outer_trainers import checkpoint, flax_msgpack
from metafam.tasks.base import Task

TUNED_SUFFIX = "-tuned"


# -- optimizers ---------------------------------------------------------------------------------------------------
def load_theta(path: Union[str, os.PathLike]) -> Any:
  """Meta-parameters from a `metafam.outer_trainers.checkpoint` file holding a MetaTrainState (its ``theta``) or a
  bare theta pytree; leaves come back as numpy arrays in plain containers (see `checkpoint.load`). A
  learned_optimization (flax-msgpack) parameter file is read too (`flax_msgpack.plain_theta`: its ``params``).

  Nothing in the file is executed: legacy pickle checkpoints are refused with the command that converts them, and so
  are meta-parameters with a NaN or an infinity (`checkpoint.CheckpointError` naming the leaf).
  """
  path = os.fspath(path)
  if flax_msgpack.looks_like_msgpack(path):
    theta = flax_msgpack.plain_theta(flax_msgpack.load(path))
  else:
    header, tree = checkpoint.read(path)
    theta = tree["theta"] if header.root_class == "MetaTrainState" else tree
  checkpoint.check_finite(theta, path, "meta-parameter theta")
  return theta


def learned_optimizer(lopt: LearnedOptimizer, theta_or_path: Any) -> Optimizer:
  """``lopt.opt_fn(theta)`` with ``theta`` given or loaded from a checkpoint path (see `load_theta`).

  Raises ValueError if ``theta``'s structure or leaf shapes differ from ``lopt.init``'s (a checkpoint of another
  learned optimizer or configuration).
  """
  if isinstance(theta_or_path, (str, os.PathLike)):
    theta = load_theta(theta_or_path)
  else:
    theta = theta_or_path
  expected = jax.eval_shape(lopt.init, jax.random.key(0))
  got_leaves, got_def = jax.tree.flatten(theta)
  want_leaves, want_def = jax.tree.flatten(expected)
  if got_def != want_def or any(np.shape(g) != w.shape for g, w in zip(got_leaves, want_leaves)):
    raise ValueError(f"theta does not fit {lopt.name}: got structure {got_def} with shapes "
                     f"{[np.shape(g) for g in got_leaves]}, expected {want_def} with {[w.shape for w in want_leaves]}.")
  theta = jax.tree.map(lambda x, w: jnp.asarray(x, w.dtype), theta, expected)
  return lopt.opt_fn(theta)


def learned_optimizer_from_checkpoint(name: str, path: Union[str, os.PathLike]) -> Optimizer:
  """The registered learned optimizer ``name`` with the meta-parameters in ``path`` (`learned_optimizer`), built as it
  was meta-trained: a meta-training checkpoint records the run's recipe, whose ``step_mult`` is passed back (a wrong
  scale would silently change every update); otherwise the library default."""
  from metafam.optimizers.registry import get_learned_optimizer, takes_step_mult
  from metafam.outer_trainers.legacy import stored_identity
  try:
    identity = stored_identity(checkpoint.read_metadata(os.fspath(path)).get("config"))
  except checkpoint.CheckpointError:
    identity = None  # not a meta-training checkpoint: `learned_optimizer` says what it is
  step_mult = identity["recipe"]["step_mult"] if identity else None
  kwargs = {"step_mult": step_mult} if step_mult is not None and takes_step_mult(name) else {}
  return learned_optimizer(get_learned_optimizer(name, **kwargs), path)



def optimizer_by_name(name: str, *, learning_rate: float, checkpoint: Optional[str] = None,
                      names: Tuple[str, str] = ("optimizer", "checkpoint")) -> Dict[str, Optimizer]:
  """``{label: optimizer}``: the registered hand-designed ``name`` at ``learning_rate``, or the registered learned
  ``name`` with the meta-parameters in the file ``checkpoint`` (`learned_optimizer_from_checkpoint`), labelled
  ``name@<the checkpoint's directory>``.

  Raises ValueError (`UnknownNameError` listing both registries for an unknown name) for a checkpoint given with a
  hand-designed optimizer, missing for a learned one, no file (checked first) or not of ``name``; the messages call the two
  arguments ``names`` (the command line passes its flags).
  """
  from metafam.optimizers.registry import HAND_DESIGNED, LEARNED_OPTIMIZERS
  opt_arg, ckpt_arg = names
  make = lookup({**LEARNED_OPTIMIZERS, **HAND_DESIGNED}, name, "optimizer")
  if checkpoint is not None and not os.path.isfile(checkpoint):  # first: a wrong path is the likelier mistake
    raise ValueError(f"{ckpt_arg} {checkpoint!r}: no such file" + (" (it is a directory)." if os.path.isdir(checkpoint)
                                                                 else "."))
  if name in HAND_DESIGNED:
    if checkpoint is not None:
      raise ValueError(f"{ckpt_arg} holds a learned optimizer; use {opt_arg} with one of "
                       f"{', '.join(sorted(LEARNED_OPTIMIZERS))}.")
    opt = make(learning_rate)
    return {opt.name: opt}
  if checkpoint is None:
    raise ValueError(f"{opt_arg}={name} is a learned optimizer: give its meta-parameters with {ckpt_arg}=PATH "
                     "(a checkpoint written by `metafam meta-train`).")
  try:
    opt = learned_optimizer_from_checkpoint(name, checkpoint)
  except ValueError as e:
    raise ValueError(f"{ckpt_arg} does not hold {name} meta-parameters: {e}") from None
  return {f"{name}@{os.path.basename(os.path.dirname(os.path.abspath(checkpoint))) or 'checkpoint'}": opt}

OptimizerSpec = Union[Optimizer, optax.GradientTransformation, Tuple[LearnedOptimizer, Any]]


def _is_learned_pair(obj: Any) -> bool:
  return (isinstance(obj, tuple) and not isinstance(obj, optax.GradientTransformation) and len(obj) == 2
          and isinstance(obj[0], LearnedOptimizer))


def resolve_optimizer(spec: OptimizerSpec) -> Tuple[str, Optimizer]:
  """``(default name, Optimizer)`` for a metafam `Optimizer`, an optax transformation or ``(lopt, theta|path)``."""
  if isinstance(spec, Optimizer):
    return spec.name, spec
  if isinstance(spec, optax.GradientTransformation):
    return "optax", OptaxOptimizer(spec)
  if _is_learned_pair(spec):
    return spec[0].name, learned_optimizer(*spec)
  raise TypeError(f"an optimizer must be a metafam Optimizer, an optax.GradientTransformation or a "
                  f"(LearnedOptimizer, theta or checkpoint path) pair, got {type(spec).__name__}.")


def resolve_optimizers(optimizers: Union[None, Mapping[str, OptimizerSpec], Sequence[OptimizerSpec]]
                       ) -> Dict[str, Optimizer]:
  """Named `Optimizer`s from a mapping (names kept) or a sequence (default names, made unique with ``#2``, ...)."""
  if optimizers is None:
    return {}
  if isinstance(optimizers, Mapping):
    return {str(name): resolve_optimizer(spec)[1] for name, spec in optimizers.items()}
  if isinstance(optimizers, (Optimizer, optax.GradientTransformation)) or _is_learned_pair(optimizers):
    optimizers = [optimizers]
  named: Dict[str, Optimizer] = {}
  for spec in optimizers:
    base, opt = resolve_optimizer(spec)
    name, n = base, 1
    while name in named:
      n += 1
      name = f"{base}#{n}"
    named[name] = opt
  return named


def resolve_tuned(tuned: Union[None, Sequence[str], Mapping[str, Callable]]) -> Dict[str, Callable]:
  """Tuned baselines as ``{name: optax factory}``; names from `metafam.benchmark.sweep.TUNABLE` or given factories."""
  if tuned is None:
    return {}
  if isinstance(tuned, str):
    tuned = [tuned]
  if isinstance(tuned, Mapping):
    return dict(tuned)
  return {t: lookup(TUNABLE, t, "tuned baseline") for t in tuned}  # or pass a mapping name -> optax factory


# -- results ------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RunMetrics:
  """Metrics of one (task, optimizer) run, from the seed-mean normalized ``metric_split`` curve.

  Attributes:
    task, optimizer: names.
    final_loss: normalized loss at the last step (NaN if non-finite).
    best_loss: lowest normalized loss over the eval points.
    speedup: `metrics.speedup_over_baseline` against the reference baseline (NaN without one).
    speedup_capped: True if the baseline never reached the target, so ``speedup`` is a lower bound.
    diverged: any seed's training or eval loss was non-finite.
    learning_rate: the selected rate of a tuned baseline, else None.
  """
  task: str
  optimizer: str
  final_loss: float
  best_loss: float
  speedup: float
  speedup_capped: bool
  diverged: bool
  learning_rate: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class BenchmarkResult:
  """Everything a benchmark run produced.

  Attributes:
    tasks: task names in run order.
    optimizers: optimizer names in column order (tuned baselines first, as ``"<name>-tuned"``).
    runs: ``{task: {optimizer: RunCurves}}`` over ``num_steps`` steps.
    sweeps: ``{task: {baseline name: SweepResult}}``.
    metrics: one `RunMetrics` per (task, optimizer).
    aggregates: ``{optimizer: {"<metric>_<statistic>": Aggregate}}`` over tasks, metrics ``speedup``,
      ``final_loss``; statistics ``median`` and ``iqm``.
    settings: the run's settings (JSON-able).
    wall_time: seconds for the whole benchmark.
  """
  tasks: Tuple[str, ...]
  optimizers: Tuple[str, ...]
  runs: Dict[str, Dict[str, RunCurves]]
  sweeps: Dict[str, Dict[str, SweepResult]]
  metrics: Tuple[RunMetrics, ...]
  aggregates: Dict[str, Dict[str, Aggregate]]
  settings: Dict[str, Any]
  wall_time: float

  def metric(self, task: str, optimizer: str) -> RunMetrics:
    for m in self.metrics:
      if m.task == task and m.optimizer == optimizer:
        return m
    raise KeyError(f"no run of {optimizer!r} on {task!r}.")


def _task_key(root: jax.Array, name: str) -> jax.Array:
  """A per-task key that depends on the task's name, not on its position in the suite."""
  return jax.random.fold_in(root, zlib.crc32(name.encode()) & 0x7FFFFFFF)


def _curves_from_eval(task: Task, name: str, optimizer: str, result: Any, wall_time: float) -> RunCurves:
  eval_losses = {s: np.asarray(v) for s, v in result.eval_losses.items()}
  return RunCurves(task=name, optimizer=optimizer, train_losses=np.asarray(result.train_losses),
                   eval_steps=np.asarray(result.eval_steps), eval_losses=eval_losses,
                   normalized_eval_losses={s: normalize(task, v) for s, v in eval_losses.items()},
                   wall_time=wall_time)


def run_metrics(curves: RunCurves, split: str, reference: Optional[RunCurves] = None) -> RunMetrics:
  """`RunMetrics` of ``curves`` on ``split``, with the speedup against ``reference`` (full-length) if given."""
  mean = curves.mean_curve(split)
  final, best = metrics.final_and_best(mean)
  speedup, capped = float("nan"), False
  if reference is not None:
    s, _ = metrics.paired_speedups(curves.eval_steps, curves.normalized_eval_losses[split], reference.eval_steps,
                                   reference.normalized_eval_losses[split], per_seed=False)
    speedup, capped = s.value, not s.reached
  finite = np.all(np.isfinite(curves.train_losses)) and all(np.all(np.isfinite(v))
                                                             for v in curves.eval_losses.values())
  return RunMetrics(task=curves.task, optimizer=curves.optimizer, final_loss=final, best_loss=best, speedup=speedup,
                    speedup_capped=bool(capped), diverged=not finite, learning_rate=curves.learning_rate)


def aggregate_metrics(rows: Sequence[RunMetrics], optimizers: Sequence[str], num_resamples: int = 1000,
                      confidence: float = 0.95, seed: int = 0) -> Dict[str, Dict[str, Aggregate]]:
  """Median and IQM (with bootstrap CIs) over tasks of ``speedup`` and ``final_loss``, per optimizer."""
  out: Dict[str, Dict[str, Aggregate]] = {}
  for opt in optimizers:
    mine = [r for r in rows if r.optimizer == opt]
    out[opt] = {}
    for metric in ("speedup", "final_loss"):
      values = [getattr(r, metric) for r in mine]
      for stat in metrics.STATISTICS:
        out[opt][f"{metric}_{stat}"] = metrics.aggregate(values, stat, num_resamples, confidence, seed)
  return out


def run_benchmark(tasks: Union[str, Sequence[Union[str, Task]]],
                  optimizers: Union[None, Mapping[str, OptimizerSpec], Sequence[OptimizerSpec]] = None, *,
                  num_steps: int, num_seeds: int = 2, eval_every: Optional[int] = None, eval_batches: int = 4,
                  tuned: Union[None, Sequence[str], Mapping[str, Callable]] = ("adam",),
                  reference: Optional[str] = "adam", learning_rates: Optional[Sequence[float]] = None,
                  baseline_factor: int = 2, tail_fraction: float = 0.1, metric_split: str = "test",
                  splits: Sequence[str] = DEFAULT_SPLITS, seed: int = 0, num_resamples: int = 1000,
                  confidence: float = 0.95, progress: bool = True) -> BenchmarkResult:
  """Runs tuned baselines and ``optimizers`` on ``tasks`` and computes per-run metrics and aggregates.

  Args:
    tasks: a suite name (`metafam.benchmark.suites.SUITES`), a registered task name, or a list of task names and
      `Task` objects.
    optimizers: a mapping name -> optimizer, or a list of optimizers (named by their ``.name``). An optimizer is a
      metafam `Optimizer`, an ``optax.GradientTransformation``, or ``(learned_optimizer, theta)`` where theta may be
      a checkpoint path (a MetaTrainState checkpoint or a bare theta).
    num_steps: updates per run T.
    num_seeds: seeds S, vmapped in one program per run.
    eval_every: updates between evaluations (default ``max(1, num_steps // 20)``).
    eval_batches: batches averaged per split and evaluation.
    tuned: baselines whose learning rate is swept per task: names from `metafam.benchmark.sweep.TUNABLE`
      (``adam``, ``nadamw``, ``sgdm``, ``sgd``) or a mapping name -> optax factory. None: no tuned baselines.
    reference: the tuned baseline the speedup is measured against (must be in ``tuned``; None: no speedups).
    learning_rates: the sweep grid (default 7 log-spaced rates in [1e-4, 1e-1]).
    baseline_factor: the reference is swept for ``baseline_factor * num_steps`` steps (rate still selected at
      ``num_steps``), which resolves speedups up to ``baseline_factor``.
    tail_fraction: rates are scored on the last ``tail_fraction`` of the steps (see `select_best`).
    metric_split: the split of the reported metrics (rates are always selected on ``inner_valid``).
    splits: the evaluated splits (``metric_split`` and ``inner_valid`` are added if missing).
    seed: the root seed; each task's key is ``fold_in(key(seed), crc32(task name))``.
    num_resamples, confidence: the bootstrap of the aggregates.
    progress: show a tqdm bar over (task, optimizer) runs, sweeps included.
  """
  start = time.perf_counter()
  named_tasks = resolve_tasks(tasks)
  opts = resolve_optimizers(optimizers)
  tuned_factories = resolve_tuned(tuned)
  num_steps = check_positive_int("num_steps", num_steps)
  num_seeds = check_positive_int("num_seeds", num_seeds)
  eval_every = check_positive_int("eval_every", eval_every if eval_every is not None else max(1, num_steps // 20))
  baseline_factor = check_positive_int("baseline_factor", baseline_factor)
  lrs = check_learning_rates(default_learning_rates() if learning_rates is None else learning_rates)
  extra = tuple(s for s in (metric_split, "inner_valid") if s not in splits)
  splits = check_splits("splits", tuple(splits) + tuple(dict.fromkeys(extra)))
  if reference is not None and reference not in tuned_factories:
    raise ValueError(f"reference {reference!r} must be one of the tuned baselines {sorted(tuned_factories)}.")
  tuned_names = [f"{t}{TUNED_SUFFIX}" for t in tuned_factories]
  clash = sorted(set(tuned_names) & set(opts))
  if clash:
    raise ValueError(f"optimizer names {clash} clash with the tuned baselines; rename them.")
  if not opts and not tuned_factories:
    raise ValueError("nothing to run: give optimizers and/or tuned baselines.")
  all_names = tuple(tuned_names) + tuple(opts)

  root = jax.random.key(seed)
  runs: Dict[str, Dict[str, RunCurves]] = {}
  sweeps: Dict[str, Dict[str, SweepResult]] = {}
  rows: List[RunMetrics] = []
  bar = tqdm(total=len(named_tasks) * len(all_names), desc="benchmark", unit="run", disable=not progress)
  try:
    for task_name, task in named_tasks:
      key = _task_key(root, task_name)
      runs[task_name], sweeps[task_name] = {}, {}
      for base, factory in tuned_factories.items():
        bar.set_postfix_str(f"{task_name}: tuning {base}")
        horizon = num_steps * (baseline_factor if base == reference else 1)
        sweep = tune_learning_rate(task, factory, lrs, num_steps=horizon, num_seeds=num_seeds, eval_every=eval_every,
                                   eval_batches=eval_batches, key=key, select_at=num_steps,
                                   tail_fraction=tail_fraction, splits=splits, task_name=task_name, name=base)
        sweeps[task_name][base] = sweep
        if sweep.best_index >= 0:
          runs[task_name][f"{base}{TUNED_SUFFIX}"] = sweep.curves(name=f"{base}{TUNED_SUFFIX}").truncated(num_steps)
        bar.update()
      for name, opt in opts.items():
        bar.set_postfix_str(f"{task_name}: {name}")
        t0 = time.perf_counter()
        result = train_and_evaluate_vectorized(task, opt, num_steps, eval_every, eval_batches, num_seeds, key=key,
                                               splits=splits)
        runs[task_name][name] = _curves_from_eval(task, task_name, name, result, time.perf_counter() - t0)
        bar.update()
      ref = None
      if reference is not None and sweeps[task_name][reference].best_index >= 0:
        ref = sweeps[task_name][reference].curves()
      for name in all_names:
        if name in runs[task_name]:
          rows.append(run_metrics(runs[task_name][name], metric_split, ref))
        else:  # a tuned baseline whose every rate diverged
          rows.append(RunMetrics(task_name, name, float("nan"), float("nan"), float("nan"), False, True))
  finally:
    bar.close()

  settings = {"tasks": [n for n, _ in named_tasks], "optimizers": list(all_names), "num_steps": num_steps,
              "num_seeds": num_seeds, "eval_every": eval_every, "eval_batches": eval_batches,
              "tuned": list(tuned_factories), "reference": reference, "learning_rates": lrs.tolist(),
              "baseline_factor": baseline_factor, "tail_fraction": float(tail_fraction), "metric_split": metric_split,
              "selection_split": "inner_valid", "splits": list(splits), "seed": int(seed),
              "num_resamples": int(num_resamples), "confidence": float(confidence),
              "backend": jax.default_backend()}
  return BenchmarkResult(tasks=tuple(n for n, _ in named_tasks), optimizers=all_names, runs=runs, sweeps=sweeps,
                         metrics=tuple(rows),
                         aggregates=aggregate_metrics(rows, all_names, num_resamples, confidence, seed),
                         settings=settings, wall_time=time.perf_counter() - start)
