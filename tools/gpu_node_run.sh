#!/usr/bin/env bash
# tools/gpu_node_run.sh - the first runs on a GPU node, in order, from the offline bundle
# (docs/PERF.md, "On a GPU node"). The node needs the NVIDIA driver and the CUDA 13 libraries,
# and for the `train` tests a Python with numpy and torch; no MPI, HDF5, TOML++ or compiler, since
# nothing is built there: run `make bundle` on a build machine (~46 MB), copy the checkout with
# its bundle/ folder to the node (or just tools/ and bundle/ side by side) and run, from there:
#
#   tools/gpu_node_run.sh                    every part below, in this order
#   tools/gpu_node_run.sh info test          only the parts named, in the order given
#
# Parts, in the order to run them. The times are estimates for one H100 or H200, from the sizes
# of the runs: no part has run on a GPU yet.
#   info           GPU, driver, nvcc, Python packages, and which library every bundled
#                  program resolves to (bundle/run.sh check)                      (< 1 min)
#   test           bundle/run.sh test: every CUDA kernel against the CPU backend, the training
#                  runs GPU against CPU, every FP8 call of a step (test/run_gpu.sh)  (~4 min)
#   test-kernels, test-train, test-fp8   one group of it
#   bench-kernels  the kernel table: ceilings, memory-bound ops, GEMMs, attention   (~3 min)
#   e2e-124m       end-to-end tokens/s, MFU and memory per recompute mode, GPT-2 124M (~2 min)
#   e2e-1558m      the same for GPT-2 1.5B                                         (~5 min)
# The parts are independent: a failed one does not stop the next, and where jobs have a time
# limit each part can be its own job, in that order.
# Output: stdout and $OUT/gpu_node_run.log (OUT: build/gpu_node); the benchmark tables and logs
# also as $OUT/bench_out.tgz, one file to copy back. Exit status 1 if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUNDLE=${BUNDLE_DIR:-bundle}
OUT=${OUT:-build/gpu_node}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # absolute: bundle/run.sh runs from the bundle
if [ ! -x "$BUNDLE/run.sh" ]; then
  echo "gpu_node_run: no $BUNDLE/run.sh: run make bundle on a build machine and copy bundle/ here"
  exit 1
fi
export PYTHONUNBUFFERED=1 BENCH_OUT=$OUT/bench
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(info test bench-kernels e2e-124m e2e-1558m)

info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  command -v nvcc >/dev/null && nvcc --version | tail -2
  python3 -c "import sys, numpy, torch; print('python', sys.version.split()[0], 'numpy',
numpy.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda)" || true
  "$BUNDLE/run.sh" check | grep -vE "^ +bundle "  # only what comes from outside the bundle
}

status=0
{
  for part in "${parts[@]}"; do
    echo "######## gpu_node_run: $part ($(date -u +%H:%M:%S))"
    case $part in
      info) info ;;
      test) "$BUNDLE/run.sh" test ;;
      test-kernels) "$BUNDLE/run.sh" test kernels ;;
      test-train) "$BUNDLE/run.sh" test train ;;
      test-fp8) "$BUNDLE/run.sh" test fp8 ;;
      bench-kernels) "$BUNDLE/run.sh" bench kernels ;;
      e2e-124m|e2e-1558m) "$BUNDLE/run.sh" bench "$part" ;;
      *) echo "gpu_node_run: unknown part '$part'"; false ;;
    esac || { status=1; echo "######## gpu_node_run: $part FAILED"; }
  done
  exit $status
} 2>&1 | tee "$OUT/gpu_node_run.log"
status=${PIPESTATUS[0]}
[ -d "$BENCH_OUT" ] && tar -czf "$OUT/bench_out.tgz" -C "$(dirname "$BENCH_OUT")" \
  "$(basename "$BENCH_OUT")"
exit "$status"
