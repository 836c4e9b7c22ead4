"""Every Python code block of README.md runs as written; its two opening commands are the CI's."""

import os

import pytest
from markdown_blocks import code_blocks

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "README.md")


def _blocks(lang):
  return code_blocks(README, lang)


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_python_block_runs(index):
  code = _blocks("python")[index]
  exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": f"readme_block_{index}"})


def test_readme_opens_with_the_two_commands():
  first = _blocks("bash")[0].strip().splitlines()
  commands = [line for line in first if line.strip() and not line.startswith("#")]
  assert commands == ["pip install . && metafam meta-train", 'pip install ".[test]" && python -m pytest -q tests']
  with open(os.path.join(os.path.dirname(README), ".ci", "run")) as f:
    ci = f.read()
  assert "pip install" in ci
  # CI also runs the slow tests, by the command README documents.
  with open(README) as f:
    assert "`python -m pytest -q -m slow tests`" in f.read()
  assert "grep -m1 -oE 'python -m pytest -q -m slow tests' README.md" in ci and 'bash -c "$slow_cmd"' in ci
