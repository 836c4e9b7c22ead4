#!/usr/bin/env bash
# Third queue (after run_after.sh): the best setting (MLPNomLOpt at a nominal lr of 0.05, meta-lr 1e-3) on more seeds.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-/work/venv/bin/python}
while pgrep -f "run_after.sh|run_ablation.sh" > /dev/null; do sleep 10; done
run() { local name=$1; shift; echo "== $name $(date -u +%H:%M:%S)"; nice -n 10 "$PY" experiments/ablation.py \
  --name "$name" --keep_best_every 100 "$@" > "experiments/results/logs/$name.log" 2>&1; }
run nom_lr0.05_metalr1e-3_s1 --minutes 3 --seed 1 --lopt mlp_nom_lopt --lopt_kwargs '{"initial_lr": 0.05}' --meta_lr 1e-3
run nom_lr0.05_metalr1e-3_5min_s2 --minutes 5 --seed 2 --lopt mlp_nom_lopt --lopt_kwargs '{"initial_lr": 0.05}' \
  --meta_lr 1e-3
echo "== done $(date -u +%H:%M:%S)"
