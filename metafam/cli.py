"""The `metafam` command line: ``metafam COMMAND [--flags]`` (also ``python -m metafam``).

Commands:
  meta-train   meta-train a learned optimizer on a task family, then compare it with tuned Adam on held-out
               instances (test split); writes checkpoints, metrics.jsonl, summary.json and PNG plots.
  evaluate     train a task or suite with a named optimizer or a saved learned optimizer; print/save the results.
  benchmark    run the benchmark suite: tuned Adam baselines and the given optimizers, tables and plots.
  list         list the registered tasks, families, optimizers, estimators and suites.

Bad input (unknown names, invalid numbers, an output directory holding another run, a corrupted checkpoint) gets a
one-line error naming what was wrong and what is accepted, and exit code 2; no existing file is overwritten.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Dict, List

from absl import flags

from metafam.io import save_figure, write_json

FLAGS = flags.FlagValues()

COMMANDS = ("meta-train", "evaluate", "benchmark", "list")
LEARNED_OPTIMIZERS = ("mlp_lopt", "learnable_adam", "learnable_sgd")
HAND_OPTIMIZERS = ("adam", "sgd", "sgdm", "nadamw")
ESTIMATORS = ("pes", "nres", "truncated_es", "full_es", "tbptt")

# meta-train
flags.DEFINE_string("family", "fmnist_mlp_family_8x8_32", "Registered task family to meta-train on.", flag_values=FLAGS)
flags.DEFINE_string("optimizer", "mlp_lopt", f"Optimizer: learned {LEARNED_OPTIMIZERS} or hand-designed "
                    f"{HAND_OPTIMIZERS} (evaluate/benchmark).", flag_values=FLAGS)
flags.DEFINE_string("estimator", "pes", f"Meta-gradient estimator, one of {ESTIMATORS}.", flag_values=FLAGS)
flags.DEFINE_integer("num_steps", 300, "Meta-training steps (total; a resumed run continues to this count).",
                     lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("num_pairs", 8, "Antithetic pairs (ES estimators) or lanes (tbptt).", lower_bound=1,
                     flag_values=FLAGS)
flags.DEFINE_integer("unroll_length", 10, "Inner steps per truncation.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("trajectory_length", 50, "Inner steps per trajectory (full_es: per estimate).", lower_bound=1,
                     flag_values=FLAGS)
flags.DEFINE_float("sigma", 0.01, "ES perturbation standard deviation.", lower_bound=1e-12, flag_values=FLAGS)
flags.DEFINE_float("meta_learning_rate", 3e-3, "Adam learning rate of the meta-optimizer.", lower_bound=1e-12,
                   flag_values=FLAGS)
flags.DEFINE_float("clip_grad_norm", 1.0, "Clip meta-gradients to this global norm (0: no clipping).",
                   lower_bound=0.0, flag_values=FLAGS)
flags.DEFINE_string("output_dir", None, "Output directory (default runs/<command>): checkpoints, logs, tables, plots.",
                    flag_values=FLAGS)
flags.DEFINE_integer("checkpoint_every", 50, "Meta-steps between checkpoints.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("eval_every", 0, "Meta-steps between evaluations during training (0: only at the end).",
                     lower_bound=0, flag_values=FLAGS)
flags.DEFINE_integer("eval_tasks", 8, "Held-out task instances per evaluation.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("eval_steps", 200, "Inner steps per evaluation.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("seed", 0, "Random seed of the run.", flag_values=FLAGS)
flags.DEFINE_integer("devices", 1, "Spread the estimator's lanes over this many devices (on CPU: cores; JAX is "
                     "asked for that many CPU devices), and the evaluation instances when --eval_tasks divides "
                     "evenly. Same numbers up to float rounding, usually faster; the lanes must divide evenly.",
                     lower_bound=1, flag_values=FLAGS)
flags.DEFINE_bool("tensorboard", False, "Also log to TensorBoard (needs tensorboardX: pip install 'metafam[tb]').",
                  flag_values=FLAGS)
flags.DEFINE_bool("progress", True, "Show progress bars.", flag_values=FLAGS)
# evaluate / benchmark
flags.DEFINE_string("task", None, "A registered task name (evaluate).", flag_values=FLAGS)
flags.DEFINE_string("suite", "tiny", "A benchmark suite name.", flag_values=FLAGS)
flags.DEFINE_string("checkpoint", None, "A meta-train checkpoint (its learned optimizer is evaluated).",
                    flag_values=FLAGS)
flags.DEFINE_float("learning_rate", 1e-3, "Learning rate of a hand-designed optimizer.", lower_bound=1e-12,
                   flag_values=FLAGS)
flags.DEFINE_integer("inner_steps", 200, "Inner training steps per task (evaluate/benchmark).", lower_bound=1,
                     flag_values=FLAGS)
flags.DEFINE_integer("seeds", 2, "Seeds per task (evaluate/benchmark).", lower_bound=1, flag_values=FLAGS)


class UsageError(Exception):
  """Bad input: reported as one line with exit code 2."""


def _choose(kind: str, name: str, accepted) -> str:
  accepted = sorted(accepted)
  if name not in accepted:
    raise UsageError(f"unknown {kind} {name!r}; accepted: {', '.join(accepted)}.")
  return name


# -- builders --------------------------------------------------------------------------------------------------------
def build_learned_optimizer(name: str):
  from metafam.optimizers.learned import LearnableAdam, LearnableSGD
  from metafam.optimizers.mlp_lopt import MLPLOpt
  return {"mlp_lopt": MLPLOpt, "learnable_adam": LearnableAdam, "learnable_sgd": LearnableSGD}[name]()


def build_hand_optimizer(name: str, lr: float):
  import optax
  from metafam.optimizers.base import SGD, SGDM, Adam, OptaxOptimizer
  if name == "nadamw":
    return OptaxOptimizer(optax.nadamw(lr), name=f"NAdamW(lr={lr:g})")
  return {"adam": Adam, "sgd": SGD, "sgdm": SGDM}[name](lr)


def build_estimator(name: str, family, lopt):
  from metafam.inner import ConstantSchedule
  from metafam.outer_trainers import PES, FullES, NoiseReuseES, TruncatedBPTT, TruncatedES
  schedule = ConstantSchedule(FLAGS.trajectory_length)
  devices = FLAGS.devices if FLAGS.devices > 1 else None
  es = dict(num_pairs=FLAGS.num_pairs, sigma=FLAGS.sigma, devices=devices)
  if name == "pes":
    return PES(family, lopt, unroll_length=FLAGS.unroll_length, schedule=schedule, **es)
  if name == "nres":
    return NoiseReuseES(family, lopt, unroll_length=FLAGS.unroll_length, schedule=schedule, **es)
  if name == "truncated_es":
    return TruncatedES(family, lopt, unroll_length=FLAGS.unroll_length, schedule=schedule, **es)
  if name == "full_es":
    return FullES(family, lopt, trajectory_length=FLAGS.trajectory_length, **es)
  return TruncatedBPTT(family, lopt, num_tasks=FLAGS.num_pairs, unroll_length=FLAGS.unroll_length,
                       schedule=schedule, devices=devices)


def run_config() -> Dict[str, Any]:
  """What identifies a meta-training run: resuming with a different value of any of these is refused."""
  keys = ("family", "optimizer", "estimator", "num_pairs", "unroll_length", "trajectory_length", "sigma",
          "meta_learning_rate", "clip_grad_norm", "seed")
  return {k: FLAGS[k].value for k in keys}


# -- commands --------------------------------------------------------------------------------------------------------
def _output_dir(command: str) -> str:
  """``--output_dir`` if given, else ``runs/<command>``."""
  return FLAGS.output_dir if FLAGS["output_dir"].present else os.path.join("runs", command.replace("-", "_"))


def _tasks_from_flags():
  from metafam.benchmark.suites import SUITES
  from metafam.tasks.registry import TASKS
  if FLAGS.task is not None:
    if FLAGS["suite"].present:
      raise UsageError("give --task or --suite, not both.")
    return _choose("task", FLAGS.task, TASKS)
  return _choose("suite", FLAGS.suite, SUITES)


def _optimizer_from_flags(required: bool):
  """``{name: optimizer spec}`` from --optimizer/--learning_rate/--checkpoint (empty if not given and optional)."""
  if not required and not FLAGS["optimizer"].present and FLAGS.checkpoint is None:
    return {}
  name = _choose("optimizer", FLAGS.optimizer, LEARNED_OPTIMIZERS + HAND_OPTIMIZERS)
  if name in HAND_OPTIMIZERS:
    if FLAGS.checkpoint is not None:
      raise UsageError(f"--checkpoint holds a learned optimizer; use --optimizer with one of {LEARNED_OPTIMIZERS}.")
    opt = build_hand_optimizer(name, FLAGS.learning_rate)
    return {opt.name: opt}
  if FLAGS.checkpoint is None:
    raise UsageError(f"--optimizer={name} is a learned optimizer: give its meta-parameters with --checkpoint=PATH "
                     "(a checkpoint.pkl written by `metafam meta-train`).")
  if not os.path.isfile(FLAGS.checkpoint):
    raise UsageError(f"--checkpoint {FLAGS.checkpoint!r} is not a file.")
  from metafam.benchmark.runner import learned_optimizer
  lopt = build_learned_optimizer(name)
  try:
    opt = learned_optimizer(lopt, FLAGS.checkpoint)
  except ValueError as e:
    raise UsageError(f"--checkpoint does not hold {name} meta-parameters: {e}") from None
  return {f"{name}@{os.path.basename(os.path.dirname(os.path.abspath(FLAGS.checkpoint))) or 'checkpoint'}": opt}


def _run_suite(command: str, optimizers, tuned, reference) -> None:
  from metafam.benchmark import print_report, run_benchmark, write_report
  tasks = _tasks_from_flags()
  out_dir = _output_dir(command)
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise UsageError(f"--output_dir {out_dir!r} exists and is not a directory.")
  start = time.perf_counter()
  result = run_benchmark(tasks, optimizers, num_steps=FLAGS.inner_steps, num_seeds=FLAGS.seeds, tuned=tuned,
                         reference=reference, seed=FLAGS.seed, progress=FLAGS.progress)
  print_report(result)
  os.makedirs(out_dir, exist_ok=True)
  files = write_report(result, out_dir)
  names = [files.results_csv, files.tuned_csv, files.aggregates_csv, files.json, *files.figures]
  print(f"\n{command} took {time.perf_counter() - start:.1f} s; wrote {out_dir}: "
        + ", ".join(os.path.basename(p) for p in names)
        + (f" ({files.figures_skipped})" if files.figures_skipped else ""))


def cmd_evaluate() -> None:
  _run_suite("evaluate", _optimizer_from_flags(required=True), tuned=None, reference=None)


def cmd_benchmark() -> None:
  _run_suite("benchmark", _optimizer_from_flags(required=False), tuned=("adam", "sgdm"), reference="adam")


def cmd_list() -> None:
  from metafam.tasks.registry import list_families, list_tasks
  print("tasks:       " + ", ".join(list_tasks()))
  print("families:    " + ", ".join(list_families()))
  print("optimizers:  learned: " + ", ".join(LEARNED_OPTIMIZERS) + "; hand-designed: " + ", ".join(HAND_OPTIMIZERS))
  print("estimators:  " + ", ".join(ESTIMATORS))
  try:
    from metafam.benchmark.suites import SUITES
    print("suites:      " + ", ".join(sorted(SUITES)))
  except ImportError:
    pass


def cmd_meta_train() -> None:
  from metafam.tasks.registry import FAMILIES, get_family
  _choose("family", FLAGS.family, FAMILIES)
  _choose("learned optimizer (--optimizer)", FLAGS.optimizer, LEARNED_OPTIMIZERS)
  _choose("estimator", FLAGS.estimator, ESTIMATORS)
  out_dir = _output_dir("meta-train")
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise UsageError(f"--output_dir {out_dir!r} exists and is not a directory.")
  log_fn = _tensorboard_logger(out_dir) if FLAGS.tensorboard else None

  import jax
  import optax
  from metafam.outer_trainers import MetaTrainer
  from metafam.outer_trainers.meta_trainer import METRICS_NAME
  family, lopt = get_family(FLAGS.family), build_learned_optimizer(FLAGS.optimizer)
  try:
    estimator = build_estimator(FLAGS.estimator, family, lopt)
  except ValueError as e:
    if FLAGS.devices == 1:  # not about devices: the flags are validated, so this is a bug worth a traceback
      raise
    raise UsageError(f"--devices {FLAGS.devices}: {e}") from None  # lanes do not split evenly, or too few devices
  trainer = MetaTrainer(lopt, [estimator], optax.adam(FLAGS.meta_learning_rate),
                        clip_grad_norm=FLAGS.clip_grad_norm or None, eval_family=family,
                        eval_num_tasks=FLAGS.eval_tasks, eval_steps=FLAGS.eval_steps, config=run_config())
  key = jax.random.key(FLAGS.seed)
  start = time.perf_counter()
  state, _ = trainer.train(FLAGS.num_steps, key=key, output_dir=out_dir,
                           checkpoint_every=FLAGS.checkpoint_every, eval_every=FLAGS.eval_every or None,
                           progress=FLAGS.progress, log_fn=log_fn)
  train_seconds = time.perf_counter() - start

  evaluator = trainer.evaluator  # on the "test" split, over --devices when --eval_tasks divides evenly
  eval_key = jax.random.key(FLAGS.seed + 1_000_003)
  theta0 = trainer.init(key).theta
  curves = {"learned (init)": evaluator.evaluate(lopt, theta0, eval_key),
            "learned (final)": evaluator.evaluate(lopt, state.theta, eval_key)}
  adam = evaluator.tune_adam(eval_key)
  curves[f"Adam (tuned lr={adam['best_lr']:.2g})"] = adam["curve"]
  history = _read_jsonl(os.path.join(out_dir, METRICS_NAME))
  summary = {
      "config": run_config(), "meta_steps": int(state.step), "train_seconds_this_session": train_seconds,
      "eval": {"family": family.name, "split": "test", "tasks": FLAGS.eval_tasks, "inner_steps": FLAGS.eval_steps,
               "adam_best_lr": adam["best_lr"],
               "final_loss": {k: float(v[-1]) for k, v in curves.items()},
               "mean_loss": {k: float(v.mean()) for k, v in curves.items()}},
      "meta_loss_first_10": [h["meta_loss"] for h in history[:10]],
      "meta_loss_last_10": [h["meta_loss"] for h in history[-10:]],
  }
  write_json(os.path.join(out_dir, "summary.json"), summary)
  print(f"\nheld-out evaluation: {FLAGS.eval_tasks} fresh instances of {family.name}, {FLAGS.eval_steps} inner "
        f"steps, normalized test loss")
  print(f"{'optimizer':<28} {'final loss':>10} {'mean loss':>10}")
  for name, curve in curves.items():
    print(f"{name:<28} {float(curve[-1]):>10.4f} {float(curve.mean()):>10.4f}")
  plots = _plot_meta_train(out_dir, history, curves)
  print(f"\nwrote {os.path.join(out_dir, 'summary.json')}, {METRICS_NAME}, checkpoint.pkl"
        + (", " + ", ".join(plots) if plots else " (install matplotlib for PNG plots: pip install 'metafam[plot]')"))


def _read_jsonl(path: str) -> List[Dict[str, Any]]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _tensorboard_logger(output_dir: str) -> Callable[[Dict[str, Any]], None]:
  try:
    from tensorboardX import SummaryWriter
  except ImportError:
    raise UsageError("--tensorboard needs tensorboardX: pip install 'metafam[tb]'.") from None
  writer = SummaryWriter(os.path.join(output_dir, "tensorboard"))

  def log(record):
    for k, v in record.items():
      if k != "step" and isinstance(v, (int, float)):
        writer.add_scalar(k, v, record["step"])
    writer.flush()
  return log


def _plot_meta_train(output_dir: str, history, curves) -> List[str]:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return []
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot([h["step"] for h in history], [h["meta_loss"] for h in history], lw=1)
  ax.set(xlabel="meta-step", ylabel="meta-loss (normalized)", title="meta-training")
  save_figure(fig, os.path.join(output_dir, "meta_loss.png"))
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, curve in curves.items():
    ax.plot(range(1, len(curve) + 1), curve, label=name)
  ax.set(xlabel="inner step", ylabel="normalized test loss", title="held-out inner training", yscale="log")
  ax.legend()
  save_figure(fig, os.path.join(output_dir, "inner_curves.png"))
  plt.close("all")
  return ["meta_loss.png", "inner_curves.png"]


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
def main(argv: List[str]) -> int:
  """Runs ``metafam`` with ``argv`` (program name first); returns the exit code."""
  from metafam.outer_trainers.checkpoint import CheckpointError
  FLAGS.unparse_flags()  # main() may run several times in one process (tests)
  try:
    rest = FLAGS(argv)
  except flags.Error as e:
    print(f"metafam: error: {e}", file=sys.stderr)
    return 2
  commands = rest[1:]
  if len(commands) != 1 or commands[0] not in COMMANDS:
    got = " ".join(commands) or "nothing"
    print(f"metafam: error: expected one command from {', '.join(COMMANDS)}; got {got}. "
          "Try `metafam list` or `metafam --help`.", file=sys.stderr)
    return 2
  handlers = {"meta-train": cmd_meta_train, "list": cmd_list, "evaluate": cmd_evaluate, "benchmark": cmd_benchmark}
  _enable_compilation_cache()
  _request_cpu_devices(FLAGS.devices)
  try:
    handlers[commands[0]]()
  except (UsageError, CheckpointError) as e:
    print(f"metafam: error: {e}", file=sys.stderr)
    return 2
  return 0


def run() -> None:
  """Console-script entry point."""
  sys.exit(main(sys.argv))
