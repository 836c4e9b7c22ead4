"""One meta-training ablation run under a wall-clock budget, scored against tuned Adam on held-out instances.

    python experiments/meta_train_ablation.py --lopt mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --minutes 3 --seed 0
    python experiments/meta_train_ablation.py --lopt mlp_nom_lopt --lopt_kwargs '{"initial_lr": 0.05}' --trajectory 200
    python experiments/meta_train_ablation.py --estimator full_es --loss_type last    # meta-loss: last step vs mean
    python experiments/meta_train_ablation.py --generalize fmnist_ae_family_8x8_32x8x32 mlp_16x16_64   # unseen

Meta-trains ``--lopt`` (a registered learned optimizer built with ``--lopt_kwargs``) on ``--family`` with
`MetaTrainer` and ``--estimator`` (pes / nres: ``--pairs`` antithetic pairs, truncations of ``--unroll`` steps in
trajectories of ``--trajectory`` steps, or log-uniform lengths in [``--min_trajectory``, ``--trajectory``] with
``--schedule loguniform``; full_es: whole trajectories of ``--trajectory`` steps with ``--loss_type``), the
estimator's ``--loss_kind`` (default: normalized outer_valid loss of the updated params, averaged over every step
of the truncation, i.e. over the whole trajectory for PES), Adam meta-optimizer at ``--meta_lr`` (``--cosine``:
warmup + cosine decay over ``--cosine_steps``), gradient clipping ``--clip``, until ``--minutes`` of wall time
(compilation and the keep-best validations included) have passed.

With ``--keep_best_every N`` theta is scored every N meta-steps on 16 *validation* instances (a key disjoint from the
test instances, ``outer_valid`` split, the same 200-step horizon; the mean loss over the last 10% of steps), and the
best one is kept ("best" row) beside the last one ("final" row).

With ``--theta_ema D`` the exponential moving average of theta over meta-steps (Polyak averaging,
``ema = D * ema + (1 - D) * theta`` after every meta-step, accumulated on the host in float64, from 0 with bias
correction ``ema / (1 - D ** t)``) is scored too ("ema" row): it averages out the jitter of theta at the ES noise floor.

Every theta (init, final, best, ema) is then scored by `compare_with_tuned_adam` on 16 fresh instances of the family
(evaluation key ``seed + 1_000_003``, the same instances as `metafam meta-train --seed S`), test split, 200 steps,
and, with ``--generalize``, on other families it was not trained on (registered family names, or ``mlp_16x16_64``:
the 16x16 image-MLP family with 64 hidden units, 17,098 params, like the task ``fmnist_mlp_16x16_64_gelu``).
One JSON line per (theta, family) goes to ``--out`` (default experiments/results/ablation.jsonl).
Timings are of a shared 2-core machine: compare meta-steps, not seconds, across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np


def get_family(name: str):
  if name == "mlp_16x16_64":
    from metafam.taskfamilies.image_mlp import ImageMLPFamily
    return ImageMLPFamily((64,), image_size=16)
  from metafam.taskfamilies.registry import get_family as registered
  return registered(name)


def build_estimator(args, family, lopt):
  from metafam.inner.schedules import ConstantSchedule, LogUniformSchedule
  from metafam.outer_trainers import make_estimator
  if args.schedule == "loguniform":
    schedule = LogUniformSchedule(args.min_trajectory, args.trajectory)
  else:
    schedule = ConstantSchedule(args.trajectory)
  if args.estimator == "full_es":
    return make_estimator("full_es", family, lopt, num_tasks=args.pairs, schedule=schedule,
                          trajectory_length=args.trajectory, sigma=args.sigma, loss_type=args.loss_type,
                          loss_kind=args.loss_kind)
  if args.estimator == "tbptt":
    # unroll == trajectory with lanes starting together: each meta-step backpropagates through whole trajectories
    return make_estimator("tbptt", family, lopt, num_tasks=args.pairs, unroll_length=args.unroll, schedule=schedule,
                          loss_kind=args.loss_kind, random_initial_iteration=args.unroll < args.trajectory)
  return make_estimator(args.estimator, family, lopt, num_tasks=args.pairs, unroll_length=args.unroll,
                        schedule=schedule, sigma=args.sigma, loss_kind=args.loss_kind,
                        random_initial_iteration=True)


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--name", default="", help="row label")
  p.add_argument("--family", default="fmnist_mlp_family_8x8_32")
  p.add_argument("--lopt", default="mlp_lopt")
  p.add_argument("--lopt_kwargs", default='{"step_mult": 0.01}', help="JSON keyword arguments of the optimizer")
  p.add_argument("--estimator", default="pes", choices=["pes", "nres", "full_es", "tbptt"])
  p.add_argument("--pairs", type=int, default=8)
  p.add_argument("--unroll", type=int, default=10)
  p.add_argument("--trajectory", type=int, default=200)
  p.add_argument("--schedule", default="constant", choices=["constant", "loguniform"])
  p.add_argument("--min_trajectory", type=int, default=20)
  p.add_argument("--loss_kind", default="normalized_meta_loss")
  p.add_argument("--loss_type", default="avg", choices=["avg", "last", "min"], help="full_es only")
  p.add_argument("--sigma", type=float, default=0.01)
  p.add_argument("--meta_lr", type=float, default=3e-3)
  p.add_argument("--cosine", action="store_true")
  p.add_argument("--cosine_steps", type=int, default=3000)
  p.add_argument("--warmup", type=int, default=100)
  p.add_argument("--clip", type=float, default=1.0)
  p.add_argument("--minutes", type=float, default=3.0)
  p.add_argument("--max_steps", type=int, default=10 ** 9)
  p.add_argument("--keep_best_every", type=int, default=0)
  p.add_argument("--theta_ema", type=float, default=0.0, help="EMA decay of theta over meta-steps (0: off)")
  p.add_argument("--eval_steps", type=int, default=200)
  p.add_argument("--generalize", nargs="*", default=[])
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--save_thetas", default="", help="directory for each scored theta (<name>_s<seed>_<theta>.npz)")
  p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                               "ablation.jsonl"))
  args = p.parse_args()

  from metafam.evaluation.comparison import compare_with_tuned_adam
  from metafam.evaluation.family_eval import FamilyEvaluator
  from metafam.optimizers.registry import get_learned_optimizer
  from metafam.outer_trainers import MetaTrainer, meta_optimizer

  family = get_family(args.family)
  lopt = get_learned_optimizer(args.lopt, **json.loads(args.lopt_kwargs))
  est = build_estimator(args, family, lopt)
  tx = meta_optimizer(args.meta_lr, args.cosine_steps, args.warmup) if args.cosine else meta_optimizer(args.meta_lr)
  trainer = MetaTrainer(lopt, [est], tx, clip_grad_norm=args.clip or None)
  valid = FamilyEvaluator(family, 16, args.eval_steps, split="outer_valid") if args.keep_best_every else None
  valid_key = jax.random.key(args.seed + 2_000_003)
  tail = max(1, args.eval_steps // 10)

  start = time.perf_counter()
  state = trainer.init(jax.random.key(args.seed))
  theta0 = jax.tree.map(np.asarray, state.theta)
  best = (np.inf, -1, theta0)
  decay = args.theta_ema
  ema = jax.tree.map(lambda x: np.zeros(x.shape, np.float64), theta0)
  losses = []
  while time.perf_counter() - start < args.minutes * 60 and int(state.step) < args.max_steps:
    state, metrics = trainer.step(state)
    losses.append(float(metrics["meta_loss"]) if "meta_loss" in metrics else float("nan"))
    step = int(state.step)
    if decay:
      ema = jax.tree.map(lambda e, x: decay * e + (1 - decay) * np.asarray(x, np.float64), ema, state.theta)
    if valid is not None and step % args.keep_best_every == 0:
      score = float(np.mean(valid.evaluate(lopt, state.theta, valid_key)[-tail:]))
      if score < best[0]:
        best = (score, step, jax.tree.map(np.asarray, state.theta))
  seconds = time.perf_counter() - start
  steps = int(state.step)
  thetas = {"init": theta0, "final": jax.tree.map(np.asarray, state.theta)}
  if valid is not None and best[1] > 0:
    thetas["best"] = best[2]
  if decay and steps > 0:
    thetas["ema"] = jax.tree.map(lambda e, x: (e / (1 - decay ** steps)).astype(x.dtype), ema, theta0)
  print(f"[{args.name}] {steps} meta-steps in {seconds:.0f} s; meta-loss first/last 50: "
        f"{np.nanmean(losses[:50]):.4f} / {np.nanmean(losses[-50:]):.4f}"
        + (f"; best validation {best[0]:.4f} at step {best[1]}" if valid is not None else ""), flush=True)

  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  if args.save_thetas:
    from metafam.runs import checkpoint
    os.makedirs(args.save_thetas, exist_ok=True)
    for label, theta in thetas.items():
      checkpoint.save(os.path.join(args.save_thetas, f"{args.name}_s{args.seed}_{label}.npz"), theta,
                      {"lopt": args.lopt, "lopt_kwargs": json.loads(args.lopt_kwargs), "meta_steps": steps})
  for fam_name in [args.family] + list(args.generalize):
    fam = family if fam_name == args.family else get_family(fam_name)
    ev = FamilyEvaluator(fam, 16, args.eval_steps)
    res = compare_with_tuned_adam(ev, lopt, thetas, jax.random.key(args.seed + 1_000_003))
    print(res.format_table(), flush=True)
    for label in res.learned:
      r = res.speedup(label)
      row = dict(name=args.name, family=fam_name, trained_on=args.family, theta=label, seed=args.seed,
                 lopt=args.lopt, lopt_kwargs=json.loads(args.lopt_kwargs), estimator=args.estimator,
                 pairs=args.pairs, unroll=args.unroll, trajectory=args.trajectory, schedule=args.schedule,
                 loss_kind=args.loss_kind, loss_type=args.loss_type, sigma=args.sigma, meta_lr=args.meta_lr,
                 cosine=args.cosine, theta_ema=args.theta_ema or None, meta_steps=steps,
                 train_seconds=round(seconds, 1),
                 best_step=best[1] if label == "best" else None,
                 final_loss=res.final_loss(label), adam_final_loss=res.adam_final_loss, adam_lr=res.adam_lr,
                 speedup=r.value, low=r.low, high=r.high, at_cap=res.at_cap(label),
                 speedup_of_mean_curve=res.scores[label].scores[0].speedup)
      with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
