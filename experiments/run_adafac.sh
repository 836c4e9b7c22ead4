#!/usr/bin/env bash
# AdafacMLPLOpt (step_mult 1e-2) with NRES at 5 and 8 minutes on two seeds: the best per-minute setting of the benchmark.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-/work/venv/bin/python}
run() { local name=$1; shift; echo "== $name $(date -u +%H:%M:%S)"; nice -n 10 "$PY" experiments/ablation.py \
  --name "$name" --keep_best_every 200 "$@" > "experiments/results/logs/$name.log" 2>&1; }
run adafac_nres_5min_s1 --minutes 5 --seed 1 --lopt adafac_mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --estimator nres \
  --generalize mlp_16x16_64
run adafac_nres_8min_s0 --minutes 8 --seed 0 --lopt adafac_mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --estimator nres
echo "== done $(date -u +%H:%M:%S)"
