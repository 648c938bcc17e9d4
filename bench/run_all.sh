#!/usr/bin/env bash
# bench/run_all.sh - the GPU benchmarks (`make bench`, bundle/run.sh bench), one table at the end.
# Needs an NVIDIA GPU. docs/PERF.md explains every column and target.
#
#   bench/run_all.sh [kernels] [e2e] [e2e-124m] [e2e-1558m]     (default: kernels e2e)
#
#   kernels    $BUILD/bench_kernels: copy bandwidth and bf16 GEMM rate measured first, then the
#              memory-bound kernels (% of copy bandwidth), GPT-2 GEMM shapes (% of GEMM rate),
#              attention fwd/bwd TFLOP/s per implementation
#   e2e        bench/e2e.py: ./train on GPT-2 124M and 1.5B in bf16 on synthetic tokens, the
#              largest micro-batch that fits per recompute mode, tokens/s, MFU, peak memory
#   e2e-124m, e2e-1558m   one model only (a shorter job each; tools/gpu_node_run.sh runs both)
#
# Environment: BUILD (build), TRAIN (./train), PYTHON (python3; the e2e driver needs only the
# standard library), BENCH_OUT (where logs and tables go; $BUILD/bench), BENCH_ARGS (extra
# arguments for bench_kernels, e.g. "--samples 30"), E2E_ARGS (extra arguments for bench/e2e.py,
# e.g. "--steps 30 --recompute none").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
TRAIN=${TRAIN:-./train}
PY=${PYTHON:-python3}
OUT=${BENCH_OUT:-$BUILD/bench}
mkdir -p "$OUT"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(kernels e2e)

status=0
tables=()
for part in "${parts[@]}"; do
  case $part in
    kernels)
      if [ ! -x "$BUILD/bench_kernels" ]; then
        echo "run_all: $BUILD/bench_kernels missing (make bench)"
        exit 1
      fi
      "$BUILD/bench_kernels" --tsv "$OUT/kernels.tsv" ${BENCH_ARGS:-} \
        | tee "$OUT/kernels.log" || status=1
      sed -n '/^==== kernel benchmark/,$p' "$OUT/kernels.log" > "$OUT/kernels_table.txt"
      tables+=("$OUT/kernels_table.txt") ;;
    e2e|e2e-124m|e2e-1558m)
      models=124m,1558m
      [ "$part" != e2e ] && models=${part#e2e-}
      $PY bench/e2e.py --train "$TRAIN" --models "$models" --out "$OUT" ${E2E_ARGS:-} \
        | tee "$OUT/e2e_$models.log" || status=1
      sed -n '/^==== end-to-end/,$p' "$OUT/e2e_$models.log" > "$OUT/e2e_${models}_table.txt"
      tables+=("$OUT/e2e_${models}_table.txt") ;;
    *) echo "run_all: unknown part '$part' (kernels, e2e, e2e-124m, e2e-1558m)"; exit 2 ;;
  esac
done

echo
echo "################ benchmark summary ($(date -u +%Y-%m-%dT%H:%MZ)) ################"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
for t in "${tables[@]}"; do
  echo
  cat "$t"
done
echo
echo "logs and tables: $OUT"
exit $status
