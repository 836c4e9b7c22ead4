#!/usr/bin/env bash
# Polyak/EMA averaging of theta for the main job's settings (AdafacMLPLOpt step_mult 1e-2, NRES, 8 pairs,
# truncations of 10 in trajectories of 200, sigma 0.01, constant meta-lr 3e-3, clipping 1), stopped at --max_steps.
# Usage: experiments/run_theta_ema.sh NAME --theta_ema 0.999 --max_steps 12000 --seed 0
set -u
cd "$(dirname "$0")/.."
PY=${PY:-/work/venv/bin/python}
name=$1; shift
echo "== $name $(date -u +%H:%M:%S)"
nice -n 10 "$PY" experiments/ablation.py --name "$name" --lopt adafac_mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' \
  --estimator nres --minutes 60 "$@" > "experiments/results/logs/$name.log" 2>&1
grep -v Warn "experiments/results/logs/$name.log" | grep -E "meta-steps|^(init|final|best|ema) "
echo "== done $name $(date -u +%H:%M:%S)"
