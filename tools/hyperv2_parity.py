"""Checks metafam's `HyperV2` against learned_optimization's own ``research/general_lopt/hyper_v2.py``.

    python tools/hyperv2_parity.py --reference_src /tmp/lo_src/learned_optimization [--steps 5]

`--reference_src` is a checkout of google/learned_optimization ("LO"): the package directory (holding
``research/general_lopt/hyper_v2.py``) or the directory above it. Nothing of LO is kept in this repository. The tool
copies, unchanged, LO's ``research/general_lopt/hyper_v2.py``, ``learned_optimizers/common.py``,
``optimizers/base.py`` and ``tree_utils.py`` into a temporary package ``learned_optimization`` and adds, written
here, what they import but this check does not need:

- ``learned_optimization.summary``: ``summary(...)`` does nothing (LO's imports TensorFlow);
- ``learned_optimization.learned_optimizers.base``: ``LearnedOptimizer`` as a bare base class and ``MetaParams``
  (LO's imports its optax optimizers);
- ``flax.struct`` when flax is not installed: the frozen, pytree-registered dataclass of `tools/lo_test_suite.py`.

LO's code itself is not patched. For each configuration it draws theta with LO's ``HyperV2.init``, adds Gaussian
noise (so every bias and the LSTM's initial state are nonzero), converts it to metafam's layout (haiku's
``LSTMState`` namedtuple becomes ``{"hidden", "cell"}``, the only difference, checked), runs ``--steps`` updates of
both on the same random params (a matrix, a 3-d tensor, a vector and a scalar), gradients and losses, and prints the
largest absolute difference of the params, and of the steps relative to their size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

# This checkout's metafam, not an installed one.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

COPIED = ("research/general_lopt/hyper_v2.py", "learned_optimizers/common.py", "optimizers/base.py", "tree_utils.py")
_SUMMARY_STUB = "def summary(*args, **kwargs):\n  del args, kwargs\n"
_LOPT_BASE_STUB = ("from typing import Any\nMetaParams = Any\n\n\nclass LearnedOptimizer:\n"
                   "  def __init__(self):\n    pass\n")
CONFIGS = {
    "class default (lstm 128, inits 64)": {},
    "VeLO (lstm 512, inits 256, loss features fixed)": dict(lstm_hidden_size=512, param_inits=256,
                                                           use_bugged_loss_features=False),
    "VeLO baseline loader (bugged next LSTM state)": dict(lstm_hidden_size=512, param_inits=256,
                                                         use_bugged_next_lstm_state=True),
}


def _package_dir(src: str) -> str:
  for candidate in (src, os.path.join(src, "learned_optimization")):
    if os.path.isfile(os.path.join(candidate, "research", "general_lopt", "hyper_v2.py")):
      return candidate
  raise SystemExit(f"--reference_src {src!r}: no research/general_lopt/hyper_v2.py there or in "
                   f"{src}/learned_optimization; pass a checkout of google/learned_optimization.")


def build_reference(src: str, workdir: str):
  """Imports LO's hyper_v2 from a scratch package in ``workdir``."""
  pkg = os.path.join(workdir, "learned_optimization")
  for sub in ("", "research", "research/general_lopt", "learned_optimizers", "optimizers"):
    os.makedirs(os.path.join(pkg, sub), exist_ok=True)
    open(os.path.join(pkg, sub, "__init__.py"), "w").close()
  for rel in COPIED:
    shutil.copyfile(os.path.join(_package_dir(src), rel), os.path.join(pkg, rel))
  with open(os.path.join(pkg, "summary.py"), "w") as f:
    f.write(_SUMMARY_STUB)
  with open(os.path.join(pkg, "learned_optimizers", "base.py"), "w") as f:
    f.write(_LOPT_BASE_STUB)
  try:
    import flax.struct  # noqa: F401
  except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from lo_test_suite import _FLAX_SHIM
    os.makedirs(os.path.join(workdir, "flax"), exist_ok=True)
    with open(os.path.join(workdir, "flax", "__init__.py"), "w") as f:
      f.write("from flax import struct\n")
    with open(os.path.join(workdir, "flax", "struct.py"), "w") as f:
      f.write(_FLAX_SHIM)
  sys.path.insert(0, workdir)
  from learned_optimization.research.general_lopt import hyper_v2
  return hyper_v2


def to_metafam_theta(theta):
  """LO's theta with haiku's ``LSTMState`` as ``{"hidden", "cell"}`` and haiku's mappings as dicts."""
  state = theta["lstm_init_state"]
  plain = lambda d: {k: plain(v) if isinstance(v, dict) or hasattr(v, "items") else v  # noqa: E731
                     for k, v in d.items()}
  return {"lstm_init_state": {"hidden": state.hidden, "cell": state.cell},
          "rnn_params": plain(theta["rnn_params"]), "ff_mod_stack": plain(theta["ff_mod_stack"])}


def compare(hyper_v2, config: dict, steps: int, seed: int = 0):
  from metafam.optimizers.hyper_v2 import HyperV2
  rng = np.random.default_rng(seed)
  ref_lopt, ours_lopt = hyper_v2.HyperV2(**config), HyperV2(**config)
  ref_theta = ref_lopt.init(jax.random.PRNGKey(seed))
  ref_theta = jax.tree.map(lambda x: x + jnp.asarray(0.1 * rng.standard_normal(x.shape), x.dtype), ref_theta)
  theta = to_metafam_theta(ref_theta)
  expected = jax.eval_shape(ours_lopt.init, jax.random.key(0))
  assert jax.tree.structure(theta) == jax.tree.structure(expected), (jax.tree.structure(theta), expected)
  assert all(a.shape == b.shape for a, b in zip(jax.tree.leaves(theta), jax.tree.leaves(expected)))

  params = {"w": rng.standard_normal((8, 5)), "t": rng.standard_normal((2, 3, 4)), "b": rng.standard_normal(7),
            "s": np.asarray(0.7)}
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  ref_opt, opt = ref_lopt.opt_fn(ref_theta), ours_lopt.opt_fn(theta)
  ref_state = ref_opt.init(params, num_steps=50)
  state = opt.init(params, num_steps=50)
  update = jax.jit(opt.update)
  worst_abs, worst_rel = 0.0, 0.0
  for _ in range(steps):
    grad = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), jnp.float32), params)
    loss = jnp.float32(rng.uniform(0.5, 2.0))
    before = ref_state.params
    ref_state = ref_opt.update(ref_state, grad, loss=loss, key=jax.random.PRNGKey(1))
    state = update(state, grad, loss=loss)
    for name in params:
      ref_p, p, p0 = (np.asarray(x[name], np.float64) for x in (ref_state.params, state.params, before))
      diff = np.max(np.abs(ref_p - p))
      worst_abs = max(worst_abs, float(diff))
      worst_rel = max(worst_rel, float(diff / max(np.max(np.abs(ref_p - p0)), 1e-30)))
    state = jax.tree.map(lambda x: x, state)
  return worst_abs, worst_rel


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reference_src", required=True)
  parser.add_argument("--steps", type=int, default=5)
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as workdir:
    hyper_v2 = build_reference(args.reference_src, workdir)
    for label, config in CONFIGS.items():
      worst_abs, worst_rel = compare(hyper_v2, config, args.steps)
      print(f"{label}: {args.steps} updates, max |params_metafam - params_LO| = {worst_abs:.3g}, "
            f"relative to the step = {worst_rel:.3g}")


if __name__ == "__main__":
  main()
