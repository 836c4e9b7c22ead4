"""The documentation cannot rot: the site builds with warnings as errors, every public name has an API entry, and
every Python block of every page runs as written (a page's blocks in order, in one namespace, like a notebook)."""

import glob
import html
import importlib
import os
import re
import subprocess
import sys

import pytest
from markdown_blocks import code_blocks
from test_public_api import PACKAGES as PUBLIC  # the public faces, whose __all__ names must resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
PAGES = sorted(os.path.relpath(p, DOCS) for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
RUNNABLE = [page for page in PAGES if code_blocks(os.path.join(DOCS, page), "python")]


# The heaviest pages run with `-m slow` (in CI): the two tutorials' library paths are the scoring path's and the
# meta-training loop's, tested in tests/benchmark/test_benchmark.py and tests/outer_trainers/test_meta_trainer.py; the
# your-model guide's adapters, arrays and families are tested in tests/tasks/test_model_adapters.py and
# tests/datasets/test_array_datasets.py.
SLOW_CASES = {("test_page_python_blocks_run", f"{page}.md")
              for page in ("tutorials/benchmarking-optax", "tutorials/learned-optimizer-optax", "guide/your-model")}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  """Builds the site once with ``mkdocs build --strict`` into a temporary directory; returns its path."""
  out = tmp_path_factory.mktemp("site")
  env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
  proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return out


def test_site_builds_strict_and_every_page_is_in_the_navigation(site):
  # --strict already fails on pages left out of `nav`, broken links and missing anchors; check the output too.
  built = {os.path.relpath(p, site) for p in glob.glob(os.path.join(site, "**", "index.html"), recursive=True)}
  for page in PAGES:
    stem = page[:-len(".md")]
    expected = "index.html" if stem == "index" else os.path.join(stem.removesuffix("/index"), "index.html")
    assert expected in built, (page, expected)


def test_strict_build_fails_on_a_broken_link(tmp_path):
  # The build really is strict: a page linking to a missing page fails it (a copy of docs/, so nothing changes).
  docs = tmp_path / "docs"
  subprocess.run(["cp", "-r", DOCS, str(docs)], check=True)
  with open(docs / "index.md", "a") as f:
    f.write("\n[gone](no-such-page.md)\n")
  config = tmp_path / "mkdocs.yml"
  with open(os.path.join(ROOT, "mkdocs.yml")) as f:
    text = f.read().replace("docs_dir: docs", f"docs_dir: {docs}").replace("paths: [.]", f"paths: [{ROOT}]")
  config.write_text(text)
  # The API pages are not needed to see a broken link; dropping mkdocstrings keeps this test fast.
  for api_page in glob.glob(str(docs / "api" / "*.md")):
    with open(api_page, "w") as f:
      f.write("# API\n")
  proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir",
                         str(tmp_path / "site")], env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode != 0
  assert "no-such-page.md" in proc.stdout + proc.stderr


@pytest.mark.parametrize("package", PUBLIC)
def test_api_reference_has_every_public_name(site, package):
  module = importlib.import_module(package)
  page = "metafam" if package == "metafam" else package.split(".", 1)[1]
  with open(os.path.join(site, "api", page, "index.html"), encoding="utf-8") as f:
    anchors = set(re.findall(r'id="([^"]+)"', html.unescape(f.read())))
  missing = [name for name in module.__all__ if f"{package}.{name}" not in anchors]
  assert not missing, f"{package}: no API entry for {missing}"


@pytest.mark.parametrize("page", RUNNABLE)
def test_page_python_blocks_run(page, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)                      # whatever a tutorial writes lands in a temporary directory
  namespace = {"__name__": "docs_" + re.sub(r"\W", "_", page)}
  for index, code in enumerate(code_blocks(os.path.join(DOCS, page), "python")):
    exec(compile(code, f"docs/{page} python block {index}", "exec"), namespace)


def test_tutorials_and_getting_started_have_runnable_code():
  # The pages the issue asks to run; a page that lost its code blocks would silently stop being tested.
  must_run = {"getting-started.md", "tutorials/custom-task-family.md", "tutorials/learned-optimizer-optax.md",
              "tutorials/porting-learned-optimization.md", "tutorials/benchmarking-optax.md",
              "tutorials/scaling-out.md"}
  assert must_run <= set(RUNNABLE), must_run - set(RUNNABLE)
