#!/usr/bin/env bash
# After run_adafac.sh: the 8-minute AdafacMLPLOpt NRES run on a second seed.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-/work/venv/bin/python}
while pgrep -f "experiments/run_adafac.sh" > /dev/null; do sleep 5; done
echo "== adafac_nres_8min_s1 $(date -u +%H:%M:%S)"
nice -n 10 "$PY" experiments/ablation.py --name adafac_nres_8min_s1 --keep_best_every 200 --minutes 8 --seed 1 \
  --lopt adafac_mlp_lopt --lopt_kwargs '{"step_mult": 0.01}' --estimator nres > experiments/results/logs/adafac_nres_8min_s1.log 2>&1
echo "== done $(date -u +%H:%M:%S)"
