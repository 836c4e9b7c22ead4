"""Imports point down the layers: `metafam.evaluation` never imports `metafam.benchmark` (which builds on it), and
the learned_optimization compatibility layer has no import cycles, counting imports inside functions too."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules(package_dir):
  """``{dotted name: path}`` of the Python files under ``package_dir`` (relative to the repository root)."""
  out = {}
  for dirpath, _, files in os.walk(os.path.join(ROOT, package_dir)):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(dirpath, name)
        dotted = os.path.relpath(path, ROOT)[:-len(".py")].replace(os.sep, ".")
        out[dotted.removesuffix(".__init__")] = path
  return out


def _imported(path):
  """Every module named by an import statement anywhere in the file (absolute imports; the package uses no others),
  including ``from package import submodule``."""
  names = set()
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      assert node.level == 0, f"{path}: relative import"
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def _cycle(graph):
  """One cycle of ``graph`` ({node: successors}) as a list of nodes, or None (iterative depth-first search)."""
  state = {}
  for start in graph:
    if start in state:
      continue
    stack = [(start, iter(graph[start]))]
    path = [start]
    state[start] = "open"
    while stack:
      node, successors = stack[-1]
      for succ in successors:
        if state.get(succ) == "open":
          return path[path.index(succ):] + [succ]
        if succ not in state:
          state[succ] = "open"
          stack.append((succ, iter(graph[succ])))
          path.append(succ)
          break
      else:
        state[node] = "done"
        stack.pop()
        path.pop()
  return None


def test_cycle_finder_finds_a_cycle():
  assert _cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
  assert _cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None


def test_evaluation_does_not_import_benchmark():
  offenders = {name: sorted(m for m in _imported(path) if m.startswith("metafam.benchmark"))
               for name, path in _modules("metafam/evaluation").items()}
  assert not any(offenders.values()), offenders


def test_compat_layer_has_no_import_cycles():
  modules = _modules("metafam/compat")
  graph = {name: sorted(m for m in _imported(path) if m in modules and m != name) for name, path in modules.items()}
  assert sum(len(v) for v in graph.values()) > 50          # the graph is really read
  assert _cycle(graph) is None, _cycle(graph)


def test_runner_sits_below_evaluation_and_training():
  """`Runner`, fixed-length single-lane training, lives in `metafam.inner` (the layer that owns single-lane
  training): nothing in `metafam.inner` imports evaluation, training, benchmark, outer_trainers or runs, and both
  `metafam.evaluation` and `metafam.training` take it from there (training never imports evaluation)."""
  above = ("metafam.evaluation", "metafam.training", "metafam.benchmark", "metafam.outer_trainers", "metafam.runs")
  offenders = {name: sorted(m for m in _imported(path) if m.startswith(above))
               for name, path in _modules("metafam/inner").items()}
  assert "metafam.inner.runner" in offenders and not any(offenders.values()), offenders
  training = {name: sorted(m for m in _imported(path) if m.startswith("metafam.evaluation"))
              for name, path in _modules("metafam/training").items()}
  assert not any(training.values()), training
  for module in ("metafam/training/trainer.py", "metafam/evaluation/evaluate.py"):
    assert "metafam.inner.runner.Runner" in _imported(os.path.join(ROOT, module)), module
  assert "class Runner" not in open(os.path.join(ROOT, "metafam/evaluation/evaluate.py"), encoding="utf-8").read()


def test_the_command_line_holds_no_run_logic():
  """`metafam meta-train` parses flags into a `Recipe` and runs a `MetaTrainingRun`: cli.py neither builds
  estimators, trainers, recipes or optimizers nor defines a run's identity or a copy of a registry."""
  with open(os.path.join(ROOT, "metafam/cli.py"), encoding="utf-8") as f:
    source = f.read()
  for name in ("MetaTrainer(", "make_estimator", "RUN_CONFIG_KEYS", "ESTIMATORS = ", "inspect.signature",
               "compare_with_tuned_adam", "read_metadata"):
    assert name not in source, name
  assert "MetaTrainingRun(" in source and "recipe_from_command" in source
  for name in ("load_recipe", "takes_step_mult", "HAND_DESIGNED", "learned_optimizer_from_checkpoint",
               "not FLAGS.confirm_test", "suite == \"test\""):
    assert name not in source, name  # recipes.recipe_from_command, benchmark.runner.optimizer_by_name
  assert source.count("\n") <= 400  # the command line: parsing, calls, printing


def _dependencies(path, modules):
  """The modules of ``modules`` that the file at ``path`` imports anywhere (inside functions too); ``from package
  import submodule`` names both, and the package's ``__init__`` is left out by the caller (every module depends on
  its package's ``__init__`` in any case)."""
  return _imported(path) & set(modules)


def test_the_package_has_no_import_cycles():
  """No module of `metafam` imports (at module level or inside a function) a module that leads back to it, the
  package ``__init__``s aside: they re-export what their modules define, so each imports the modules below it."""
  modules = _modules("metafam")
  graph = {name: sorted(m for m in _dependencies(path, modules) if m != name and not path.endswith("__init__.py")
                        and not modules[m].endswith("__init__.py"))
           for name, path in modules.items()}
  assert sum(len(v) for v in graph.values()) > 300          # the graph is really read
  assert "metafam.runs.run_dir" in graph["metafam.runs.loop"]  # imports are really read
  assert _cycle(graph) is None, _cycle(graph)


def test_the_run_modules_are_small_and_meta_trainer_knows_no_run():
  """A run's concerns live in `metafam.runs`, in modules of their own (the run directory, the loop, the
  meta-validation, the recipes, the run object), each under ~300 lines; `metafam.outer_trainers` is the algorithm
  alone: `MetaTrainer` neither reads nor writes files, holds no run identity or evaluation, and nothing in
  outer_trainers imports a run's modules."""
  sizes = {f"{package}/{name}": sum(1 for _ in open(os.path.join(ROOT, "metafam", package, f"{name}.py"),
                                                    encoding="utf-8"))
           for package, names in (("outer_trainers", ("meta_trainer",)),
                                  ("runs", ("recipes", "recipe_flags", "run", "run_dir", "loop", "validation")))
           for name in names}
  assert all(n <= 320 for n in sizes.values()), sizes
  path = os.path.join(ROOT, "metafam/outer_trainers/meta_trainer.py")
  source = open(path, encoding="utf-8").read()
  for name in ("open(", "os.path", "DirectoryLock", "import json", "def train", "def evaluate", "self.config"):
    assert name not in source, name
  from metafam.outer_trainers import MetaTrainer
  assert not {"config", "evaluate", "evaluator", "train"} & set(dir(MetaTrainer))
  banned = {"metafam.io", "metafam.evaluation", "os", "json"}
  assert not _imported(path) & banned, _imported(path) & banned
  outer = {name: sorted(m for m in _imported(p) if m.startswith("metafam.runs"))
           for name, p in _modules("metafam/outer_trainers").items()}
  assert "metafam.outer_trainers.meta_trainer" in outer and not any(outer.values()), outer


# The house, bottom to top: the data flow family -> inner -> outer -> run -> command line. A module imports (at
# module level or inside a function) only its own layer's packages and those below; packages on one layer may
# import each other. The top-level helper modules (``metafam._checks``, ``metafam.io``, ...) are the ground floor,
# the ``metafam`` package face re-exports from every layer and is left out.
LAYERS = [("metafam.datasets",), ("metafam.tasks",), ("metafam.taskfamilies", "metafam.optimizers"),
          ("metafam.inner",), ("metafam.evaluation", "metafam.training"), ("metafam.outer_trainers",),
          ("metafam.runs",), ("metafam.compat", "metafam.pretrained"), ("metafam.benchmark",),
          ("metafam.cli", "metafam._cli_spec", "metafam.__main__")]


def _layer(module):
  """The index in `LAYERS` of ``module``'s layer; -1 for the ground floor (the top-level helper modules)."""
  for i, packages in enumerate(LAYERS):
    if any(module == p or module.startswith(p + ".") for p in packages):
      return i
  return -1


def test_imports_never_point_up_a_layer():
  modules = _modules("metafam")
  assert all(_layer(name) >= 0 for name in modules if name.count(".") > 1)  # every subpackage is on a layer
  upward = {name: sorted(m for m in _dependencies(path, modules) if _layer(m) > _layer(name))
            for name, path in modules.items() if name != "metafam"}
  assert not any(upward.values()), {k: v for k, v in upward.items() if v}
  assert _layer("metafam.outer_trainers") < _layer("metafam.runs") < _layer("metafam.cli")
  graph = _dependencies(os.path.join(ROOT, "metafam/runs/loop.py"), modules)
  assert "metafam.runs.run_dir" in graph and _layer("metafam.runs.run_dir") == _layer("metafam.runs.loop")
