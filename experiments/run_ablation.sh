#!/usr/bin/env bash
# The ablation queue behind README "Performance" (meta-training): one run at a time, niced (shared machine).
# Each row: 3 minutes of meta-training wall time (compilation and keep-best validation included), then the held-out
# comparison with tuned Adam; rows go to experiments/results/ablation.jsonl, logs to experiments/results/logs/.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-/work/venv/bin/python}
GEN="--generalize mlp_16x16_64 fmnist_ae_family_8x8_32x8x32"
run() { local name=$1; shift; echo "== $name $(date -u +%H:%M:%S)"; nice -n 10 "$PY" experiments/ablation.py --name "$name" \
  --keep_best_every 100 --minutes 3 "$@" > "experiments/results/logs/$name.log" 2>&1; grep -v Warn "experiments/results/logs/$name.log" | grep -E "meta-steps|^(init|final|best) " ; }
[ "${SKIP_FIRST:-0}" = 1 ] || run nom_lr0.05_s0 --lopt mlp_nom_lopt --lopt_kwargs '{"initial_lr": 0.05}' $GEN
run mlp_sm1e-2_s0 --lopt mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' $GEN
run nom_lr0.05_metalr1e-3_s0 --lopt mlp_nom_lopt --lopt_kwargs '{"initial_lr": 0.05}' --meta_lr 1e-3
run mlp_sm1e-2_s1 --lopt mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --seed 1
run nom_lr0.05_s1 --lopt mlp_nom_lopt --lopt_kwargs '{"initial_lr": 0.05}' --seed 1
run mlp_traj50_s0 --lopt mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --trajectory 50
run mlp_fulles_last_s0 --lopt mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --estimator full_es --loss_type last
run mlp_fulles_avg_s0 --lopt mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --estimator full_es --loss_type avg
run mlp_trainloss_s0 --lopt mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --loss_kind normalized_loss
run mlp_loguniform_s0 --lopt mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --schedule loguniform --min_trajectory 20
run mlp_cosine_s0 --lopt mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --cosine --cosine_steps 2000
run ae_mlp_sm1e-2_s0 --family fmnist_ae_family_8x8_32x8x32 --lopt mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --generalize fmnist_mlp_family_8x8_32
run ae_nom_lr0.05_s0 --family fmnist_ae_family_8x8_32x8x32 --lopt mlp_nom_lopt --lopt_kwargs '{"initial_lr": 0.05}' --generalize fmnist_mlp_family_8x8_32
echo "== done $(date -u +%H:%M:%S)"
