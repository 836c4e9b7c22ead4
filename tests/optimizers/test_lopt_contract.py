"""The one learned-optimizer contract (issue 63): golden numbers (conformance of every registered optimizer to the
contract: the table of tests/test_conformance.py, row LEARNED_OPTIMIZERS).

Goldens (tests/lopt_goldens.py, recorded on e012da3 before the refactor): every registered learned optimizer, every
shipped pretrained optimizer and the compat layer's learned optimizers give bit for bit the recorded params through
``opt_fn(theta)`` (also with ``is_training=True``), and the recorded optax updates. The optax faces of the
optimizers that had none of their own (``lopt_goldens.FORMERLY_ADAPTED``: the reverse adapter's updates were
``(p - step) - p``, now they are ``-step``) agree with the recorded ones on the first update through that identity.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lopt_goldens as G
from production_run import run_production
from metafam.optimizers.registry import LEARNED_OPTIMIZERS


def test_goldens_are_small_and_cover_every_case():
  goldens = np.load(G.GOLDENS)
  assert os.path.getsize(G.GOLDENS) < 200_000
  names = {case for case, _, _ in G.cases()}
  assert {f"registry/{n}" for n in LEARNED_OPTIMIZERS} <= names
  assert {"pretrained/generalist_v1", "pretrained/generalist_v2"} <= names
  for name in names:
    assert f"{name}/params" in goldens.files and f"{name}/training" in goldens.files


@pytest.mark.slow  # about 3 minutes: every optimizer compiled as in production (the conformance below is quick)
def test_bit_identical_to_the_goldens():
  """In a child process with JAX's default config and production XLA flags (the goldens' conditions)."""
  run_production("lopt_goldens.py", "--check", timeout=1200)


def test_optax_update_needs_params_and_empty_params_work():
  lopt = LEARNED_OPTIMIZERS["rnn_mlp_lopt"]()
  tx = lopt.as_optax(lopt.init(jax.random.key(0)))
  state = tx.init({"w": jnp.ones(3)})
  with pytest.raises(ValueError, match="needs the current params"):
    tx.update({"w": jnp.ones(3)}, state)
  opt = lopt.opt_fn(lopt.init(jax.random.key(0)))
  empty = opt.update(opt.init({}), {})
  assert int(empty.iteration) == 1 and empty.params == {}
