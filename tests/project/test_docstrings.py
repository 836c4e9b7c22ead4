"""Library docstrings and comments say what a thing is and does, its arguments and its references; measurements
(times, ratios, intervals, measured percentages) and paths into ``experiments/`` live in ``docs/performance/`` and
``docs/results/`` and are linked from there (see docs/contributing.md, "Where things go").

Every module under ``metafam/`` except ``metafam/compat/`` (learned_optimization's code and notes, kept as they
are) is read with `ast` (module, class and function docstrings) and `tokenize` (comments), and each line is matched
against the patterns below. A line that must stay as it is goes in ``ALLOWED`` with the reason."""

import ast
import io
import pathlib
import re
import tokenize

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent.parent / "metafam"
SKIPPED = ("compat",)

_NUMBER = r"\d[\d,]*(?:\.\d+)?"
PATTERNS = {
    # a number and a time unit ("3 second moments" is a count, not a time)
    "time": re.compile(r"(?<![\w.])" + _NUMBER + r"(?:\s*(?:-|–|->|to)\s*" + _NUMBER + r")?\s?"
                       r"(?:ms|s|us|µs|min|h|secs?|seconds?|minutes?|hours?)\b(?!\s*moments?)"),
    # a ratio such as 1.33x or 0.6x ("8x8" is a shape: no word boundary after the x)
    "ratio": re.compile(r"(?<![\w.])\d+(?:\.\d+)?x\b"),
    # a bracketed interval with a decimal bound, e.g. [0.18, 0.29] ([0, 1] and f32[19, 32] are ranges and shapes)
    "interval": re.compile(r"(?<![\w\]])\[\s*-?\d+(?:\.\d+)?\s*,\s*-?\d+(?:\.\d+)?\s*\]"),
    # a percentage of a measured quantity (a percentage in a definition, "95% intervals", "the first 5% of T", is fine)
    "percent": re.compile(r"\d+(?:\.\d+)?\s?%[^.;]*\b(?:throughput|faster|slower|speed|time|took|measured)\b"
                          r"|\b(?:throughput|faster|slower|speed|took|measured)\b[^.;]*\d+(?:\.\d+)?\s?%"),
    "experiments path": re.compile(r"\bexperiments/"),
}

# (path relative to metafam/, the matched text) -> why it is not a measurement
ALLOWED = {
}


def _is_measured_interval(text):
  return "." in text


def _lines(path):
  """``(line number, text)`` of every docstring line and comment of a module."""
  source = path.read_text(encoding="utf-8")
  out = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
      first = node.body[0]
      if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        out += [(first.lineno + i, line) for i, line in enumerate(first.value.value.splitlines())]
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      out.append((tok.start[0], tok.string))
  return out


def _modules():
  return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] not in SKIPPED]


def find_lab_notes(path):
  """``[(line, kind, matched text, the line)]`` for the measurement patterns in ``path``'s docstrings and comments
  (the line of a docstring is its first line plus the offset inside it)."""
  hits = []
  rel = path.relative_to(PACKAGE).as_posix()
  for line, text in _lines(path):
    for kind, pattern in PATTERNS.items():
      for m in pattern.finditer(text):
        if kind == "interval" and not _is_measured_interval(m.group(0)):
          continue
        if (rel, m.group(0)) in ALLOWED:
          continue
        hits.append((line, kind, m.group(0), text.strip()))
  return hits


def test_the_walk_covers_the_package():
  names = {p.relative_to(PACKAGE).as_posix() for p in _modules()}
  assert {"optimizers/newton_schulz.py", "optimizers/muon_lopt.py", "inner/step.py", "cli.py"} <= names
  assert not any(n.startswith("compat/") for n in names)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_measurements_in_library_docstrings(path):
  hits = find_lab_notes(path)
  rel = path.relative_to(PACKAGE).as_posix()
  assert not hits, "\n".join(
      f"metafam/{rel}:{line}: {kind} {match!r} in: {text}" for line, kind, match, text in hits) + (
      "\nmove the measurement to docs/performance/ (or docs/results/) and link the page, or add the line to ALLOWED "
      "in tests/project/test_docstrings.py with the reason it is not a measurement")


@pytest.mark.parametrize("text, kind", [
    ("took 86 s -> 35 s", "time"), ("about 12 ms per step", "time"), ("1.33x Adam's", "ratio"),
    ("about 0.6x faster", "ratio"), ("difference -0.15 [-0.19, -0.12]", "interval"),
    ("ran at 77% of the 8-lane throughput", "percent"), ("see experiments/generalist_v2/README.md", "experiments path"),
])
def test_patterns_catch_lab_notes(text, kind):
  assert PATTERNS[kind].search(text)


@pytest.mark.parametrize("text", [
    "3 second moments", "a 3x3 convolution", "8x8 images", "pixels in [0, 1]", "``w`` f32[19, 32]",
    "stratified-bootstrap 95% intervals", "warmup over the first 5% of T", "T + 1 characters",
])
def test_patterns_leave_definitions_alone(text):
  hits = [k for k, p in PATTERNS.items() if p.search(text) and (k != "interval" or _is_measured_interval(
      p.search(text).group(0)))]
  assert not hits, hits
