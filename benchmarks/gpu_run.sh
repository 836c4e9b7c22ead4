#!/usr/bin/env bash
# The GPU run: a test subset and the benchmarks on a lent accelerator, in at most 8 minutes, each step time-boxed.
#
#   bash benchmarks/gpu_run.sh            # from the repository root; results in $OUT (default ./gpu_run_out)
#
# Default steps and limits (docs/performance/index.md, "The GPU run", has the arithmetic behind each limit; they sum
# to 480 s): install the carried wheels if dm-haiku is missing (20 s); tests: the GPU-relevant test files on the GPU
# ($GPU_TESTS below), pytest's summary kept even when the limit stops it (200 s); inner_training:
# benchmarks/inner_training.py, MLPLOpt and Adam at 64 and 1,024 lanes, both reset strategies (90 s); profile:
# benchmarks/profile_inner.py, a per-kernel profile of metafam's unroll and the minimal program at 1,024 lanes,
# MLPLOpt and Adam, their programs read back from the inner step's compilation cache (50 s); outer_training:
# benchmarks/outer_training.py, PES with full and rank-1 noise (70 s); step_cost: benchmarks/step_cost.py on the
# 12.8M-parameter MLP, every pretrained optimizer and muon_residual_lopt at init (50 s). $OUT receives gpu_run.log (everything printed),
# tests.md, inner_training.md, profile.md, outer_training.md and step_cost.md, each headed by the device, the JAX
# version and the date (at most 8 files come back from the device: keep it so).
#
# Optional steps, each run as its own command (METAFAM_GPU_RUN_STEPS=NAME):
#   outer_reference  benchmarks/outer_training.py against learned_optimization in the same process (its source carried
#                    in $METAFAM_LO_SRC, gin-config among the wheels): PES and FullES, 8 pairs, full noise, both
#                    meta-losses (240 s) -> outer_reference.md
#   meta_train       (issue 39) meta-trains a recipe (experiments/generalist_v2/recipe_c.json, candidate c, by default)
#                    from scratch until its time limit, when `timeout` sends SIGTERM and the run checkpoints the step
#                    in flight and stops. The checkpoint holds every lane's task state, too large to come back from
#                    the device, so $OUT receives the run's theta alone (meta_train_theta.npz, from
#                    experiments/export_pretrained.py --candidate) and its metrics (meta_train_metrics.jsonl). Its
#                    families read the full Fashion-MNIST from $METAFAM_FASHION_MNIST_DIR (default
#                    .device/fashion-mnist when that folder exists).
#
# Environment (defaults in brackets):
#   OUT                        where results go [./gpu_run_out]
#   METAFAM_WHEELS             wheels installed when `import haiku` fails [.device/wheels]
#   METAFAM_LO_SRC             learned_optimization 0.0.1's unpacked source [.device/lo/learned_optimization-0.0.1]
#   METAFAM_GPU_RUN_SMOKE      1: every benchmark with --smoke (the CPU test of this script) [0]
#   METAFAM_GPU_RUN_TESTS      what pytest runs [$GPU_TESTS]
#   METAFAM_GPU_RUN_WORKERS    pytest-xdist workers [8]
#   METAFAM_GPU_RUN_LIMITS     seconds for tests, inner_training, profile, outer_training, step_cost, outer_reference,
#                              meta_train ["200 90 50 70 50 240 420"]
#   METAFAM_GPU_RUN_STEPS      the steps run, of tests inner_training profile outer_training step_cost outer_reference
#                              meta_train ["tests inner_training profile outer_training step_cost"]
#   METAFAM_GPU_RUN_RECIPE     meta_train's recipe [experiments/generalist_v2/recipe_c.json]
#   PYTHON                     the interpreter [python3]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_run_out}
PYTHON=${PYTHON:-python3}
WHEELS=${METAFAM_WHEELS:-.device/wheels}
LO_SRC=${METAFAM_LO_SRC:-.device/lo/learned_optimization-0.0.1}
SMOKE=${METAFAM_GPU_RUN_SMOKE:-0}
# The test files whose code runs on the accelerator (the engine, the estimators, the optimizers, numerics and dtypes):
# 719 s of test time on 2 workers of the 2-core machine, ~3 minutes over 8 workers on the GPU (the docs' arithmetic).
GPU_TESTS="tests/outer_trainers/test_numerics.py tests/inner/test_inner.py tests/outer_trainers/test_estimators.py \
tests/outer_trainers/test_estimator_conformance.py tests/outer_trainers/test_meta_trainer.py \
tests/optimizers/test_muon_lopt.py tests/optimizers/test_newton_schulz.py tests/optimizers/test_learned_optimizers.py \
tests/optimizers/test_optimizers.py tests/inner/test_lane_chunk.py tests/optimizers/test_low_rank.py"
TESTS=${METAFAM_GPU_RUN_TESTS:-$GPU_TESTS}
WORKERS=${METAFAM_GPU_RUN_WORKERS:-8}
read -r LIMIT_TESTS LIMIT_INNER LIMIT_PROFILE LIMIT_OUTER LIMIT_STEP LIMIT_REFERENCE LIMIT_META \
  <<< "${METAFAM_GPU_RUN_LIMITS:-200 90 50 70 50 240 420}"
LIMIT_REFERENCE=${LIMIT_REFERENCE:-240}
LIMIT_META=${LIMIT_META:-420}
STEPS=" ${METAFAM_GPU_RUN_STEPS:-tests inner_training profile outer_training step_cost} "
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

# step NAME SECONDS COMMAND...: runs COMMAND under `timeout` (signal $SIGNAL at the limit, SIGKILL $GRACE s later),
# its output appended to the log; a step that ends at its limit fails unless $LIMIT_IS_OK is 1.
GRACE=10
LIMIT_IS_OK=0
SIGNAL=TERM
step() {
  local name=$1 limit=$2 start rc
  shift 2
  start=$(date +%s)
  say "== $name (limit ${limit} s): $*"
  timeout -s "$SIGNAL" -k "$GRACE" "$limit" "$@" >> "$LOG" 2>&1
  rc=$?
  say "== $name: exit $rc after $(( $(date +%s) - start )) s$([ "$rc" = 124 ] && echo ' (timed out)')"
  [ "$rc" = 0 ] || { [ "$rc" = 124 ] && [ "$LIMIT_IS_OK" = 1 ]; } || failures=$((failures + 1))
  return "$rc"
}
wants() { [[ "$STEPS" == *" $1 "* ]]; }

: > "$LOG"
if ! "$PYTHON" -c "import haiku" 2> /dev/null; then
  if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    step install 20 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
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
if wants tests; then
# SIGINT at the limit: pytest stops as on Ctrl-C and still prints its summary of the tests run so far. GPU kernels are
# not autotuned (XLA's heuristic choice, the same results up to rounding): compiling is most of a test's time.
# shellcheck disable=SC2086  # $TESTS is a list of pytest arguments
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" SIGNAL=INT step tests "$LIMIT_TESTS" "$PYTHON" -m pytest -q \
  -p no:cacheprovider -n "$WORKERS" -m "not slow" $TESTS
tests_rc=$?
{
  echo "## Test suite"
  echo
  echo "$ENV_LINE"
  echo
  echo "\`python -m pytest -q -n $WORKERS -m 'not slow' $TESTS\` (GPU kernels not autotuned): exit $tests_rc$( \
       [ "$tests_rc" = 124 ] && echo ", stopped at the ${LIMIT_TESTS} s limit (the summary counts the tests run)")"
  echo
  echo '```'
  grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed|error)|KeyboardInterrupt|Interrupted" "$LOG" | tail -n 40
  echo '```'
} > "$OUT/tests.md"
cat "$OUT/tests.md"
fi

# The benchmark steps share a persistent compilation cache (this run's only), so that the profile step reads the inner
# step's 1,024-lane programs back instead of compiling them again. The XLA:CPU trace flag the profile step needs is
# set for both (XLA's flags are part of the cache's keys; it changes nothing in GPU programs).
BENCH_CACHE=$(mktemp -d)
export JAX_COMPILATION_CACHE_DIR=$BENCH_CACHE JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.5
TRACE_FLAGS="${XLA_FLAGS:-} --xla_cpu_enable_xprof_traceme=true"

wants inner_training && XLA_FLAGS=$TRACE_FLAGS step inner_training "$LIMIT_INNER" "$PYTHON" \
  benchmarks/inner_training.py --lanes 64 1024 --devices 1 --skip naive ref_style --other_reset --rounds 3 \
  --markdown "$OUT/inner_training.md" "${smoke[@]}"
wants profile && XLA_FLAGS=$TRACE_FLAGS step profile "$LIMIT_PROFILE" "$PYTHON" benchmarks/profile_inner.py \
  --optimizers mlp_lopt adam --lanes 1024 --calls 3 --markdown "$OUT/profile.md" "${smoke[@]}"
wants outer_training && step outer_training "$LIMIT_OUTER" "$PYTHON" benchmarks/outer_training.py --estimators pes \
  --devices 1 --steps 10 --perturbations full low_rank:1 --markdown "$OUT/outer_training.md" "${smoke[@]}"
wants step_cost && step step_cost "$LIMIT_STEP" "$PYTHON" benchmarks/step_cost.py --mlp_widths 3200 --cnn_channels \
  --learned muon_residual_lopt --markdown "$OUT/step_cost.md" "${smoke[@]}"
if wants outer_reference; then
  if [ -f "$LO_SRC/learned_optimization/__init__.py" ] && "$PYTHON" -c "import gin" 2> /dev/null; then
    step outer_reference "$LIMIT_REFERENCE" "$PYTHON" benchmarks/outer_training.py --estimators pes --devices 1 \
      --steps 10 --pairs 8 --perturbations full --reference_src "$LO_SRC" --markdown "$OUT/outer_reference.md" \
      "${smoke[@]}"
  else
    say "== outer_reference: learned_optimization not carried in $LO_SRC (or gin-config missing): not run"
    failures=$((failures + 1))
  fi
fi
rm -rf "$BENCH_CACHE"
unset JAX_COMPILATION_CACHE_DIR JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS
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
