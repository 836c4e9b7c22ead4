"""What is published is what is tested: build the sdist and the wheel (`python -m build`), check what the wheel
holds, install it into a fresh virtual environment and run `metafam list` and a 10-step `metafam meta-train` there,
outside the source tree, on the Fashion-MNIST data shipped inside the wheel.

The virtual environment reuses the dependencies of the environment running the tests (jax, optax, dm-haiku, numpy:
a ``.pth`` file appends that environment's site-packages to the new one's path, after the new one's own) and
installs the wheel itself with ``--no-deps --no-index``: the test needs no network and takes seconds, and the
versions it runs with are the tested floors of ``pyproject.toml`` (see README, "Tested with").
``--system-site-packages`` would not do when the tests themselves run in a virtual environment (as `.ci/run` does):
it exposes the base interpreter's packages, not the test environment's. The build runs ``--no-isolation`` for the
same reason (it uses the setuptools of the `test` extra).
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

import metafam

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What the source tree has that a build must not see (it builds in a copy, so the checkout gets no build/ or
# *.egg-info and parallel test workers do not collide).
_IGNORE_ANYWHERE = shutil.ignore_patterns(".git", ".ci-venv", "site", "build", "dist", "*.egg-info", "__pycache__",
                                         ".pytest_cache", ".hypothesis")


def IGNORE(directory, names):
  """`shutil.copytree`'s ``ignore``: the patterns above anywhere, and the run outputs (``runs/``) at the root only
  (``metafam/runs/`` is the package's)."""
  ignored = set(_IGNORE_ANYWHERE(directory, names))
  if os.path.abspath(directory) == ROOT and "runs" in names:
    ignored.add("runs")
  return ignored


DATA = ["metafam/datasets/data/fashion_mnist_slice.npz", "metafam/datasets/data/shakespeare_8plays.txt.gz",
        "metafam/datasets/data/LICENSE_FASHION_MNIST.txt", "metafam/datasets/data/LICENSE_SHAKESPEARE.txt",
        "metafam/py.typed", "metafam/datasets/data/mnist_5k.npz", "metafam/datasets/data/LICENSE_MNIST.txt",
        "metafam/benchmark/data/heldout_baselines.json", "metafam/pretrained/data/generalist_v1.npz",
        "metafam/pretrained/data/generalist_v1.md", "metafam/runs/recipes/generalist.json",
        "metafam/pretrained/data/generalist_v2.npz", "metafam/pretrained/data/generalist_v2.md",
        "metafam/runs/recipes/generalist_v2.json"]


def _run(args, **kwargs):
  proc = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
  assert proc.returncode == 0, f"{args}\n{proc.stdout}\n{proc.stderr}"
  return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
  """``(sdist path, wheel path)`` built from a copy of the source tree."""
  src = tmp_path_factory.mktemp("src") / "metafam"
  shutil.copytree(ROOT, src, ignore=IGNORE)
  out = tmp_path_factory.mktemp("dist")
  _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)])
  sdists, wheels = glob.glob(str(out / "*.tar.gz")), glob.glob(str(out / "*.whl"))
  assert len(sdists) == 1 and len(wheels) == 1, os.listdir(out)
  return sdists[0], wheels[0]


def test_version_has_one_source():
  with open(os.path.join(ROOT, "pyproject.toml")) as f:
    pyproject = f.read()
  assert 'dynamic = ["version"]' in pyproject and 'version = {attr = "metafam.__version__"}' in pyproject
  assert not os.path.exists(os.path.join(ROOT, "setup.py"))
  with open(os.path.join(ROOT, "CITATION.cff")) as f:
    cited = re.search(r"^version: (\S+)$", f.read(), re.M).group(1)
  assert cited == metafam.__version__


def test_wheel_and_sdist_hold_the_package_data_and_licences(dist):
  sdist, wheel = dist
  assert os.path.basename(wheel).startswith(f"metafam-{metafam.__version__}-py3-none-any")
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
  assert set(DATA) <= names, set(DATA) - names
  info = f"metafam-{metafam.__version__}.dist-info"
  assert any(n.startswith(info) and n.endswith("LICENSE") for n in names), sorted(n for n in names if info in n)
  metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
  assert "Requires-Dist: jax>=0.10.2" in metadata and "Requires-Python: >=3.11" in metadata
  assert "License-Expression: Apache-2.0" in metadata
  assert "Provides-Extra: test" in metadata and "Requires-Dist: pytest-xdist" in metadata
  assert not any(n.startswith(("tests/", "docs/", "experiments/", "benchmarks/")) for n in names)
  with tarfile.open(sdist) as t:
    members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
  assert set(DATA) | {"LICENSE", "README.md", "pyproject.toml", "CHANGELOG.md", "CITATION.cff"} <= members


@pytest.mark.slow  # meta-train: tests/test_cli.py; the wheel's files: the test above
def test_installed_wheel_runs_list_and_a_short_meta_training(dist, tmp_path):
  _, wheel = dist
  venv = tmp_path / "venv"
  _run([sys.executable, "-m", "venv", str(venv)])
  python, command = str(venv / "bin" / "python"), str(venv / "bin" / "metafam")
  _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel])
  # Only now the test environment's packages: seen before the install, its own metafam (the checkout's, or the CI's
  # `pip install .`) would satisfy pip and the wheel would never be installed. Plain directory lines: the parent's
  # .pth hooks (an editable metafam, say) are not run.
  site_packages = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
  parents = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
  with open(os.path.join(site_packages, "_test_environment.pth"), "w") as f:
    f.write("\n".join(parents) + "\n")
  work = tmp_path / "work"                      # outside the source tree, so only the installed copy is importable
  work.mkdir()
  env = dict(os.environ, METAFAM_JAX_CACHE="", PYTHONPATH="")
  where = _run([python, "-c", "import metafam; print(metafam.__file__)"], cwd=work, env=env).strip()
  assert where.startswith(str(venv)), where      # the wheel's copy, not an editable or source checkout
  listed = _run([command, "list"], cwd=work, env=env)
  assert "fmnist_mlp_family_8x8_32" in listed and "adafac_muon_mlp_lopt" in listed
  # The default family and learned optimizer (the embedded Fashion-MNIST is read from the installed package), with
  # short trajectories so that 10 meta-steps and the held-out comparison take seconds.
  _run([command, "meta-train", "--num_steps=10", "--num_tasks=2", "--unroll_length=5", "--trajectory_length=20",
        "--eval_tasks=2", "--eval_steps=20", "--checkpoint_every=5", "--progress=false", "--output_dir=out"],
       cwd=work, env=env)
  assert {"checkpoint.npz", "metrics.jsonl", "summary.json"} <= set(os.listdir(work / "out"))
  with open(work / "out" / "metrics.jsonl") as f:
    assert sum(1 for _ in f) >= 10
  # The shipped pretrained weights and recipe are read from the installed package.
  code = ("import jax.numpy as jnp, metafam.pretrained as p; from metafam.runs import load_recipe; "
          "tx = p.optax_transform('generalist_v1', 1e-2); w = {'w': jnp.ones((3, 2))}; "
          "u, _ = tx.update(w, tx.init(w), w); print(float(jnp.sqrt(jnp.mean(u['w'] ** 2))), "
          "len(load_recipe('generalist').families), "
          "p.load('generalist_v2')[1]['log_schedule'].shape[0], len(load_recipe('generalist_v2').families))")
  rms, families, knots, families_v2 = _run([python, "-c", code], cwd=work, env=env).split()
  assert abs(float(rms) - 1e-2) < 1e-5 and int(families) == 5 and int(knots) == 5 and int(families_v2) == 3
