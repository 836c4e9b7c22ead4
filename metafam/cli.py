"""The `metafam` command line: ``metafam COMMAND [ARGS] [--flags]`` (also ``python -m metafam``).

Commands:
  meta-train           meta-train a learned optimizer on a task family, then compare it with tuned Adam on held-out
                       instances (test split); writes checkpoints, metrics.jsonl, summary.json and PNG plots.
  evaluate             train a task or suite with a named optimizer or a saved learned optimizer; print/save results.
  benchmark            run the benchmark suite: tuned Adam baselines and the given optimizers, tables and plots.
  list                 list the registered tasks, families, optimizers, estimators, recipes and suites.
  convert-checkpoint   convert a legacy pickle checkpoint (``OLD NEW --trust_pickle``) into the current format.
  launch               run meta-train as N local processes of one multi-process run (``--num_processes N --
                       meta-train [flags]``); see `metafam.distributed`.

``metafam --help`` lists the commands; ``metafam COMMAND --help`` lists the command's flags with their defaults.

Bad input (unknown names, non-finite or out-of-range numbers, flags that the command does not take, an output
directory that cannot be written, that holds another run's results or that a live run is using, a corrupted,
legacy or non-finite checkpoint, a run too large for the machine's memory) gets a one-line ``metafam: error: ...``
naming what was wrong and what is accepted, and exit code 2, before any expensive work; no existing file is
changed. The CLI only parses, calls the library and prints.

Exit codes (``EXIT_CODES``): 0 done; 1 an unexpected error (with its traceback); 2 bad input or refused; 3 the
meta-training run went bad (``--max_skipped_steps`` consecutive skipped updates); 74 a file could not be written
(full disk, quota, file-size limit, I/O error: the last checkpoint is intact); 75 stopped by SIGTERM / SIGINT after
writing a checkpoint (run the same command again to resume).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from absl import flags

from metafam._registry import UnknownNameError, lookup

FLAGS = flags.FlagValues()

EXIT_CODES = {"done": 0, "error": 1, "bad input": 2, "diverged": 3, "write failed": 74, "preempted": 75}

ESTIMATORS = ("pes", "nres", "truncated_es", "full_es", "tbptt")
INT32_MAX = 2 ** 31 - 1
MAX_LANES = 2 ** 16  # antithetic pairs, evaluation instances: far beyond what fits in memory for any built-in task


def _int(name: str, default: int, help_text: str, lower: int = 1, upper: int = INT32_MAX) -> None:
  flags.DEFINE_integer(name, default, help_text, lower_bound=lower, upper_bound=upper, flag_values=FLAGS)


def _float(name: str, default: float, help_text: str, lower: float) -> None:
  """A float flag that also refuses NaN and infinities (which pass any bound check)."""
  flags.DEFINE_float(name, default, help_text, lower_bound=lower, flag_values=FLAGS)
  flags.register_validator(name, lambda v: v is None or math.isfinite(v), message="must be a finite number",
                           flag_values=FLAGS)


# meta-train
flags.DEFINE_string("family", "fmnist_mlp_family_8x8_32", "Registered task family to meta-train on.", flag_values=FLAGS)
flags.DEFINE_string("recipe", None, "A meta-training recipe: a shipped one (generalist) or a recipe JSON file "
                    "(metafam.outer_trainers.recipes). It sets the learned optimizer, the families (one estimator "
                    "each), the estimator, the trajectory lengths and the meta-optimizer, so it excludes --family, "
                    "--optimizer, --estimator and --trajectory_length; --num_steps, --num_pairs, --unroll_length, "
                    "--sigma, --step_mult and the meta-optimizer flags override its values when given.",
                    flag_values=FLAGS)
flags.DEFINE_string("optimizer", "adafac_muon_mlp_lopt", "Optimizer: a registered learned optimizer, or for "
                    "evaluate/benchmark a hand-designed one (`metafam list` names both).", flag_values=FLAGS)
flags.DEFINE_string("estimator", "nres", f"Meta-gradient estimator, one of {ESTIMATORS}.", flag_values=FLAGS)
_int("num_steps", 6000, "Meta-training steps (total; a resumed run continues to this count).")
_int("num_pairs", 8, "Antithetic pairs (ES estimators) or lanes (tbptt).", upper=MAX_LANES)
_int("unroll_length", 10, "Inner steps per truncation.")
_int("trajectory_length", 200, "Inner steps per trajectory (full_es: per estimate); train on the horizon you "
     "evaluate on (--eval_steps).")
_float("sigma", 0.01, "ES perturbation standard deviation.", lower=1e-12)
flags.DEFINE_enum("perturbation", "full", ["full", "low_rank"], "ES noise of the matrix meta-parameters: full "
                  "Gaussian, or low_rank (rank --perturbation_rank factors, applied as shared weights plus per-lane "
                  "factors; same covariance). Recorded in the checkpoint.", flag_values=FLAGS)
_int("perturbation_rank", 1, "Factor rank of --perturbation low_rank.", upper=4096)
_float("step_mult", 1e-2, "Scale of the learned optimizer's steps, for the optimizers that have one (mlp_lopt, "
       "adafac_mlp_lopt, adafac_muon_mlp_lopt, mlp_nom_lopt, rnn_mlp_lopt; their library default is 1e-3, and 1e-2 "
       "meta-trains faster here; for adafac_muon_rms_lopt it is the learning rate, the RMS of every step); recorded "
       "in the checkpoint, and `evaluate --checkpoint` rebuilds the optimizer with it.", lower=1e-12)
_float("meta_learning_rate", 3e-3, "Adam learning rate of the meta-optimizer.", lower=1e-12)
_int("meta_lr_decay_steps", 6000, "Meta-learning-rate schedule: linear warmup over the first min(100, N // 10) "
     "meta-steps, cosine decay to 0.1x at meta-step N, constant after (0: a constant rate).", lower=0)
_float("clip_grad_norm", 1.0, "Clip meta-gradients to this global norm (0: no clipping).", lower=0.0)
flags.DEFINE_string("output_dir", None, "Output directory (default runs/<command>): checkpoints, logs, tables, plots.",
                    flag_values=FLAGS)
_int("checkpoint_every", 50, "Meta-steps between checkpoints (SIGTERM / SIGINT also write one, at the step in "
     "flight).")
_int("max_skipped_steps", 50, "Stop (exit code 3) after this many consecutive meta-steps whose update was skipped "
     "because no estimate was finite (0: never stop).", lower=0)
_int("eval_every", 0, "Meta-steps between evaluations during training (0: only at the end).", lower=0)
_int("eval_tasks", 16, "Held-out task instances per evaluation (the speedup interval is over these).",
     upper=MAX_LANES)
_int("eval_steps", 200, "Inner steps per evaluation.")
_int("seed", 0, "Random seed of the run (0 to 2**31 - 1).", lower=0)
_int("devices", 1, "Spread the estimator's lanes over this many devices (on CPU: cores; JAX is asked for that many "
     "CPU devices), and the evaluation instances when --eval_tasks divides evenly. Same numbers up to float "
     "rounding, usually faster; the lanes must divide evenly.", upper=4096)
_int("num_processes", 1, "Processes of a multi-process run (jax.distributed): the lanes are split over the devices "
     "of all of them. Start one process per --process_id with the same flags, or use `metafam launch`.",
     upper=MAX_LANES)
_int("process_id", 0, "This process's index in [0, --num_processes); process 0 hosts the coordinator and writes "
     "all files.", lower=0, upper=MAX_LANES)
flags.DEFINE_string("coordinator", None, "HOST:PORT of process 0 (reachable from every process) for "
                    "--num_processes > 1, or 'auto' to read the cluster's environment (SLURM, Open MPI, ...).",
                    flag_values=FLAGS)
_int("coordinator_timeout", 60, "Seconds a process waits for the coordinator and for every process to join.",
     upper=86400)
flags.DEFINE_bool("tensorboard", False, "Also log to TensorBoard (needs tensorboardX: pip install 'metafam[tb]').",
                  flag_values=FLAGS)
flags.DEFINE_bool("progress", True, "Show progress bars.", flag_values=FLAGS)
# evaluate / benchmark
flags.DEFINE_string("task", None, "A registered task name (instead of --suite).", flag_values=FLAGS)
flags.DEFINE_string("suite", "tiny", "A benchmark suite name.", flag_values=FLAGS)
flags.DEFINE_string("checkpoint", None, "A meta-train checkpoint (its learned optimizer is evaluated).",
                    flag_values=FLAGS)
_float("learning_rate", 1e-3, "Learning rate of a hand-designed optimizer.", lower=1e-12)
_int("inner_steps", 200, "Inner training steps per task.")
_int("seeds", 2, "Seeds per task.", upper=MAX_LANES)
flags.DEFINE_bool("overwrite", False, "Replace the results of an earlier evaluate/benchmark in --output_dir.",
                  flag_values=FLAGS)
# convert-checkpoint
flags.DEFINE_bool("trust_pickle", False, "Confirm that the legacy pickle checkpoint comes from a trusted source "
                  "(unpickling it can run arbitrary code).", flag_values=FLAGS)

_SUITE_FLAGS = ("task", "suite", "optimizer", "checkpoint", "learning_rate", "inner_steps", "seeds", "seed",
                "output_dir", "overwrite", "progress")
COMMANDS: Dict[str, Dict[str, Any]] = {
    "meta-train": dict(
        summary="meta-train a learned optimizer on a task family, then compare it with tuned Adam on held-out "
                "instances; run it again to resume",
        args=(), flags=("family", "recipe", "optimizer", "estimator", "num_steps", "num_pairs", "unroll_length",
                        "trajectory_length", "sigma", "perturbation", "perturbation_rank", "step_mult",
                        "meta_learning_rate", "meta_lr_decay_steps", "clip_grad_norm", "output_dir",
                        "checkpoint_every", "max_skipped_steps", "eval_every", "eval_tasks", "eval_steps",
                        "seed", "devices", "num_processes", "process_id", "coordinator", "coordinator_timeout",
                        "tensorboard", "progress")),
    "evaluate": dict(summary="train a task or suite with one optimizer (hand-designed, or learned from a "
                             "checkpoint) and save the results", args=(), flags=_SUITE_FLAGS),
    "benchmark": dict(summary="tuned Adam and SGDM baselines (and optionally one more optimizer) on a suite: "
                              "tables, speedups and plots", args=(), flags=_SUITE_FLAGS),
    "list": dict(summary="list the registered tasks, families, optimizers, estimators, recipes and suites", args=(),
                 flags=()),
    "convert-checkpoint": dict(summary="convert a legacy pickle checkpoint into the current format (unpickling "
                                       "runs code: only for files you trust)", args=("OLD", "NEW"),
                               flags=("trust_pickle",)),
    "launch": dict(summary="run a command as --num_processes local processes of one multi-process run: "
                           "`metafam launch --num_processes 2 -- meta-train [flags]`", args=("COMMAND [ARGS]",),
                   flags=("num_processes",)),
}
HELP_ARGS = ("--help", "-h", "--helpfull", "--helpshort", "-help")


class UsageError(Exception):
  """Bad input: reported as one line with exit code 2."""


def _lookup(table: Mapping[str, Any], name: str, what: str) -> Any:
  """`metafam._registry.lookup`, with an unknown name reported as a UsageError (the registry's message)."""
  try:
    return lookup(table, name, what)
  except UnknownNameError as e:
    raise UsageError(str(e)) from None


# -- help ------------------------------------------------------------------------------------------------------------
def usage() -> str:
  """``metafam --help``: the commands."""
  width = max(map(len, COMMANDS)) + 2
  lines = ["usage: metafam COMMAND [ARGS] [--flag=value ...]", "", "commands:"]
  lines += [f"  {name:<{width}} {spec['summary']}" for name, spec in COMMANDS.items()]
  lines += ["", "`metafam COMMAND --help` lists a command's flags and their defaults."]
  return "\n".join(lines)


def command_usage(command: str) -> str:
  """``metafam COMMAND --help``: what the command does and each of its flags with its default."""
  spec = COMMANDS[command]
  args = "".join(f" {a}" for a in spec["args"])
  lines = [f"usage: metafam {command}{args} [--flag=value ...]", "", spec["summary"] + ".", ""]
  if not spec["flags"]:
    lines.append("(no flags)")
  for name in spec["flags"]:
    flag = FLAGS[name]
    default = "none" if flag.default is None else flag.default_as_str.strip("'")
    lines.append(f"  --{name}={default}")
    lines.append(f"      {flag.help}")
  return "\n".join(lines)


# -- builders --------------------------------------------------------------------------------------------------------
def learned_optimizers() -> Mapping[str, Callable]:
  from metafam.optimizers.registry import LEARNED_OPTIMIZERS
  return LEARNED_OPTIMIZERS


def hand_optimizers() -> Mapping[str, Callable]:
  from metafam.optimizers.registry import HAND_DESIGNED
  return HAND_DESIGNED


def build_estimator(name: str, family, lopt, *, num_pairs: int, unroll_length: int, trajectory_length: int,
                    sigma: float, devices: Any = None, perturbation: str = "full", perturbation_rank: int = 1):
  """The estimator ``name`` on ``num_pairs`` lanes per particle; of the other values it gets those it accepts."""
  from metafam.inner import ConstantSchedule
  from metafam.outer_trainers.registry import estimator_arguments, make_estimator
  values = dict(unroll_length=unroll_length, trajectory_length=trajectory_length, sigma=sigma,
                perturbation=perturbation, rank=perturbation_rank)
  accepted = estimator_arguments(name)
  return make_estimator(name, family, lopt, num_tasks=num_pairs, schedule=ConstantSchedule(trajectory_length),
                        devices=devices, **{k: v for k, v in values.items() if k in accepted})


RUN_CONFIG_KEYS = ("family", "optimizer", "estimator", "num_pairs", "unroll_length", "trajectory_length", "sigma",
                   "meta_learning_rate", "meta_lr_decay_steps", "clip_grad_norm", "seed", "step_mult")


def run_config(values: Mapping[str, Any]) -> Dict[str, Any]:
  """What identifies a meta-training run (``RUN_CONFIG_KEYS`` of the flag ``values``): resuming with a different
  value of any of these is refused."""
  config = {k: values[k] for k in RUN_CONFIG_KEYS}
  if not takes_step_mult(values["optimizer"]):
    config["step_mult"] = None
  if values.get("perturbation", "full") != "full":  # absent for full noise: runs from before the flag resume
    config.update(perturbation=values["perturbation"], perturbation_rank=values["perturbation_rank"])
  return config


def takes_step_mult(name: str) -> bool:
  """Whether the registered learned optimizer ``name`` has a ``step_mult`` argument."""
  import inspect
  make = learned_optimizers().get(name)
  return make is not None and "step_mult" in inspect.signature(make).parameters


def learned_optimizer_kwargs(name: str, step_mult: Optional[float]) -> Dict[str, Any]:
  """The constructor arguments the CLI gives the learned optimizer ``name``."""
  return {"step_mult": step_mult} if step_mult is not None and takes_step_mult(name) else {}


# -- output directories ----------------------------------------------------------------------------------------------
def _output_dir(command: str, output_dir: Optional[str]) -> str:
  """``output_dir`` if given, else ``runs/<command>``."""
  return output_dir if output_dir is not None else os.path.join("runs", command.replace("-", "_"))


def check_output_dir(path: str) -> None:
  """Refuses, without creating anything, an output directory that is a file or lies under one, or whose nearest
  existing ancestor is not writable."""
  if not path:
    raise UsageError("--output_dir must not be empty.")
  if os.path.exists(path) and not os.path.isdir(path):
    raise UsageError(f"--output_dir {path!r} exists and is not a directory.")
  ancestor = os.path.abspath(path)
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  if not os.path.isdir(ancestor):
    raise UsageError(f"--output_dir {path!r} cannot be created: {ancestor!r} is a file, not a directory.")
  if not os.access(ancestor, os.W_OK | os.X_OK):
    raise UsageError(f"--output_dir {path!r} is not writable ({ancestor!r} denies writing).")


def make_output_dir(path: str) -> None:
  """Creates ``path`` and proves it writable with a probe file (removed again), before any expensive work."""
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as e:
    raise UsageError(f"--output_dir {path!r} cannot be written ({e.strerror or e}).") from None


def check_not_in_use(path: str) -> None:
  """Refuses, changing nothing, an output directory whose lock a live metafam process holds."""
  from metafam.io import DirectoryBusyError, DirectoryLock
  try:
    DirectoryLock.check_free(path)
  except DirectoryBusyError as e:
    raise UsageError(f"--output_dir {e}") from None


def lock_output_dir(path: str):
  """Creates the output directory (`make_output_dir`) and holds its `metafam.io.DirectoryLock` for the whole
  command (UsageError if a live run holds it)."""
  import contextlib
  from metafam.io import DirectoryBusyError, DirectoryLock

  @contextlib.contextmanager
  def held():
    make_output_dir(path)
    try:
      lock = DirectoryLock(path).acquire()
    except DirectoryBusyError as e:
      raise UsageError(f"--output_dir {e}") from None
    try:
      yield lock
    finally:
      lock.release()
  return held()


def _check_no_earlier_results(path: str, overwrite: bool) -> None:
  from metafam.benchmark.report import existing_report_files
  found = existing_report_files(path) if os.path.isdir(path) else ()
  if found and not overwrite:
    raise UsageError(f"--output_dir {path!r} already holds results ({', '.join(found)}); pass --overwrite to "
                     "replace them, or choose another --output_dir.")


# -- commands --------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SuiteArgs:
  """What evaluate and benchmark run, from their flags (``*_given``: whether the flag was on the command line)."""
  task: Optional[str]
  suite: str
  suite_given: bool
  optimizer: str
  optimizer_given: bool
  checkpoint: Optional[str]
  learning_rate: float
  inner_steps: int
  seeds: int
  seed: int
  output_dir: Optional[str]
  overwrite: bool
  progress: bool

  @classmethod
  def from_flags(cls, flag_values: flags.FlagValues) -> "SuiteArgs":
    given = {f"{name}_given": flag_values[name].present for name in ("suite", "optimizer")}
    return cls(**{f.name: flag_values[f.name].value for f in dataclasses.fields(cls) if not f.name.endswith("_given")},
               **given)


def select_tasks(task: Optional[str], suite: str, suite_given: bool) -> str:
  """The registered task or suite name to run (``task`` wins, but not together with a given ``suite``)."""
  from metafam.benchmark.suites import SUITES
  from metafam.tasks.registry import TASKS
  if task is not None:
    if suite_given:
      raise UsageError("give --task or --suite, not both.")
    _lookup(TASKS, task, "task")
    return task
  _lookup(SUITES, suite, "suite")
  return suite


def build_optimizers(name: str, *, learning_rate: float, checkpoint: Optional[str]) -> Dict[str, Any]:
  """``{label: optimizer}``: the hand-designed ``name`` at ``learning_rate``, or the learned ``name`` with the
  meta-parameters in ``checkpoint``."""
  learned, hand = learned_optimizers(), hand_optimizers()
  make = _lookup({**learned, **hand}, name, "optimizer")
  if name in hand:
    if checkpoint is not None:
      raise UsageError(f"--checkpoint holds a learned optimizer; use --optimizer with one of "
                       f"{', '.join(sorted(learned))}.")
    opt = make(learning_rate)
    return {opt.name: opt}
  if checkpoint is None:
    raise UsageError(f"--optimizer={name} is a learned optimizer: give its meta-parameters with --checkpoint=PATH "
                     "(a checkpoint written by `metafam meta-train`).")
  if not os.path.isfile(checkpoint):
    raise UsageError(f"--checkpoint {checkpoint!r} is not a file.")
  from metafam.benchmark.runner import learned_optimizer
  from metafam.outer_trainers import checkpoint as checkpoints
  # The optimizer as meta-trained: a meta-train checkpoint records its step_mult, inside its recipe for a --recipe
  # run (absent: the library default).
  try:
    config = checkpoints.read_metadata(checkpoint).get("config") or {}
  except checkpoints.CheckpointError:
    config = {}  # not a meta-train checkpoint: learned_optimizer below says what it is
  step_mult = config.get("step_mult", (config.get("recipe") or {}).get("step_mult"))
  try:
    opt = learned_optimizer(make(**learned_optimizer_kwargs(name, step_mult)), checkpoint)
  except ValueError as e:
    raise UsageError(f"--checkpoint does not hold {name} meta-parameters: {e}") from None
  return {f"{name}@{os.path.basename(os.path.dirname(os.path.abspath(checkpoint))) or 'checkpoint'}": opt}


def _run_suite(command: str, args: SuiteArgs, required: bool, tuned, reference) -> None:
  from metafam.benchmark import print_report, run_benchmark, write_report
  tasks = select_tasks(args.task, args.suite, args.suite_given)
  out_dir = _output_dir(command, args.output_dir)
  check_output_dir(out_dir)
  check_not_in_use(out_dir)
  _check_no_earlier_results(out_dir, args.overwrite)
  optimizers = {}
  if required or args.optimizer_given or args.checkpoint is not None:
    optimizers = build_optimizers(args.optimizer, learning_rate=args.learning_rate, checkpoint=args.checkpoint)
  with lock_output_dir(out_dir):
    start = time.perf_counter()
    result = run_benchmark(tasks, optimizers, num_steps=args.inner_steps, num_seeds=args.seeds, tuned=tuned,
                           reference=reference, seed=args.seed, progress=args.progress)
    print_report(result)
    files = write_report(result, out_dir)
  names = [files.results_csv, files.tuned_csv, files.aggregates_csv, files.json, *files.figures]
  print(f"\n{command} took {time.perf_counter() - start:.1f} s; wrote {out_dir}: "
        + ", ".join(os.path.basename(p) for p in names)
        + (f" ({files.figures_skipped})" if files.figures_skipped else ""))


def cmd_evaluate() -> None:
  _run_suite("evaluate", SuiteArgs.from_flags(FLAGS), required=True, tuned=None, reference=None)


def build_heldout_candidate(args: SuiteArgs, flag_values: flags.FlagValues) -> Any:
  """The candidate of ``benchmark --suite heldout``: a tunable hand-designed name (its rate is tuned on the grid)
  or a learned optimizer with --checkpoint; flags that the suite fixes are refused."""
  from metafam.benchmark.sweep import TUNABLE
  fixed = [f"--{n}" for n in ("task", "inner_steps", "seeds", "learning_rate", "seed") if flag_values[n].present]
  if fixed:
    raise UsageError(f"{', '.join(fixed)}: the heldout suite fixes its tasks, horizons, seeds and keys, and tunes a "
                     "hand-designed optimizer's learning rate itself; drop these flags.")
  if not args.optimizer_given and args.checkpoint is None:
    raise UsageError("--suite heldout needs --optimizer (a hand-designed name, tuned on the rate grid, or a learned "
                     "optimizer with --checkpoint).")
  if args.optimizer in learned_optimizers() or args.checkpoint is not None:
    return next(iter(build_optimizers(args.optimizer, learning_rate=args.learning_rate,
                                      checkpoint=args.checkpoint).items()))
  _lookup({**TUNABLE, **learned_optimizers()}, args.optimizer, "optimizer")
  return args.optimizer, args.optimizer


def _run_heldout(args: SuiteArgs) -> None:
  from metafam.benchmark.heldout import (NormalizerFileError, baseline_evaluations, evaluate_suite, format_suite,
                                         load_normalizers, write_suite_report)
  name, candidate = build_heldout_candidate(args, FLAGS)
  out_dir = _output_dir("benchmark", args.output_dir)
  check_output_dir(out_dir)
  check_not_in_use(out_dir)
  _check_no_earlier_results(out_dir, args.overwrite)
  try:
    data = load_normalizers()
  except NormalizerFileError as e:
    raise UsageError(str(e)) from None
  if not data["tasks"]:
    raise UsageError(f"the normalizer file has no complete task yet (pending: {', '.join(data['pending'])}).")
  with lock_output_dir(out_dir):
    result = evaluate_suite(candidate, data=data, name=name, progress=args.progress)
    baselines = baseline_evaluations(data)
    print(format_suite(result, baselines))
    paths = write_suite_report(result, out_dir, baselines)
  print(f"\nbenchmark took {result.wall_time:.1f} s; wrote {out_dir}: "
        + ", ".join(os.path.basename(p) for p in paths))


def cmd_benchmark() -> None:
  args = SuiteArgs.from_flags(FLAGS)
  if args.suite == "heldout" and args.suite_given:
    _run_heldout(args)
    return
  _run_suite("benchmark", args, required=False, tuned=("adam", "sgdm"), reference="adam")


def cmd_list() -> None:
  from metafam.taskfamilies.registry import list_families
  from metafam.tasks.registry import list_tasks
  print("tasks:       " + ", ".join(list_tasks()))
  print("families:    " + ", ".join(list_families()))
  print("optimizers:  learned: " + ", ".join(sorted(learned_optimizers())) + "; hand-designed: "
        + ", ".join(sorted(hand_optimizers())))
  print("estimators:  " + ", ".join(ESTIMATORS))
  from metafam.outer_trainers.recipes import list_recipes
  print("recipes:     " + ", ".join(list_recipes()))
  try:
    from metafam.benchmark.suites import SUITES
    print("suites:      " + ", ".join(sorted(SUITES)))
  except ImportError:
    pass


def cmd_convert_checkpoint(old: str, new: str) -> None:
  from metafam.outer_trainers import checkpoint
  if not os.path.isfile(old):
    raise UsageError(f"OLD {old!r} is not a file.")
  if os.path.exists(new):
    raise UsageError(f"NEW {new!r} already exists; choose a path that does not.")
  if not FLAGS.trust_pickle:
    raise UsageError(f"converting {old!r} unpickles it, which runs any code the file contains: pass --trust_pickle "
                     "only if you trust where it came from.")
  parent = os.path.dirname(os.path.abspath(new))
  if not os.path.isdir(parent):
    raise UsageError(f"NEW {new!r}: directory {parent!r} does not exist.")
  checkpoint.convert_legacy_checkpoint(old, new, trust_pickle=True)
  print(f"converted {old} -> {new}")


# Flags that need not agree across the processes of one run (everything else must, see cmd_meta_train).
PER_PROCESS_FLAGS = ("process_id", "progress", "tensorboard", "output_dir")


def process_group():
  """The multi-process placement from --num_processes/--process_id/--coordinator (UsageError if inconsistent)."""
  from metafam import distributed
  try:
    return distributed.ProcessGroup(FLAGS.num_processes, FLAGS.process_id, FLAGS.coordinator,
                                    timeout_s=FLAGS.coordinator_timeout)
  except ValueError as e:
    raise UsageError(f"--num_processes={FLAGS.num_processes} --process_id={FLAGS.process_id} "
                     f"--coordinator={FLAGS.coordinator}: {e}") from None


# What --recipe sets and a flag may not (the recipe's families replace --family), and what a given flag overrides.
RECIPE_EXCLUDES = ("family", "optimizer", "estimator", "trajectory_length")
RECIPE_OVERRIDES = ("num_steps", "num_pairs", "unroll_length", "sigma", "step_mult", "meta_learning_rate",
                    "meta_lr_decay_steps", "clip_grad_norm")


def load_recipe_flags():
  """The recipe of --recipe with the overriding flags applied (UsageError for a bad recipe or excluded flags)."""
  from metafam.outer_trainers.recipes import load_recipe
  excluded = [f"--{name}" for name in RECIPE_EXCLUDES if FLAGS[name].present]
  if excluded:
    raise UsageError(f"--recipe sets the learned optimizer, families, estimator and trajectory lengths; remove "
                     f"{', '.join(excluded)} (or edit a copy of the recipe file).")
  try:
    recipe = load_recipe(FLAGS.recipe)
    return recipe.replace(**{name: FLAGS[name].value for name in RECIPE_OVERRIDES if FLAGS[name].present})
  except ValueError as e:
    raise UsageError(f"--recipe {FLAGS.recipe}: {e}") from None


def check_meta_train_flags() -> Dict[str, Any]:
  """The cheap checks of meta-train's flags (names, output directory, lane split); returns the builders."""
  from metafam.taskfamilies.registry import FAMILIES
  if FLAGS.recipe is not None:
    recipe = load_recipe_flags()
    found = dict(recipe=recipe, lopt=_lookup(learned_optimizers(), recipe.optimizer, "learned optimizer"))
    estimator, num_pairs = recipe.estimator, recipe.num_pairs
  else:
    found = dict(family=_lookup(FAMILIES, FLAGS.family, "family"),
                 lopt=_lookup(learned_optimizers(), FLAGS.optimizer, "learned optimizer (--optimizer)"))
    _lookup(dict.fromkeys(ESTIMATORS), FLAGS.estimator, "estimator")
    estimator, num_pairs = FLAGS.estimator, FLAGS.num_pairs
  if FLAGS.perturbation != "full" and estimator == "tbptt":
    raise UsageError("--perturbation low_rank: --estimator tbptt perturbs nothing; use an ES estimator.")
  if FLAGS["perturbation_rank"].present and FLAGS.perturbation == "full":
    raise UsageError("--perturbation_rank applies to --perturbation low_rank.")
  if FLAGS["step_mult"].present and FLAGS.recipe is None and not takes_step_mult(FLAGS.optimizer):
    raise UsageError(f"--step_mult: --optimizer={FLAGS.optimizer} has no step_mult; it applies to "
                     f"{', '.join(n for n in sorted(learned_optimizers()) if takes_step_mult(n))}.")
  group = process_group()
  if group.process_id == 0:
    check_output_dir(_output_dir("meta-train", FLAGS.output_dir))
    check_not_in_use(_output_dir("meta-train", FLAGS.output_dir))
  total = FLAGS.num_processes * FLAGS.devices
  if FLAGS.num_processes > 1 and num_pairs % total:
    raise UsageError(f"--num_pairs {num_pairs} lanes cannot be split evenly over --num_processes "
                     f"{FLAGS.num_processes} x --devices {FLAGS.devices} = {total} devices; use a multiple of {total}.")
  if FLAGS.tensorboard:
    _require_tensorboard()
  return dict(found, group=group)


def cmd_meta_train() -> None:
  checked = check_meta_train_flags()
  out_dir = _output_dir("meta-train", FLAGS.output_dir)
  config = run_config(FLAGS.flag_values_dict())

  from metafam import distributed
  distributed.initialize(checked["group"])  # before JAX is used: joins the other processes (no-op for one)
  distributed.check_same_everywhere(
      {name: FLAGS[name].value for name in COMMANDS["meta-train"]["flags"] if name not in PER_PROCESS_FLAGS},
      what="meta-train flags")
  main_process = distributed.is_main_process()

  import jax
  from metafam.outer_trainers import MetaTrainer, meta_optimizer
  num_devices = jax.device_count() if checked["group"].distributed else FLAGS.devices
  devices = num_devices if num_devices > 1 else None
  import contextlib
  if "recipe" in checked:
    recipe = checked["recipe"]
    # The run's identity: the recipe less its length (a run may be continued to more meta-steps) and its prose
    # description, and the seed.
    config = {"recipe": {k: v for k, v in recipe.to_dict().items() if k not in ("num_steps", "description")},
              "seed": FLAGS.seed}
    if FLAGS.perturbation != "full":
      config.update(perturbation=FLAGS.perturbation, perturbation_rank=FLAGS.perturbation_rank)
    try:
      lopt, trainer = recipe.build(devices=devices, perturbation=FLAGS.perturbation, rank=FLAGS.perturbation_rank,
                                   eval_num_tasks=FLAGS.eval_tasks, eval_steps=FLAGS.eval_steps, config=config)
    except ValueError as e:
      if devices is None:
        raise
      raise UsageError(f"--devices {FLAGS.devices}: {e}") from None
    with lock_output_dir(out_dir) if main_process else contextlib.nullcontext():
      _meta_train(trainer, lopt, out_dir, config, main_process, recipe.num_steps)
    return
  family, lopt = checked["family"](), checked["lopt"](**learned_optimizer_kwargs(FLAGS.optimizer, FLAGS.step_mult))
  try:
    estimator = build_estimator(FLAGS.estimator, family, lopt, num_pairs=FLAGS.num_pairs,
                                unroll_length=FLAGS.unroll_length, trajectory_length=FLAGS.trajectory_length,
                                sigma=FLAGS.sigma, devices=devices, perturbation=FLAGS.perturbation,
                                perturbation_rank=FLAGS.perturbation_rank)
  except ValueError as e:
    if devices is None:  # not about devices: the flags are validated, so this is a bug worth a traceback
      raise
    raise UsageError(f"--devices {FLAGS.devices}: {e}") from None  # lanes do not split evenly, or too few devices
  trainer = MetaTrainer(lopt, [estimator], meta_optimizer(FLAGS.meta_learning_rate, FLAGS.meta_lr_decay_steps),
                        clip_grad_norm=FLAGS.clip_grad_norm or None, eval_family=family,
                        eval_num_tasks=FLAGS.eval_tasks, eval_steps=FLAGS.eval_steps, config=config)
  with lock_output_dir(out_dir) if main_process else contextlib.nullcontext():
    _meta_train(trainer, lopt, out_dir, config, main_process, FLAGS.num_steps)


def _meta_train(trainer, lopt, out_dir: str, config: Dict[str, Any], main_process: bool, num_steps: int) -> None:
  """meta-train after its checks, with the output directory locked (process 0)."""
  import jax
  from metafam import distributed
  from metafam.outer_trainers.meta_trainer import CHECKPOINT_NAME, METRICS_NAME, WriteFailedError
  log_fn = _tensorboard_logger(out_dir) if FLAGS.tensorboard and main_process else None
  key = jax.random.key(FLAGS.seed)
  start = time.perf_counter()
  state, _ = trainer.train(num_steps, key=key, output_dir=out_dir,
                           checkpoint_every=FLAGS.checkpoint_every, eval_every=FLAGS.eval_every or None,
                           progress=FLAGS.progress and main_process, log_fn=log_fn, handle_signals=True,
                           max_skipped_steps=FLAGS.max_skipped_steps or None, lock_output_dir=False)
  train_seconds = time.perf_counter() - start
  # Host copies of the thetas to compare: process 0 evaluates alone, so no array of a multi-process mesh may enter
  # its programs (placing the initial theta on that mesh is itself a collective: every process takes part).
  thetas = {"learned (init)": distributed.to_host(trainer.initial_theta(key)),
            "learned (final)": distributed.to_host(state.theta)}
  if not main_process:
    print(f"process {jax.process_index()}/{jax.process_count()}: meta-training reached step {int(state.step)}; "
          "process 0 evaluates and writes the results.")
    return

  # The held-out report: fresh instances (test split), the learned optimizer before and after meta-training against
  # Adam at the learning rate tuned on inner_valid, with per-instance speedups and their bootstrap interval.
  from metafam.evaluation.comparison import compare_with_tuned_adam
  from metafam.evaluation.report import meta_train_totals, write_meta_train_report
  from metafam.outer_trainers.meta_trainer import read_metrics
  comparison = compare_with_tuned_adam(trainer.evaluator, lopt, thetas, jax.random.key(FLAGS.seed + 1_000_003),
                                       min_tasks=1)
  metrics_path = os.path.join(out_dir, METRICS_NAME)
  history = read_metrics(metrics_path) if os.path.exists(metrics_path) else []
  try:
    written = write_meta_train_report(out_dir, history, comparison, config, meta_steps=int(state.step),
                                      train_seconds=train_seconds,
                                      inner_steps_per_meta_step=trainer.inner_steps_per_meta_step)
  except OSError as e:  # the run itself is checkpointed: only the report is missing
    raise WriteFailedError(getattr(e, "filename", None) or out_dir, e, os.path.join(out_dir, CHECKPOINT_NAME),
                           int(state.step)) from e
  totals = meta_train_totals(history, int(state.step), trainer.inner_steps_per_meta_step)
  print(f"\nmeta-steps: {int(state.step)}; meta-step time over all sessions: "
        f"{totals['meta_step_seconds_total']:.0f} s (this session {train_seconds:.0f} s); inner steps: "
        f"{totals['inner_steps_total']:,} ({trainer.inner_steps_per_meta_step:,} per meta-step)")
  print("\n" + comparison.format_table())
  plots = [name for name in written if name.endswith(".png")]
  print(f"\nwrote {os.path.join(out_dir, written[0])}, {METRICS_NAME}, {CHECKPOINT_NAME}"
        + (", " + ", ".join(plots) if plots else " (install matplotlib for PNG plots: pip install 'metafam[plot]')"))


def cmd_launch(*argv: str) -> int:
  """Runs ``metafam ARGV`` as --num_processes local processes (127.0.0.1, a free port); returns their exit code."""
  from metafam import distributed
  num_processes = FLAGS.num_processes
  if not argv or argv[0] != "meta-train":
    raise UsageError(f"launch runs meta-train (`metafam launch --num_processes N -- meta-train [flags]`); got "
                     f"{' '.join(argv) or 'nothing'}.")
  taken = sorted({a.lstrip("-").split("=")[0] for a in argv[1:]} & {"num_processes", "process_id", "coordinator"})
  if taken:
    raise UsageError(f"launch sets --{', --'.join(taken)} itself; remove them from the command after `--`.")
  # Parse the command as process 0 will see it (launch_local adds these flags, with a free port).
  _parse(["metafam", *argv, f"--num_processes={num_processes}", "--coordinator=127.0.0.1:1"])
  check_meta_train_flags()  # one error line here rather than one per process
  return distributed.launch_local(list(argv), num_processes)


def _require_tensorboard() -> None:
  import importlib.util
  if importlib.util.find_spec("tensorboardX") is None:
    raise UsageError("--tensorboard needs tensorboardX: pip install 'metafam[tb]'.")


def _tensorboard_logger(output_dir: str) -> Callable[[Dict[str, Any]], None]:
  from tensorboardX import SummaryWriter
  writer = SummaryWriter(os.path.join(output_dir, "tensorboard"))

  def log(record):
    for k, v in record.items():
      if k != "step" and isinstance(v, (int, float)):
        writer.add_scalar(k, v, record["step"])
    writer.flush()
  return log


def _enable_compilation_cache() -> None:
  """Persists compiled programs across runs (``$METAFAM_JAX_CACHE``, default ~/.cache/metafam/jax; "" disables).

  Compilation dominates short CPU runs; a second run of the same command starts in seconds. Only the command line
  does this: the library never changes JAX's configuration.
  """
  import jax
  path = os.environ.get("METAFAM_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "metafam", "jax"))
  if path and not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _request_cpu_devices(count: int) -> None:
  """Asks JAX for ``count`` CPU devices (one per core to use) before it starts; other platforms are unaffected."""
  if count <= 1:
    return
  import jax
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:  # JAX already started in this process (main() called from a program): keep its devices
    pass


# -- entry point -----------------------------------------------------------------------------------------------------
def _parse(argv: List[str]) -> tuple:
  """``(command, positional args)`` after parsing ``argv``'s flags; raises UsageError for any bad input."""
  FLAGS.unparse_flags()  # main() may run several times in one process (tests)
  try:
    rest = FLAGS(argv)
  except flags.Error as e:
    raise UsageError(str(e)) from None
  words = rest[1:]
  if not words or words[0] not in COMMANDS:
    got = " ".join(words) or "nothing"
    raise UsageError(f"expected one command from {', '.join(COMMANDS)}; got {got}. Try `metafam --help`.")
  command, args = words[0], words[1:]
  expected = COMMANDS[command]["args"]
  if (len(args) != len(expected)) if command != "launch" else not args:
    want = " ".join(expected) or "no arguments"
    raise UsageError(f"{command} takes {want}; got {' '.join(args) or 'none'}. Try `metafam {command} --help`.")
  allowed = COMMANDS[command]["flags"]
  foreign = sorted(name for name in FLAGS if FLAGS[name].present and name not in allowed)
  if foreign:
    raise UsageError(f"{command} does not take --{', --'.join(foreign)}; its flags: "
                     + (", ".join(f"--{f}" for f in allowed) or "none") + ".")
  return command, args


def _help(argv: List[str]):
  """The help text if ``argv`` asks for it (``metafam --help``, ``metafam COMMAND --help``), else None."""
  words = argv[1:]
  if not any(w in HELP_ARGS for w in words):
    return None
  commands = [w for w in words if w in COMMANDS]
  return command_usage(commands[0]) if commands else usage()


def _one_line(message: str) -> str:
  return " ".join(str(message).split())


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
  print(f"metafam: warning: {_one_line(message)}", file=sys.stderr)


def main(argv: List[str]) -> int:
  """Runs ``metafam`` with ``argv`` (program name first); returns the exit code (see ``EXIT_CODES``)."""
  import warnings
  with warnings.catch_warnings():
    warnings.showwarning = _show_warning  # one line each, like the errors
    return _main(argv)


def _main(argv: List[str]) -> int:
  from metafam.distributed import DistributedError, PeerFailureError, exit_now
  from metafam.io import DirectoryBusyError
  from metafam.outer_trainers.checkpoint import CheckpointError
  from metafam.outer_trainers.meta_trainer import RunDivergedError, WriteFailedError
  from metafam.outer_trainers.preemption import Preempted
  from metafam.resources import InsufficientMemoryError
  text = _help(argv)
  if text is not None:
    print(text)
    return 0
  try:
    command, args = _parse(argv)
    handlers: Dict[str, Callable[..., Optional[int]]] = {
        "meta-train": cmd_meta_train, "list": cmd_list, "evaluate": cmd_evaluate, "benchmark": cmd_benchmark,
        "convert-checkpoint": cmd_convert_checkpoint, "launch": cmd_launch}
    if command in ("meta-train", "evaluate", "benchmark"):
      _enable_compilation_cache()
      _request_cpu_devices(FLAGS.devices)
    return handlers[command](*args) or 0
  except PeerFailureError as e:  # leave at once: JAX's exit hook would wait for the dead process, then abort
    print(f"metafam: error: {_one_line(e)}", file=sys.stderr)
    exit_now(1)
  except Preempted as e:
    print(f"metafam: preempted: {_one_line(e)}", file=sys.stderr)
    return EXIT_CODES["preempted"]
  except WriteFailedError as e:
    print(f"metafam: error: {_one_line(e)}", file=sys.stderr)
    return EXIT_CODES["write failed"]
  except RunDivergedError as e:
    print(f"metafam: error: {_one_line(e)}", file=sys.stderr)
    return EXIT_CODES["diverged"]
  except (UsageError, CheckpointError, DistributedError, DirectoryBusyError, InsufficientMemoryError) as e:
    print(f"metafam: error: {_one_line(e)}", file=sys.stderr)
    return EXIT_CODES["bad input"]
  except OSError as e:  # a file or directory that cannot be read or written
    where = f" ({e.filename})" if e.filename else ""
    print(f"metafam: error: {_one_line(e.strerror or e)}{where}", file=sys.stderr)
    return EXIT_CODES["bad input"]


def run() -> None:
  """Console-script entry point."""
  sys.exit(main(sys.argv))
