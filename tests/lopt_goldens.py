"""The golden updates of every learned optimizer (tests/optimizers/test_lopt_contract.py), and the script that records
them.

Every registered learned optimizer (at ``init(key(0))``; once more with ``is_training=True``), every shipped
pretrained optimizer and the learned optimizers of the learned_optimization compat layer take ``NUM_STEPS`` jitted
updates on `PARAMS` (a scalar, a vector, a matrix, a 3-D and a 4-D conv-like leaf, float32) with the fixed gradients
`grads(step)` and losses, through both faces: the params-carrying ``opt_fn(theta)`` (the params after each update) and
the optax transformation (the updates). The arrays recorded on e012da3, before the one-contract refactor (issue 63),
are ``tests/data/lopt_goldens.npz``, the reference record; the refactor had to reproduce them bit for bit. XLA's
float32 results follow the host's CPU, so a host may have a record of its own (tests/golden_hosts.py: which record a
host is held to, and the tolerance on a host with none).

    PYTHONPATH=. python tests/lopt_goldens.py                # rewrites the reference record
    PYTHONPATH=. python tests/lopt_goldens.py --record_host  # writes this host's record (tests/data/hosts/KEY/)
    PYTHONPATH=. python tests/lopt_goldens.py --check        # compares (exit status 1 and the differences if any)

Both run with JAX's default config and XLA's production flags (the test suite's conftest changes both: its random
draws, hence every theta, differ), so tests/optimizers/test_lopt_contract.py runs the check in a child process.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterator, Tuple

import jax
import jax.numpy as jnp
import numpy as np

NAME = "lopt_goldens.npz"
GOLDENS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", NAME)  # the reference record
NUM_STEPS = 3
HORIZON = 10  # num_steps given to optimizers with a learned schedule (and to HyperV2's loss features)
SHAPES = {"s": (), "v": (5,), "m": (4, 3), "c3": (2, 3, 4), "c4": (3, 3, 2, 4)}


def _draw(seed: int) -> Dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


PARAMS = _draw(0)


def grads(step: int) -> Dict[str, np.ndarray]:
  g = _draw(100 + step)
  g["v"][1] = 0.0  # an exact-zero entry (dead units)
  return g


def loss(step: int) -> np.float32:
  return np.float32(2.0 / (1.0 + step))


def _registry() -> Iterator[Tuple[str, Any, Any]]:
  from metafam.optimizers.registry import LEARNED_OPTIMIZERS
  for name in sorted(LEARNED_OPTIMIZERS):
    lopt = LEARNED_OPTIMIZERS[name]()
    yield f"registry/{name}", lopt, lopt.init(jax.random.key(0))


def _pretrained() -> Iterator[Tuple[str, Any, Any]]:
  import metafam.pretrained as pretrained
  for name in pretrained.list():
    lopt, theta = pretrained.load(name)
    yield f"pretrained/{name}", lopt, jax.tree.map(jnp.asarray, theta)


def _compat() -> Iterator[Tuple[str, Any, Any]]:
  from metafam.compat.learned_optimization.learned_optimizers import adafac_mlp_lopt, adafac_nominal, base, mlp_lopt
  from metafam.compat.learned_optimization.learned_optimizers import nn_adam, rnn_mlp_lopt
  from metafam.compat.learned_optimization.research.general_lopt import hyper_v2
  lopts = {"mlp_lopt": mlp_lopt.MLPLOpt(), "adafac_mlp_lopt": adafac_mlp_lopt.AdafacMLPLOpt(),
           "nn_adam": nn_adam.NNAdam(), "rnn_mlp_lopt": rnn_mlp_lopt.RNNMLPLOpt(),
           "adafac_nominal": adafac_nominal.MLPNomLOpt(), "learnable_sgd": base.LearnableSGD(),
           "learnable_sgdm": base.LearnableSGDM(), "learnable_adam": base.LearnableAdam(),
           "hyper_v2": hyper_v2.HyperV2(lstm_hidden_size=8, param_inits=4)}
  for name, lopt in lopts.items():
    yield f"compat/{name}", lopt, lopt.init(jax.random.key(0))


def cases() -> Iterator[Tuple[str, Any, Any]]:
  """``(case name, learned optimizer, theta)`` for every case."""
  yield from _registry()
  yield from _pretrained()
  yield from _compat()


def _uses_horizon(lopt: Any) -> bool:
  return bool(getattr(lopt, "uses_horizon", False))


def flat(tree: Dict[str, Any]) -> np.ndarray:
  """The leaves of a tree shaped like `PARAMS`, raveled in `SHAPES`' order and concatenated."""
  return np.concatenate([np.ravel(np.asarray(tree[k])) for k in SHAPES])


def run_params_face(lopt: Any, theta: Any, is_training: bool = False) -> np.ndarray:
  """``[NUM_STEPS, size]``: the params after each update through ``opt_fn(theta)`` (`flat`), each update jitted."""
  opt = lopt.opt_fn(theta, is_training=is_training)
  state = opt.init(PARAMS, num_steps=HORIZON, key=jax.random.key(1))
  update = jax.jit(lambda s, g, l: opt.update(s, g, loss=l))
  out = []
  for step in range(NUM_STEPS):
    state = update(state, grads(step), loss(step))
    out.append(flat(opt.get_params(state)))
  return np.stack(out)


def run_optax_face(lopt: Any, theta: Any) -> np.ndarray:
  """``[NUM_STEPS, size]``: each step's updates through ``lopt.as_optax(theta)`` (`flat`), each update jitted."""
  import optax
  tx = lopt.as_optax(theta, num_steps=HORIZON) if _uses_horizon(lopt) else lopt.as_optax(theta)
  params = PARAMS
  state = tx.init(params)
  update = jax.jit(lambda g, s, p, l: tx.update(g, s, p, loss=l))
  out = []
  for step in range(NUM_STEPS):
    updates, state = update(grads(step), state, params, loss(step))
    params = optax.apply_updates(params, updates)
    out.append(flat(updates))
  return np.stack(out)


FACES: Dict[str, Callable[[Any, Any], np.ndarray]] = {
    "params": run_params_face,
    "training": lambda lopt, theta: run_params_face(lopt, theta, is_training=True),
    "optax": run_optax_face,
}


def record() -> Dict[str, np.ndarray]:
  arrays = {}
  for case, lopt, theta in cases():
    for face, run in FACES.items():
      if face == "optax" and case.startswith("compat/"):
        continue  # the compat layer's optax face is opt_to_optax's, covered by the params face
      arrays[f"{case}/{face}"] = run(lopt, theta)
  return arrays


# The optimizers that had no optax face of their own: the reverse adapter's updates were new params - old params,
# i.e. fl(fl(p - step) - p) (inside one jitted program, where XLA may fuse p - lr * g), the contract's are -step
# itself. Their recorded optax updates are therefore matched to 2 ulps of the largest param, not bit for bit (their
# opt_fn faces, which carry the params, are bit-identical).
FORMERLY_ADAPTED = {"registry/learnable_adam", "registry/learnable_sgd", "registry/learnable_sgdm",
                    "registry/mlp_lopt", "registry/mlp_nom_lopt", "registry/nn_adam", "registry/rnn_mlp_lopt",
                    "registry/hyper_v2"}


def differences(got: Dict[str, np.ndarray], want: Any) -> list:
  """The differences of ``got`` (`record`'s arrays) from the record ``want``, as lines (empty: bit-identical; the
  optax faces of `FORMERLY_ADAPTED` to 2 ulps)."""
  bad = []
  for key in sorted(got):
    if key not in want.files:
      bad.append(f"{key}: no golden")
      continue
    expect, case = want[key], key.rsplit("/", 1)[0]
    if key.endswith("/optax") and case in FORMERLY_ADAPTED:
      ulp = float(np.spacing(np.float32(np.max(np.abs(flat(PARAMS))))))
      if got[key].shape == expect.shape and np.max(np.abs(got[key] - expect)) <= 2 * ulp:
        continue
    if got[key].shape != expect.shape or not np.array_equal(got[key], expect):
      bad.append(f"{key}: max |difference| {float(np.max(np.abs(got[key] - expect))):.3g}")
  missing = {k.rsplit("/", 1)[0] for k in want.files} - {k.rsplit("/", 1)[0] for k in got}
  return bad + [f"{case}: recorded, no longer run" for case in sorted(missing)]


def relative_differences(got: Dict[str, np.ndarray], want: Any) -> Dict[str, float]:
  """``{array: golden_hosts.relative_difference}`` of ``got`` from the record ``want``, at the scale of each recorded
  array; at the params' scale for the optax faces of `FORMERLY_ADAPTED` (recorded as ``(p - step) - p``, so exact
  only to the params' ulps)."""
  import golden_hosts as H
  params_scale = float(np.max(np.abs(flat(PARAMS))))
  return {k: H.relative_difference(got[k], want[k], scale=params_scale if k.endswith("/optax") and
                                   k.rsplit("/", 1)[0] in FORMERLY_ADAPTED else None) for k in got}


def check() -> Tuple[list, list]:
  """``(differences, notes)``: bit for bit against this host's record if it has one (`golden_hosts`); otherwise
  against the reference record, bit for bit or else to `golden_hosts.RTOL` of each array's scale (then a note
  starting with `golden_hosts.UNRECORDED`)."""
  import golden_hosts as H
  got = record()
  own = H.own_record(NAME)
  with np.load(own or GOLDENS) as want:
    bad = differences(got, want)
    if own or not bad:
      return bad, [f"bit-identical to {own or GOLDENS}"] if not bad else []
    if any(k not in want.files for k in got) or set(want.files) - set(got):
      return bad, []
    largest = max(relative_differences(got, want).values())
    if largest > H.RTOL:
      return bad + [f"largest difference {largest:.3g} of an array's scale (tolerance {H.RTOL:g} on a host without "
                    f"a record of its own, {H.host_key()})"], []
    return [], [H.unrecorded_line(largest)]


if __name__ == "__main__":
  import sys
  jax.config.update("jax_platforms", "cpu")
  if sys.argv[1:] == ["--check"]:
    bad, notes = check()
    print("\n".join(bad + notes))
    sys.exit(1 if bad else 0)
  if sys.argv[1:] not in ([], ["--record_host"]):
    sys.exit(f"usage: {sys.argv[0]} [--check | --record_host]")
  if sys.argv[1:] == ["--record_host"]:
    import golden_hosts as H
    path = H.host_record(NAME)
  else:
    path = GOLDENS
  arrays = record()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  np.savez_compressed(path, **arrays)
  print(f"{len(arrays)} arrays, {os.path.getsize(path)} bytes -> {path}")
  if path != GOLDENS:
    print(f"-> {H.write_host_json(H.HOW)}")
