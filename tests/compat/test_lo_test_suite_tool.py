"""tools/lo_test_suite.py: the prefix rewrite touches import statements only, cases are counted without importing,
and a wrong --reference_src is a clear error."""

import importlib.util
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
