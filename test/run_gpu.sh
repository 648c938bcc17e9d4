#!/usr/bin/env bash
# test/run_gpu.sh - the GPU test suite: `make test-gpu` (after building), or bundle/run.sh test on
# a GPU node without compilers. Needs an NVIDIA GPU.
#
#   test/run_gpu.sh [kernels|train|fp8]... [--only PATTERN]    (default: all three groups)
#
#   kernels  $BUILD/test_gpu: every CUDA op against the CPU backend (test/gpu/*.cu)
#   train    test/test_gpu_train.py: the whole model's loss and gradients GPU vs CPU, ./train vs
#            ./train_cpu, bf16 vs fp32 over 100 steps, FSDP over MPI with 2 ranks on one GPU,
#            recompute (see its docstring for the tolerances)
#   fp8      $BUILD/cuda_test_fp8_sites: every FP8 linear call of a training step on the GPU
#            (cuBLASLt FP8 GEMMs, the cast and amax kernels) against float64 on operands decoded
#            from the recipe's scales, tensorwise and delayed, dense and MoE
#            (test/test_fp8_sites.cpp; its rounding bounds assume fp32 accumulation)
#
# Paths come from the environment, so the same script runs in the repository and in the bundle:
# BUILD (build), TRAIN (./train), TRAIN_CPU (./train_cpu), MPIRUN (mpirun), PYTHON (the first of
# /usr/bin/python3 and python3 that imports numpy and torch). Exit status 1 if any group failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export BUILD=${BUILD:-build} TRAIN=${TRAIN:-./train} TRAIN_CPU=${TRAIN_CPU:-./train_cpu}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
source test/suite.sh
suite_options "$@"  # --only PATTERN: TEST_ONLY for test_gpu_train.py and cuda_test_fp8_sites
groups=(${SUITE_ARGS[@]+"${SUITE_ARGS[@]}"})
[ ${#groups[@]} -eq 0 ] && groups=(kernels train fp8)

if command -v nvidia-smi >/dev/null && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run_gpu: nvidia-smi sees no GPU; these tests need one (use make test on a CPU machine)"
  exit 1
fi
missing=()
for f in "$BUILD/test_gpu" "$BUILD/test_model_grads" "$BUILD/cuda_test_model_grads" \
         "$BUILD/cuda_test_fp8_sites" "$TRAIN" "$TRAIN_CPU"; do
  [ -x "$f" ] || missing+=("$f")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "run_gpu: missing programs: ${missing[*]} (build them with: make test-gpu BUILD=$BUILD)"
  exit 1
fi

pick_python() {
  local p
  for p in ${PYTHON:-} /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null && "$p" -c "import numpy, torch" 2>/dev/null; then
      echo "$p"
      return
    fi
  done
}
PY=$(pick_python)

for g in "${groups[@]}"; do
  case $g in
    kernels) run kernels "$BUILD/test_gpu" ;;
    train)
      if [ -z "$PY" ]; then
        skip train "no Python with numpy and torch (tried ${PYTHON:-} /usr/bin/python3 python3;
          set PYTHON=...); test/test_gpu_train.py did not run"
      else
        run train env PYTHONUNBUFFERED=1 "$PY" test/test_gpu_train.py
      fi ;;
    fp8)
      for args in "tensorwise 0" "delayed 0" "tensorwise 1" "delayed 1"; do
        run "fp8-sites-${args// /-moe}" "$BUILD/cuda_test_fp8_sites" $args "$RANDOM"
      done ;;
    *) echo "run_gpu: unknown group '$g' (kernels, train, fp8)"; exit 2 ;;
  esac
done

suite_finish run_gpu
