"""The public faces: every package exports what its ``__all__`` promises, and README, examples and docs import from
them."""

import glob
import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ["metafam", "metafam.datasets", "metafam.tasks", "metafam.taskfamilies", "metafam.optimizers",
            "metafam.inner", "metafam.outer_trainers", "metafam.runs", "metafam.evaluation", "metafam.benchmark", "metafam.training", "metafam.pretrained", "metafam.distributed",
            "metafam.io", "metafam.resources"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_resolve(name):
  module = importlib.import_module(name)
  assert module.__all__ and len(set(module.__all__)) == len(module.__all__)
  missing = [n for n in module.__all__ if not hasattr(module, n)]
  assert not missing


def _imports(text):
  return re.findall(r"^\s*from (metafam[\w.]*) import", text, re.M)


def test_readme_and_examples_import_from_the_public_faces():
  sources = {"README.md": open(os.path.join(ROOT, "README.md")).read()}
  for name in sorted(os.listdir(os.path.join(ROOT, "examples"))):
    if name.endswith(".py"):
      sources[name] = open(os.path.join(ROOT, "examples", name)).read()
  for path in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True):
    sources[os.path.relpath(path, ROOT)] = open(path).read()
  # The compatibility layer's module tree is deep on purpose (it mirrors learned_optimization's).
  deep = {src: [m for m in _imports(text) if m.count(".") > 1 and not m.startswith("metafam.compat.")]
          for src, text in sources.items()}
  assert sum(len(_imports(text)) for text in sources.values()) > 10
  assert not any(deep.values()), deep
