"""The flags and commands of the `metafam` command line (`metafam.cli`), and its help texts.

Every flag is defined here once, with its default, bounds and help; `COMMANDS` says which flags each command takes
(any other is refused). The defaults of meta-train's flags that describe the run are read from the recipe it runs
with no flags (`metafam.runs.recipe_flags.main_job`), so the two cannot disagree.
``metafam --help`` prints `usage`, ``metafam COMMAND --help`` prints `command_usage`.
"""

from __future__ import annotations

import math
from typing import Any, Dict

from absl import flags

from metafam.optimizers.registry import list_learned_optimizers, takes_step_mult
from metafam.outer_trainers.base import PERTURBATIONS
from metafam.runs.recipe_flags import flag_defaults, main_job

FLAGS = flags.FlagValues()

EXIT_CODES = {"done": 0, "error": 1, "bad input": 2, "diverged": 3, "write failed": 74, "preempted": 75}

INT32_MAX = 2 ** 31 - 1
MAX_LANES = 2 ** 16  # antithetic pairs, evaluation instances: far beyond what fits in memory for any built-in task


def _int(name: str, default: int, help_text: str, lower: int = 1, upper: int = INT32_MAX) -> None:
  flags.DEFINE_integer(name, default, help_text, lower_bound=lower, upper_bound=upper, flag_values=FLAGS)


def _float(name: str, default: float, help_text: str, lower: float) -> None:
  """A float flag that also refuses NaN and infinities (which pass any bound check)."""
  flags.DEFINE_float(name, default, help_text, lower_bound=lower, flag_values=FLAGS)
  flags.register_validator(name, lambda v: v is None or math.isfinite(v), message="must be a finite number",
                           flag_values=FLAGS)


# meta-train (the run's flags default to the main job's recipe)
RUN_DEFAULTS = flag_defaults(main_job())
flags.DEFINE_string("family", RUN_DEFAULTS["family"], "Registered task family to meta-train on.", flag_values=FLAGS)
flags.DEFINE_string("recipe", None, "A meta-training recipe: a shipped one (generalist) or a recipe JSON file "
                    "(metafam.runs.recipes). It sets the learned optimizer, the families (one estimator "
                    "each), the estimator, the trajectory lengths and the meta-optimizer, so it excludes --family, "
                    "--optimizer, --estimator and --trajectory_length; --num_steps, --num_tasks, --unroll_length, "
                    "--sigma, --step_mult, --perturbation(_rank) and the meta-optimizer flags override its values "
                    "when given.",
                    flag_values=FLAGS)
flags.DEFINE_string("optimizer", RUN_DEFAULTS["optimizer"], "Optimizer: a registered learned optimizer, or for "
                    "evaluate/benchmark a hand-designed one (`metafam list` names both).", flag_values=FLAGS)
flags.DEFINE_string("estimator", RUN_DEFAULTS["estimator"], "Meta-gradient estimator (`metafam list` names them).",
                    flag_values=FLAGS)
_int("num_steps", RUN_DEFAULTS["num_steps"], "Meta-training steps (total; a resumed run continues to this count).")
_int("num_tasks", RUN_DEFAULTS["num_tasks"], "Task instances per family and meta-step (tbptt: a lane each; ES: an "
     "antithetic pair of lanes each).", upper=MAX_LANES)
_int("unroll_length", RUN_DEFAULTS["unroll_length"], "Inner steps per truncation.")
_int("trajectory_length", RUN_DEFAULTS["trajectory_length"], "Inner steps per trajectory (full_es: per estimate); "
     "train on the horizon you evaluate on (--eval_steps).")
_float("sigma", RUN_DEFAULTS["sigma"], "ES perturbation standard deviation.", lower=1e-12)
flags.DEFINE_enum("perturbation", RUN_DEFAULTS["perturbation"], list(PERTURBATIONS), "ES noise of the matrix "
                  "meta-parameters: full Gaussian, or low_rank (rank --perturbation_rank factors, applied as shared "
                  "weights plus per-lane factors; same covariance). Recorded in the checkpoint.", flag_values=FLAGS)
_int("perturbation_rank", RUN_DEFAULTS["perturbation_rank"], "Factor rank of --perturbation low_rank.", upper=4096)
_float("step_mult", RUN_DEFAULTS["step_mult"], "Scale of the learned optimizer's steps, for the registered optimizers "
       f"that take one ({', '.join(n for n in list_learned_optimizers() if takes_step_mult(n))}; each has its own "
       "library default, and this default is the main job's; for adafac_muon_rms_lopt it is the learning rate, the "
       "RMS of every step); recorded in the checkpoint, and `evaluate --checkpoint` rebuilds the optimizer with it.",
       lower=1e-12)
_float("meta_learning_rate", RUN_DEFAULTS["meta_learning_rate"], "Adam learning rate of the meta-optimizer.",
       lower=1e-12)
_int("meta_lr_decay_steps", RUN_DEFAULTS["meta_lr_decay_steps"], "Meta-learning-rate schedule: linear warmup over "
     "the first min(100, N // 10) meta-steps, cosine decay to 0.1 times the rate at meta-step N, constant after "
     "(0: a constant rate). Unless given, N is --num_steps (the default shown is the default run's), a --recipe's own "
     "value when --num_steps is not given, and a resumed run's recorded value.", lower=0)
_float("clip_grad_norm", RUN_DEFAULTS["clip_grad_norm"], "Clip meta-gradients to this global norm (0: no "
       "clipping).", lower=0.0)
flags.DEFINE_string("output_dir", None, "Output directory (default runs/<command>): checkpoints, logs, tables, plots.",
                    flag_values=FLAGS)
_int("checkpoint_every", 50, "Meta-steps between checkpoints (SIGTERM / SIGINT also write one, at the step in "
     "flight).")
_int("max_skipped_steps", 50, "Stop (exit code 3) after this many consecutive meta-steps whose update was skipped "
     "because no estimate was finite (0: never stop).", lower=0)
_int("eval_every", 0, "Meta-steps between meta-validation checks: the same held-out instances of every family of "
     "the recipe, trained --eval_steps steps from initialization and scored on outer_valid, into metrics.jsonl "
     "(eval_final_loss ...) and meta_validation.png (0: none; the closing report runs in any case).", lower=0)
_int("eval_tasks", 16, "Held-out task instances per evaluation (per family for meta-validation; the closing report's "
     "speedup interval is over these).", upper=MAX_LANES)
_int("eval_steps", 200, "Inner steps per evaluation (meta-validation checks and the closing report).")
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
flags.DEFINE_bool("report", True, "After the last meta-step, write the closing report (the learned optimizer against "
                  "tuned Adam on held-out instances: summary.json and plots); --noreport skips it, which saves most "
                  "of a short run's time. A later run with the same --num_steps writes the missing report.",
                  flag_values=FLAGS)
# evaluate / benchmark
flags.DEFINE_string("task", None, "A registered task name (instead of --suite).", flag_values=FLAGS)
flags.DEFINE_string("suite", "tiny", "A benchmark suite name.", flag_values=FLAGS)
flags.DEFINE_string("checkpoint", None, "A meta-train checkpoint (its learned optimizer is evaluated).",
                    flag_values=FLAGS)
_float("learning_rate", 1e-3, "Learning rate of a hand-designed optimizer.", lower=1e-12)
_int("inner_steps", 200, "Inner training steps per task (a multiple of 8: runs are evaluated at every eighth).")
flags.register_validator("inner_steps", lambda v: v % 8 == 0, flag_values=FLAGS,
                         message="must be a multiple of 8 (every run is evaluated at each eighth of it)")
_int("seeds", 2, "Seeds per task.", upper=MAX_LANES)
flags.DEFINE_bool("overwrite", False, "Replace the results of an earlier evaluate/benchmark in --output_dir.",
                  flag_values=FLAGS)
flags.DEFINE_bool("confirm_test", False, "benchmark --suite test: confirm scoring on the test suite (run once per "
                  "shipped optimizer, never for design choices; the result records it).", flag_values=FLAGS)
flags.DEFINE_list("tasks", None, "benchmark --suite heldout|test: a comma-separated subset of the suite's tasks "
                    "(default: all with shipped baselines).", flag_values=FLAGS)
flags.DEFINE_list("schedules", None, "benchmark --suite heldout|test: the schedules a factory is tuned over, "
                    "comma-separated from constant,warmup_cosine (default: both, as the baselines were tuned); "
                    "with --ruleset self_tuning, the one schedule of the single setting (default constant).",
                    flag_values=FLAGS)
flags.DEFINE_enum("ruleset", "external", ["external", "self_tuning"], "benchmark --suite heldout|test: external "
                  "(every optimizer tuned per task) or self_tuning (one setting for the whole suite: a shipped "
                  "baseline at its best single dev setting, a pretrained optimizer at its default rate, a factory at "
                  "--learning_rate).", flag_values=FLAGS)
flags.DEFINE_string("name", None, "benchmark --suite heldout|test: the candidate's label in tables, files and plots "
                    "(default from --optimizer; a baseline's name gets ' (candidate)').", flag_values=FLAGS)

_SUITE_FLAGS = ("task", "suite", "optimizer", "checkpoint", "learning_rate", "inner_steps", "seeds",
                "output_dir", "overwrite", "progress")
COMMANDS: Dict[str, Dict[str, Any]] = {
    "meta-train": dict(
        summary="meta-train a learned optimizer on a task family, then compare it with tuned Adam on held-out "
                "instances; run it again to resume",
        args=(), flags=("family", "recipe", "optimizer", "estimator", "num_steps", "num_tasks", "unroll_length",
                        "trajectory_length", "sigma", "perturbation", "perturbation_rank", "step_mult",
                        "meta_learning_rate", "meta_lr_decay_steps", "clip_grad_norm", "output_dir",
                        "checkpoint_every", "max_skipped_steps", "eval_every", "eval_tasks", "eval_steps",
                        "seed", "devices", "num_processes", "process_id", "coordinator", "coordinator_timeout",
                        "tensorboard", "progress", "report")),
    "evaluate": dict(summary="train a task or suite with one optimizer (hand-designed, or learned from a "
                             "checkpoint) and save the results", args=(), flags=_SUITE_FLAGS),
    "benchmark": dict(summary="tuned Adam and SGDM baselines (and optionally one more optimizer) on a suite: "
                              "tables, speedups and plots; --suite heldout (dev) or test: one optimizer against the "
                              "shipped tuned baselines (--optimizer NAME or module:function)", args=(),
                     flags=_SUITE_FLAGS + ("confirm_test", "tasks", "schedules", "ruleset", "name")),
    "list": dict(summary="list the registered tasks, families, optimizers, estimators, recipes and suites", args=(),
                 flags=()),
    "launch": dict(summary="run a command as --num_processes local processes of one multi-process run: "
                           "`metafam launch --num_processes 2 -- meta-train [flags]`", args=("COMMAND [ARGS]",),
                   flags=("num_processes",)),
}
HELP_ARGS = ("--help", "-h", "--helpfull", "--helpshort", "-help")
VERSION_ARGS = ("--version", "-V")


# -- help ------------------------------------------------------------------------------------------------------------
def usage() -> str:
  """``metafam --help``: the commands."""
  width = max(map(len, COMMANDS)) + 2
  lines = ["usage: metafam COMMAND [ARGS] [--flag=value ...]", "", "commands:"]
  lines += [f"  {name:<{width}} {spec['summary']}" for name, spec in COMMANDS.items()]
  lines += ["", "`metafam COMMAND --help` lists a command's flags and their defaults; `metafam --version` prints the "
            "version."]
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


# Flags that need not agree across the processes of one run (everything else must, see cmd_meta_train).
PER_PROCESS_FLAGS = ("process_id", "progress", "tensorboard", "output_dir")


def listing() -> str:
  """``metafam list``: the registered names, one a line under their kind, the tasks whose data the user supplies
  marked with what supplies them."""
  from metafam.benchmark.suites import list_suites
  from metafam.optimizers.registry import list_hand_optimizers
  from metafam.outer_trainers import list_estimators
  from metafam.runs import list_recipes
  from metafam.taskfamilies.registry import list_families
  from metafam.tasks.registry import list_tasks, needs_user_data
  sections = [("tasks", list_tasks()), ("families", list_families()),
              ("learned optimizers", list_learned_optimizers()), ("hand-designed optimizers", list_hand_optimizers()),
              ("estimators", list_estimators()), ("recipes", list_recipes()), ("suites", list_suites())]
  lines = []
  for i, (title, names) in enumerate(sections):
    lines += ([""] if i else []) + [f"{title}:"]
    needs = {name: needs_user_data(name) for name in names} if title == "tasks" else {}
    width = max(map(len, names)) if needs else 0
    lines += [f"  {name:<{width}}  [user data: {needs[name][0]}]" if needs.get(name) else f"  {name}" for name in names]
    lines += [f"  [user data: {short}]: metafam does not ship these data; needs {full}."
              for short, full in sorted({n for n in needs.values() if n})]
  return "\n".join(lines)
