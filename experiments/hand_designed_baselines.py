"""How fast can a hand-designed optimizer go? Adam (fine lr grid, constant and decayed), and Muon, on the held-out
instances.

    python experiments/hand_designed_baselines.py [--family fmnist_mlp_family_8x8_32] [--seed 0] [--steps 200]

Uses the exact held-out instances/batches of `metafam meta-train --seed S` (evaluation key ``S + 1_000_003``, 16
instances, ``--steps`` (200) steps, test split) and `compare_with_tuned_adam`'s smoothing, and prints, per
optimizer, the smoothed mean loss at T/4, T/2, 3T/4 and T and the median per-instance speedup over tuned Adam (grid
1e-4..1e-1).
It answers "what loss does 2x need at step 100, and does any simple schedule reach it?" With ``--muon_lrs``:
optax's Muon (`optax.contrib.muon`: Newton-Schulz-orthogonalized Nesterov momentum 0.95 for the weight matrices, Adam
at ``--muon_adam_lr`` for biases), constant and cosine-decayed to 0 over T, the hand-designed counterpart of
``adafac_muon_mlp_lopt``'s orthogonalized-momentum feature.
"""
import argparse

import jax
import optax

from metafam.evaluation.comparison import compare_with_tuned_adam, smooth_curves
from metafam.evaluation.family_eval import FamilyEvaluator
from metafam.optimizers.base import OptaxOptimizer
from metafam.optimizers.learned import HandDesigned
from metafam.taskfamilies.registry import get_family


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--family", default="fmnist_mlp_family_8x8_32")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--steps", type=int, default=200, help="inner steps T (decays end at T/2 and at T)")
  p.add_argument("--constant_lrs", type=float, nargs="+", default=[0.01, 0.02, 0.03, 0.05, 0.07, 0.1])
  p.add_argument("--decay_lrs", type=float, nargs="+", default=[0.03, 0.05, 0.1, 0.2])
  p.add_argument("--muon_lrs", type=float, nargs="*", default=[], help="e.g. 0.02 0.05 0.1 0.2")
  p.add_argument("--muon_adam_lr", type=float, default=0.03)
  a = p.parse_args()
  fam = get_family(a.family)
  ev = FamilyEvaluator(fam, 16, a.steps)
  key = jax.random.key(a.seed + 1_000_003)
  opts = {}
  for lr in a.constant_lrs:
    opts[f"adam {lr:g}"] = optax.adam(lr)
  for horizon in (a.steps // 2, a.steps):
    for lr in a.decay_lrs:
      opts[f"adam {lr:g} cos->0 @{horizon}"] = optax.adam(optax.cosine_decay_schedule(lr, horizon, 0.0))
      opts[f"adam {lr:g} lin->0 @{horizon}"] = optax.adam(optax.linear_schedule(lr, 0.0, horizon))
  for lr in a.muon_lrs:
    opts[f"muon {lr:g}"] = optax.contrib.muon(lr, adam_learning_rate=a.muon_adam_lr)
    opts[f"muon {lr:g} cos->0 @{a.steps}"] = optax.contrib.muon(
        optax.cosine_decay_schedule(lr, a.steps, 0.0),
        adam_learning_rate=optax.cosine_decay_schedule(a.muon_adam_lr, a.steps, 0.0))
  for name, tx in opts.items():
    lopt = HandDesigned(OptaxOptimizer(tx, name=name))
    res = compare_with_tuned_adam(ev, lopt, {name: {}}, key)
    r = res.speedup(name)
    sm = smooth_curves(res.curves[name], a.steps // 10).mean(axis=1)
    adam_sm = smooth_curves(res.adam_curves, a.steps // 10).mean(axis=1)
    q = [int(a.steps * f) - 1 for f in (0.25, 0.5, 0.75, 1.0)]
    print(f"{name:28s} smoothed@{[i + 1 for i in q]}: {' '.join(f'{sm[i]:.4f}' for i in q)}  "
          f"speedup {r.value:.2f} [{r.low:.2f}, {r.high:.2f}] at the cap "
          f"{res.at_cap(name)}/16 | tuned adam lr {res.adam_lr:g}: {' '.join(f'{adam_sm[i]:.4f}' for i in q)}",
          flush=True)


if __name__ == "__main__":
  main()
