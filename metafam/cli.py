"""The `metafam` command line: ``metafam COMMAND [ARGS] [--flags]`` (also ``python -m metafam``).

The commands (meta-train, evaluate, benchmark, list, launch) and their flags are defined in
`metafam._cli_spec`; ``metafam --help`` lists the commands, ``metafam COMMAND --help`` a command's flags with their
defaults. ``meta-train`` turns its flags into a `metafam.runs.recipes.Recipe` (or loads ``--recipe``) and
runs a `metafam.runs.run.MetaTrainingRun`; evaluate and benchmark run `metafam.benchmark`.

Bad input (unknown names, non-finite or out-of-range numbers, flags that the command does not take, an output
directory that cannot be written, that holds another run's results or that a live run is using, a corrupted,
pickled or non-finite checkpoint, a run too large for the machine's memory) gets a one-line ``metafam: error: ...``
naming what was wrong and what is accepted, and exit code 2, before any expensive work; no existing file is
changed. The CLI only parses, calls the library and prints.

Exit codes (``EXIT_CODES``): 0 done; 1 an unexpected error (with its traceback); 2 bad input or refused; 3 the
meta-training run went bad (``--max_skipped_steps`` consecutive skipped updates); 74 a file could not be written
(full disk, quota, file-size limit, I/O error: the last checkpoint is intact); 75 stopped by SIGTERM / SIGINT after
writing a checkpoint (run the same command again to resume).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from absl import flags

from metafam._cli_spec import (COMMANDS, EXIT_CODES, FLAGS, HELP_ARGS, PER_PROCESS_FLAGS, VERSION_ARGS, command_usage,
                               listing, usage)
from metafam._registry import UnknownNameError, lookup


class UsageError(Exception):
  """Bad input: reported as one line with exit code 2."""


def _lookup(table: Mapping[str, Any], name: str, what: str) -> Any:
  """`metafam._registry.lookup`, with an unknown name reported as a UsageError (the registry's message)."""
  try:
    return lookup(table, name, what)
  except UnknownNameError as e:
    raise UsageError(str(e)) from None


# -- output directories ----------------------------------------------------------------------------------------------
def _output_dir(command: str, output_dir: Optional[str]) -> str:
  """``output_dir`` if given, else ``runs/<command>``."""
  return output_dir if output_dir is not None else os.path.join("runs", command.replace("-", "_"))


@contextlib.contextmanager
def _locked(path: str):
  """The output directory created, proven writable and locked for the command (`metafam.io.lock_output_dir`)."""
  from metafam.io import lock_output_dir
  lock = lock_output_dir(path, "--output_dir")
  try:
    yield lock
  finally:
    lock.release()


# -- commands --------------------------------------------------------------------------------------------------------
def select_tasks() -> str:
  """The registered task (--task) or suite (--suite) name to run; not both."""
  from metafam.benchmark.suites import SUITES
  from metafam.tasks.registry import TASKS
  if FLAGS.task is not None:
    if FLAGS["suite"].present:
      raise UsageError("give --task or --suite, not both.")
    _lookup(TASKS, FLAGS.task, "task")
    return FLAGS.task
  _lookup(SUITES, FLAGS.suite, "suite")
  return FLAGS.suite


def _checked(fn: Any, *args: Any, **kwargs: Any) -> Any:
  """``fn(*args, **kwargs)``; its ValueError (a library's check of what the flags asked for) as a usage error."""
  try:
    return fn(*args, **kwargs)
  except ValueError as e:
    raise UsageError(str(e)) from None


def build_optimizers(name: str, *, learning_rate: float, checkpoint: Optional[str]) -> Dict[str, Any]:
  """``{label: optimizer}`` of --optimizer (`metafam.benchmark.runner.optimizer_by_name`)."""
  from metafam.benchmark.runner import optimizer_by_name
  return _checked(optimizer_by_name, name, learning_rate=learning_rate, checkpoint=checkpoint,
                  names=("--optimizer", "--checkpoint"))


def _prepare_output_dir(command: str) -> str:
  """The command's output directory, checked (usable, not in use, no earlier results unless --overwrite)."""
  from metafam.benchmark.report import existing_report_files
  from metafam.io import check_output_dir
  path = _output_dir(command, FLAGS.output_dir)
  check_output_dir(path, "--output_dir")
  found = existing_report_files(path) if os.path.isdir(path) else ()
  if found and not FLAGS.overwrite:
    raise UsageError(f"--output_dir {path!r} already holds results ({', '.join(found)}); pass --overwrite to "
                     "replace them, or choose another --output_dir.")
  return path


def _optimizer() -> tuple:
  """``(label, optimizer)`` of --optimizer and --checkpoint."""
  return next(iter(build_optimizers(FLAGS.optimizer, learning_rate=FLAGS.learning_rate,
                                    checkpoint=FLAGS.checkpoint).items()))


FLAG_NAMES = {"candidate": "--optimizer", "tasks": "--tasks", "schedules": "--schedules",
              "learning_rate": "--learning_rate", "horizon": "--inner_steps", "num_seeds": "--seeds"}


def _report(command: str, candidate: Any, **kwargs: Any) -> None:
  """Checks everything `metafam.benchmark.score` will do (one line, nothing created), then scores and writes."""
  from metafam.benchmark.scoring import check, score
  _checked(check, candidate, names=FLAG_NAMES, **kwargs)
  out_dir = _prepare_output_dir(command)
  with _locked(out_dir):
    start = time.perf_counter()
    report = _checked(score, candidate, progress=FLAGS.progress, **kwargs)
    print(report.format())
    paths = report.write(out_dir)
  print(f"\n{command} took {time.perf_counter() - start:.1f} s; wrote {out_dir}: "
        + ", ".join(os.path.basename(p) for p in paths))


def _run_suite(command: str, required: bool, baselines) -> None:
  """``evaluate`` (one optimizer, no baselines) and ``benchmark`` on tasks without shipped baselines: the baselines
  made by the shipped procedure at --inner_steps, then the candidate."""
  from metafam.benchmark.suites import check_user_data
  tasks = select_tasks()
  _checked(check_user_data, tasks)
  candidate, label = None, None
  if required or FLAGS["optimizer"].present or FLAGS.checkpoint is not None:
    label, candidate = _optimizer()
  _report(command, candidate, suite=tasks, horizon=FLAGS.inner_steps, baselines=baselines, name=label,
          num_seeds=FLAGS.seeds)


def cmd_evaluate() -> None:
  _run_suite("evaluate", required=True, baselines=())


def _run_heldout() -> None:
  """``benchmark --suite heldout|test``: --optimizer as a registered hand-designed or pretrained name, as
  module:function (a factory of the learning rate), or a learned optimizer with --checkpoint, against the shipped
  baselines under --ruleset; flags that the suite fixes are refused."""
  from metafam.benchmark.heldout import check_suite_choice, load_normalizers
  from metafam.benchmark.suites import check_user_data
  from metafam.optimizers.registry import LEARNED_OPTIMIZERS
  fixed = [f"--{n}" for n in ("task", "inner_steps", "seeds") if FLAGS[n].present]
  fixed += ["--learning_rate"] if FLAGS["learning_rate"].present and FLAGS.ruleset != "self_tuning" else []
  if fixed:
    raise UsageError(f"{', '.join(fixed)}: the {FLAGS.suite} suite fixes its tasks, horizons, seeds and keys, and "
                     "tunes a hand-designed optimizer's learning rate itself (--learning_rate: only with --ruleset "
                     "self_tuning); drop these flags.")
  _checked(check_suite_choice, FLAGS.suite, FLAGS.confirm_test, flags=True)
  if not FLAGS["optimizer"].present and FLAGS.checkpoint is None:
    raise UsageError(f"--suite {FLAGS.suite} needs --optimizer (a hand-designed or pretrained name, module:function, "
                     "or a learned optimizer with --checkpoint).")
  candidate, label = FLAGS.optimizer, None
  if FLAGS.optimizer in LEARNED_OPTIMIZERS or FLAGS.checkpoint is not None:
    label, candidate = _optimizer()
  _checked(check_user_data, FLAGS.suite)
  _report("benchmark", candidate, suite=FLAGS.suite, ruleset=FLAGS.ruleset, tasks=FLAGS.tasks,
          name=FLAGS.name or label, schedules=FLAGS.schedules, confirm_test=FLAGS.confirm_test,
          learning_rate=FLAGS.learning_rate if FLAGS["learning_rate"].present else None,
          data=_checked(load_normalizers, suite=FLAGS.suite))


def cmd_benchmark() -> None:
  if FLAGS.suite in ("heldout", "test") and FLAGS["suite"].present:
    return _run_heldout()
  _run_suite("benchmark", required=False, baselines=("adam", "sgdm"))


def process_group():
  """The multi-process placement from --num_processes/--process_id/--coordinator (UsageError if inconsistent)."""
  from metafam import distributed
  try:
    return distributed.ProcessGroup(FLAGS.num_processes, FLAGS.process_id, FLAGS.coordinator,
                                    timeout_s=FLAGS.coordinator_timeout)
  except ValueError as e:
    raise UsageError(f"--num_processes={FLAGS.num_processes} --process_id={FLAGS.process_id} "
                     f"--coordinator={FLAGS.coordinator}: {e}") from None


def meta_train_recipe():
  """The `Recipe` of meta-train's flags (`metafam.runs.recipe_flags.recipe_from_command`)."""
  from metafam.runs.recipe_flags import recipe_from_command
  names = COMMANDS["meta-train"]["flags"]
  return _checked(recipe_from_command, {n: FLAGS[n].value for n in names}, {n for n in names if FLAGS[n].present},
                  resumed=_output_dir("meta-train", FLAGS.output_dir))


def check_meta_train_flags():
  """The cheap checks of meta-train's flags (names, output directory, lane split); returns ``(recipe, group)``."""
  from metafam.io import check_output_dir
  recipe = meta_train_recipe()
  group = process_group()
  if group.process_id == 0:
    check_output_dir(_output_dir("meta-train", FLAGS.output_dir), "--output_dir")
  if FLAGS.num_processes > 1:  # the library's rule, checked before the processes start
    from metafam.inner.sharding import check_lane_split
    _checked(check_lane_split, recipe.num_tasks, FLAGS.num_processes * FLAGS.devices, "--num_tasks",
             f"--num_processes {FLAGS.num_processes} x --devices {FLAGS.devices} =")
  if FLAGS.tensorboard:
    import importlib.util
    if importlib.util.find_spec("tensorboardX") is None:
      raise UsageError("--tensorboard needs tensorboardX: pip install 'metafam[tb]'.")
  return recipe, group


def cmd_meta_train() -> None:
  recipe, group = check_meta_train_flags()
  out_dir = _output_dir("meta-train", FLAGS.output_dir)
  from metafam import distributed
  distributed.initialize(group)  # before JAX is used: joins the other processes (no-op for one)
  distributed.check_same_everywhere(
      {name: FLAGS[name].value for name in COMMANDS["meta-train"]["flags"] if name not in PER_PROCESS_FLAGS},
      what="meta-train flags")
  import jax
  from metafam.runs.run import MetaTrainingRun, tensorboard_logger
  from metafam.runs.run_dir import CHECKPOINT_NAME, METRICS_NAME
  num_devices = jax.device_count() if group.distributed else FLAGS.devices
  devices = num_devices if num_devices > 1 else None
  try:
    run = MetaTrainingRun(recipe, out_dir, seed=FLAGS.seed, eval_tasks=FLAGS.eval_tasks, eval_steps=FLAGS.eval_steps,
                          devices=devices)
  except ValueError as e:
    if devices is None:  # not about devices: the flags are validated, so this is a bug worth a traceback
      raise
    from metafam.runs.recipe_flags import lane_split_error
    split = None if group.distributed else lane_split_error(recipe, FLAGS.devices)
    if split is not None and "cannot be split evenly" in str(e):
      raise UsageError(split) from None
    raise UsageError(f"--devices {FLAGS.devices}: {e}") from None  # too few devices
  main = distributed.is_main_process()
  done = run.nothing_to_train(FLAGS.num_steps, FLAGS.report) if main else None
  if done:
    raise UsageError(f"--num_steps {FLAGS.num_steps}: {done}")
  result = run.run(checkpoint_every=FLAGS.checkpoint_every, eval_every=FLAGS.eval_every or None,
                   progress=FLAGS.progress, log_fn=tensorboard_logger(out_dir) if FLAGS.tensorboard and main else None,
                   handle_signals=True, max_skipped_steps=FLAGS.max_skipped_steps or None, report=FLAGS.report)
  if not main:
    print(f"process {jax.process_index()}/{jax.process_count()}: meta-training reached step {result.meta_steps}; "
          "process 0 evaluates and writes the results.")
    return
  print("\n" + result.format_summary())
  if not FLAGS.report:
    return print(f"\nwrote {os.path.join(out_dir, METRICS_NAME)}, {CHECKPOINT_NAME} (--noreport: no closing report)")
  plots = [name for name in result.written if name.endswith(".png")]
  print(f"\nwrote {os.path.join(out_dir, result.written[0])}, {METRICS_NAME}, {CHECKPOINT_NAME}"
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


def _configure_jax(devices: int) -> None:
  """What only the command line changes in JAX's configuration (the library never does): a persistent compilation
  cache (``$METAFAM_JAX_CACHE``, default ~/.cache/metafam/jax; "" disables), since compiling dominates short CPU runs,
  and ``devices`` CPU devices (one per core to use), asked for before JAX starts (no effect once it has started)."""
  import jax
  path = os.environ.get("METAFAM_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "metafam", "jax"))
  if path and not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  if devices > 1:
    try:
      jax.config.update("jax_num_cpu_devices", devices)
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
  if any(w in VERSION_ARGS for w in words):
    from metafam import __version__
    return f"metafam {__version__}"
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
  from metafam.io import DirectoryBusyError, OutputDirectoryError
  from metafam.resources import InsufficientMemoryError
  from metafam.runs import CheckpointError, Preempted, RunDivergedError, WriteFailedError
  text = _help(argv)
  if text is not None:
    print(text)
    return 0
  try:
    command, args = _parse(argv)
    handlers: Dict[str, Callable[..., Optional[int]]] = {
        "meta-train": cmd_meta_train, "list": lambda: print(listing()), "evaluate": cmd_evaluate, "benchmark": cmd_benchmark,
        "launch": cmd_launch}
    if command in ("meta-train", "evaluate", "benchmark"):
      _configure_jax(FLAGS.devices)
    return handlers[command](*args) or 0
  except PeerFailureError as e:  # leave at once: JAX's exit hook would wait for the dead process, then abort
    print(f"metafam: error: {_one_line(e)}", file=sys.stderr)
    exit_now(1)
  except Preempted as e:
    print(f"metafam: preempted: {_one_line(e)}", file=sys.stderr)
    return EXIT_CODES["preempted"]
  except (WriteFailedError, RunDivergedError, UsageError, CheckpointError, DistributedError, DirectoryBusyError,
          OutputDirectoryError, InsufficientMemoryError) as e:
    print(f"metafam: error: {_one_line(e)}", file=sys.stderr)
    return EXIT_CODES["write failed" if isinstance(e, WriteFailedError) else
                      "diverged" if isinstance(e, RunDivergedError) else "bad input"]
  except OSError as e:  # a file or directory that cannot be read or written
    where = f" ({e.filename})" if e.filename else ""
    print(f"metafam: error: {_one_line(e.strerror or e)}{where}", file=sys.stderr)
    return EXIT_CODES["bad input"]


def run() -> None:
  """Console-script entry point."""
  sys.exit(main(sys.argv))
