"""tools/lo_test_suite.py: the prefix rewrite touches import statements only, cases are counted without importing,
and a wrong --reference_src is a clear error."""

import importlib.util
import json
import os

import pytest

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "lo_test_suite.py")


@pytest.fixture(scope="module")
def tool():
  spec = importlib.util.spec_from_file_location("lo_test_suite", TOOL)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_rewrite_changes_import_prefixes_only(tool):
  source = ("from learned_optimization.tasks import quadratics\n"
            "import learned_optimization.tree_utils as tu\n"
            "  from learned_optimization import eval_training  # indented\n"
            "import os, learned_optimization\n"
            "name = 'learned_optimization.tasks'  # a string stays\n"
            "x = learned_optimization_version\n")
  assert tool.rewrite_imports(source) == (
      "from metafam.compat.learned_optimization.tasks import quadratics\n"
      "import metafam.compat.learned_optimization.tree_utils as tu\n"
      "  from metafam.compat.learned_optimization import eval_training  # indented\n"
      "import os, metafam.compat.learned_optimization\n"
      "name = 'learned_optimization.tasks'  # a string stays\n"
      "x = learned_optimization_version\n")


def test_static_case_count_expands_parameterized(tool):
  source = '''
NAMES = ["a", "b", "c"]

class T(parameterized.TestCase):

  def test_plain(self):
    pass

  @parameterized.product(x=(1, 2), y=("u", "v", "w"))
  def test_product(self, x, y):
    pass

  @parameterized.parameters(NAMES)
  def test_list(self, name):
    pass

  @parameterized.named_parameters(("one", 1), ("two", 2))
  def test_named(self, value):
    pass

  def helper(self):
    pass
'''
  assert tool._static_case_count(source) == 1 + 6 + 3 + 2


def test_wrong_reference_src_is_a_clear_error(tool, tmp_path):
  with pytest.raises(SystemExit, match="learned_optimization/__init__.py"):
    tool.main(["--reference_src", str(tmp_path)])


def test_exclusions_have_reasons(tool):
  assert tool.EXCLUDED_FILES and all(reason for reason in tool.EXCLUDED_FILES.values())
  for cases in tool.EXCLUDED_CASES.values():
    assert all(reason for reason in cases.values())
  assert not set(tool.EXCLUDED_FILES) & set(tool.TEST_FILES)
  assert set(tool.EXCLUDED_CASES) <= set(tool.TEST_FILES)  # a misspelt file would exclude nothing


def test_a_file_missing_from_an_older_checkout_is_skipped_not_failed(tool, tmp_path):
  # An older LO (the 0.0.1 source distribution) lacks some test files, e.g. tree_utils_test.py: reported as
  # skipped, and the exit status says whether what exists passed; a file that fails still gives 1.
  lo = tmp_path / "lo" / "learned_optimization"
  lo.mkdir(parents=True)
  (lo / "__init__.py").write_text("")
  (lo / "summary_test.py").write_text("def test_ok():\n  assert 1 + 1 == 2\n")
  out = str(tmp_path / "out")
  argv = ["--reference_src", str(lo.parent), "--out", out, "--no_notebooks"]
  assert tool.main(argv + ["--only", "tree_utils_test,summary_test"]) == 0
  with open(os.path.join(out, "results.json")) as f:
    rows = {row["name"]: [case[1] for case in row["cases"]] for row in json.load(f)["rows"]}
  assert rows == {"tree_utils_test.py": ["skipped"], "summary_test.py": ["passed"]}
  assert tool.main(argv + ["--only", "tree_utils_test"]) == 1  # nothing ran at all
  (lo / "summary_test.py").write_text("def test_bad():\n  assert 1 + 1 == 3\n")
  assert tool.main(argv + ["--only", "summary_test"]) == 1
  with pytest.raises(SystemExit) as error:
    tool.main(argv + ["--only", "no_such_test"])
  assert error.value.code == 2


def test_a_file_that_runs_past_the_timeout_fails_every_case_with_the_reason(tool, tmp_path):
  lo = tmp_path / "lo" / "learned_optimization"
  lo.mkdir(parents=True)
  (lo / "__init__.py").write_text("")
  (lo / "summary_test.py").write_text("import time\n\ndef test_a():\n  time.sleep(120)\n\ndef test_b():\n  pass\n")
  out = tmp_path / "out"
  stale = out / "tests" / "summary_test.py.junit.xml"  # an earlier run's report must not be read
  stale.parent.mkdir(parents=True)
  stale.write_text('<testsuite><testcase classname="x" name="test_a"/><testcase classname="x" name="test_b"/>'
                   '</testsuite>')
  argv = ["--reference_src", str(lo.parent), "--out", str(out), "--no_notebooks", "--only", "summary_test",
          "--timeout", "3"]
  assert tool.main(argv) == 1
  with open(out / "results.json") as f:
    (row,) = json.load(f)["rows"]
  assert [case[1] for case in row["cases"]] == ["failed", "failed"]
  assert all("timeout after 3s" in case[2] for case in row["cases"])

