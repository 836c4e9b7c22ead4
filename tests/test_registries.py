"""The shared name lookup (`metafam._registry.lookup`) and the tasks' registry's layer. (Every registry's unknown
names raise its `UnknownNameError` listing the valid names: the conformance table, tests/test_conformance.py.)"""

import ast
import os
import subprocess
import sys
import textwrap

import pytest

import metafam
from metafam._registry import lookup
def test_error_text_is_the_plain_message():
  with pytest.raises(KeyError) as info:
    lookup({"b": 1, "a": 2}, "c", "thing")
  assert str(info.value) == "unknown thing 'c'; valid names: a, b"
  with pytest.raises(ValueError):
    lookup({}, ["unhashable"], "thing")
  assert lookup({"a": 2}, "a", "thing") == 2


def test_tasks_do_not_import_taskfamilies():
  """``metafam.tasks`` and every module in it import nothing from ``metafam.taskfamilies`` (the top-level package,
  which re-exports both, is stubbed out so that only the tasks' own imports count)."""
  code = textwrap.dedent("""
      import importlib, os, pkgutil, sys, types
      root = types.ModuleType("metafam")
      root.__path__ = [os.path.join(sys.argv[1], "metafam")]
      sys.modules["metafam"] = root
      import metafam.tasks
      for info in pkgutil.iter_modules(metafam.tasks.__path__):
        importlib.import_module("metafam.tasks." + info.name)
      assert "metafam.tasks.registry" in sys.modules
      leaked = sorted(m for m in sys.modules if m.startswith("metafam.taskfamilies"))
      assert not leaked, leaked
  """)
  root = os.path.dirname(os.path.dirname(os.path.abspath(metafam.__file__)))
  proc = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr


def test_tasks_source_has_no_taskfamilies_import():
  """Also the lazy imports inside functions (which importing the modules does not run)."""
  folder = os.path.join(os.path.dirname(os.path.abspath(metafam.__file__)), "tasks")
  found = []
  for filename in sorted(os.listdir(folder)):
    if filename.endswith(".py"):
      with open(os.path.join(folder, filename)) as f:
        tree = ast.parse(f.read())
      for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [f"{filename}:{node.lineno} {n}" for n in names if n.startswith("metafam.taskfamilies")]
  assert not found, found
