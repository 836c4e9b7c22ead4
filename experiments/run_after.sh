#!/usr/bin/env bash
# Second queue (after run_ablation.sh): the benchmark budgets and the hand-designed oracle at a longer horizon.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-/work/venv/bin/python}
while pgrep -f run_ablation.sh > /dev/null; do sleep 10; done
echo "== benchmark $(date -u +%H:%M:%S)"
nice -n 10 "$PY" benchmarks/meta_training.py --budgets 1,3 > experiments/results/logs/benchmark_1_3.log 2>&1
echo "== oracle 1000 $(date -u +%H:%M:%S)"
nice -n 10 "$PY" experiments/adam_schedules.py --steps 1000 --constant_lrs 0.01 0.03 0.05 --decay_lrs 0.03 0.05 0.1 \
  > experiments/results/logs/adam_schedules_1000.log 2>&1
echo "== done $(date -u +%H:%M:%S)"
