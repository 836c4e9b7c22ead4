#!/usr/bin/env bash
# The GPU run: the test suite and the benchmarks on a lent accelerator, in about 8 minutes, each step time-boxed.
#
#   bash benchmarks/gpu_run.sh            # from the repository root; results in $OUT (default ./gpu_run_out)
#
# Steps (docs/performance/index.md, "The GPU run"): install the carried wheels if dm-haiku is missing; the default
# test suite minus the tests that need tools the machine lacks (the docs build, the wheel build), on the GPU, with
# pytest's summary printed and kept; benchmarks/inner_training.py up to 4,096 lanes; benchmarks/outer_training.py
# (PES with full and low-rank noise, and learned_optimization in the same run when its source is carried);
# benchmarks/step_cost.py with a 12.8M-parameter MLP (and muon_residual_lopt at init: its cost over Muon's). $OUT
# receives gpu_run.log (everything printed), tests.md, inner_training.md, outer_training.md and step_cost.md, each
# headed by the device, the JAX version and the date.
#
# The optional step meta_train (issue 39: METAFAM_GPU_RUN_STEPS=meta_train) meta-trains a recipe
# (experiments/generalist_v2/recipe_c.json, candidate c, by default) from scratch until its time limit, when
# `timeout` sends SIGTERM and the run checkpoints the step in flight and stops. The checkpoint holds every lane's task
# state, too large to come back from the device, so $OUT receives the run's theta alone (meta_train_theta.npz, from
# experiments/export_pretrained.py --candidate) and its metrics (meta_train_metrics.jsonl). Its families read the full
# Fashion-MNIST from $METAFAM_FASHION_MNIST_DIR (default .device/fashion-mnist when that folder exists).
#
# Environment (defaults in brackets):
#   OUT                        where results go [./gpu_run_out]
#   METAFAM_WHEELS             wheels installed when `import haiku` fails [.device/wheels]
#   METAFAM_LO_SRC             learned_optimization 0.0.1's unpacked source [.device/lo/learned_optimization-0.0.1]
#   METAFAM_GPU_RUN_SMOKE      1: every benchmark with --smoke (the CPU test of this script) [0]
#   METAFAM_GPU_RUN_TESTS      what pytest runs [tests]
#   METAFAM_GPU_RUN_WORKERS    pytest-xdist workers [8]
#   METAFAM_GPU_RUN_LIMITS     seconds for tests, inner, outer, step_cost, meta_train ["230 75 90 60 420"]
#   METAFAM_GPU_RUN_STEPS      the steps run, of tests inner_training outer_training step_cost meta_train
#                              ["tests inner_training outer_training step_cost"]
#   METAFAM_GPU_RUN_RECIPE     meta_train's recipe [experiments/generalist_v2/recipe_c.json]
#   PYTHON                     the interpreter [python3]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_run_out}
PYTHON=${PYTHON:-python3}
WHEELS=${METAFAM_WHEELS:-.device/wheels}
LO_SRC=${METAFAM_LO_SRC:-.device/lo/learned_optimization-0.0.1}
SMOKE=${METAFAM_GPU_RUN_SMOKE:-0}
TESTS=${METAFAM_GPU_RUN_TESTS:-tests}
WORKERS=${METAFAM_GPU_RUN_WORKERS:-8}
read -r LIMIT_TESTS LIMIT_INNER LIMIT_OUTER LIMIT_STEP LIMIT_META <<< "${METAFAM_GPU_RUN_LIMITS:-230 75 90 60 420}"
LIMIT_META=${LIMIT_META:-420}
STEPS=" ${METAFAM_GPU_RUN_STEPS:-tests inner_training outer_training step_cost} "
RECIPE=${METAFAM_GPU_RUN_RECIPE:-experiments/generalist_v2/recipe_c.json}
if [ -z "${METAFAM_FASHION_MNIST_DIR:-}" ] && [ -d .device/fashion-mnist ]; then
  export METAFAM_FASHION_MNIST_DIR=$PWD/.device/fashion-mnist
fi
mkdir -p "$OUT"
LOG=$OUT/gpu_run.log
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # the pytest workers share the one GPU
failures=0

say() { echo "$*" | tee -a "$LOG"; }

# step NAME SECONDS COMMAND...: runs COMMAND under `timeout` (SIGTERM at the limit, SIGKILL $GRACE s later), its
# output appended to the log; a step that ends at its limit fails unless $LIMIT_IS_OK is 1.
GRACE=10
LIMIT_IS_OK=0
step() {
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  say "== $name (limit ${limit} s): $*"
  timeout -k "$GRACE" "$limit" "$@" >> "$LOG" 2>&1
  rc=$?
  say "== $name: exit $rc after $(( $(date +%s) - start )) s$([ "$rc" = 124 ] && echo ' (timed out)')"
  [ "$rc" = 0 ] || { [ "$rc" = 124 ] && [ "$LIMIT_IS_OK" = 1 ]; } || failures=$((failures + 1))
  return "$rc"
}
wants() { [[ "$STEPS" == *" $1 "* ]]; }

: > "$LOG"
if ! "$PYTHON" -c "import haiku" 2> /dev/null; then
  if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    step install 60 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$WHEELS"/*.whl
    export PYTHONPATH=$PYTHONPATH:/tmp/site  # after the repository: the checkout's metafam wins
  else
    say "dm-haiku is not installed and no wheels are in $WHEELS (see docs/performance/index.md)"
  fi
fi
ENV_LINE=$("$PYTHON" -c "import sys; sys.path.insert(0, 'benchmarks'); import bench_common; \
print(bench_common.environment())" 2>> "$LOG")
say "environment: $ENV_LINE"

smoke=()
[ "$SMOKE" = 1 ] && smoke=(--smoke)
reference=()
if [ -f "$LO_SRC/learned_optimization/__init__.py" ] && "$PYTHON" -c "import gin" 2> /dev/null; then
  reference=(--reference_src "$LO_SRC")
else
  say "learned_optimization not carried (or gin-config missing): outer_training.py runs without it"
fi

if wants tests; then
# shellcheck disable=SC2086  # $TESTS is a list of pytest arguments
step tests "$LIMIT_TESTS" "$PYTHON" -m pytest -q -p no:cacheprovider -n "$WORKERS" -m "not slow" \
  --ignore=tests/test_docs.py --ignore=tests/test_wheel.py $TESTS
tests_rc=$?
{
  echo "## Test suite"
  echo
  echo "$ENV_LINE"
  echo
  echo "\`python -m pytest -q -n $WORKERS -m 'not slow' --ignore=tests/test_docs.py --ignore=tests/test_wheel.py" \
       "$TESTS\`: exit $tests_rc$([ "$tests_rc" = 124 ] && echo ", stopped at the ${LIMIT_TESTS} s limit")"
  echo
  echo '```'
  grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed|error)" "$LOG" | tail -n 40
  echo '```'
} > "$OUT/tests.md"
cat "$OUT/tests.md"
fi

wants inner_training && step inner_training "$LIMIT_INNER" "$PYTHON" benchmarks/inner_training.py \
  --lanes 1 64 1024 4096 --devices 1 --skip naive ref_style --rounds 5 --markdown "$OUT/inner_training.md" \
  "${smoke[@]}"
# (the default --perturbations: full, low_rank:1, low_rank:4)
wants outer_training && step outer_training "$LIMIT_OUTER" "$PYTHON" benchmarks/outer_training.py --estimators pes \
  --devices 1 --steps 10 --markdown "$OUT/outer_training.md" "${reference[@]}" "${smoke[@]}"
wants step_cost && step step_cost "$LIMIT_STEP" "$PYTHON" benchmarks/step_cost.py --mlp_widths 1024 3200 \
  --cnn_channels 128 256 512 --learned muon_residual_lopt --markdown "$OUT/step_cost.md" "${smoke[@]}"
if wants meta_train; then
  run_dir=$(mktemp -d)/run  # not under $OUT: the checkpoint is too large to come back
  GRACE=120 LIMIT_IS_OK=1 step meta_train "$LIMIT_META" "$PYTHON" -m metafam meta-train --recipe "$RECIPE" \
    --output_dir "$run_dir" --checkpoint_every 25 --progress=false
  step export_theta 120 "$PYTHON" experiments/export_pretrained.py "$run_dir/checkpoint.npz" --candidate \
    --out "$OUT/meta_train_theta.npz"
  cp "$run_dir/metrics.jsonl" "$OUT/meta_train_metrics.jsonl" 2>> "$LOG" || failures=$((failures + 1))
fi

say "gpu_run: $failures step(s) failed; results in $OUT"
[ "$failures" = 0 ]
