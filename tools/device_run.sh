#!/usr/bin/env bash
# tools/device_run.sh - what to run on a GPU machine lent by this workplace's `device` tool
# (/work/.library/device/README.md), from the bundle made here (docs/PERF.md "On a lent GPU").
# Such a machine has the driver, CUDA, Python with numpy and torch, but no MPI, HDF5 or TOML++,
# so nothing is built there: build the bundle on this machine (`make bundle`, ~46 MB), then call
# the tool's run with carry ["bundle"] and a command such as
#
#   tools/device_run.sh info test                 (~5 min: the whole GPU test suite)
#   tools/device_run.sh bench-kernels e2e-124m    (~5 min)
#   tools/device_run.sh e2e-1558m                 (~5 min)
#
# Each call may run 10 minutes and a session has 30 minutes of device time in all, so the parts
# are split to fit; a machine stays warm only 30 s between calls. Parts, in the order given:
#   info           GPU, driver, nvcc, Python packages, and bundle/run.sh check (library lookup)
#   test           bundle/run.sh test (kernels vs CPU, then test_gpu_train.py)
#   test-kernels, test-train   one group of it
#   bench-kernels  the kernel table (ceilings, memory-bound ops, GEMMs, attention)
#   e2e-124m, e2e-1558m        end-to-end tokens/s, MFU, memory per recompute mode
# Output: everything goes to stdout (the tool returns its last 12,000 characters) and to
# $OUT/device_run.log; the benchmark tables and logs come back as $OUT/bench_out.tgz.
# Exit status 1 if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUNDLE=${BUNDLE_DIR:-bundle}
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
if [ ! -x "$BUNDLE/run.sh" ]; then
  echo "device_run: no $BUNDLE/run.sh: run make bundle on the build machine and carry it"
  exit 1
fi
export PYTHONUNBUFFERED=1 BENCH_OUT=/tmp/bench_out
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(info test)

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
    echo "######## device_run: $part ($(date -u +%H:%M:%S))"
    case $part in
      info) info ;;
      test) "$BUNDLE/run.sh" test ;;
      test-kernels) "$BUNDLE/run.sh" test kernels ;;
      test-train) "$BUNDLE/run.sh" test train ;;
      bench-kernels) "$BUNDLE/run.sh" bench kernels ;;
      e2e-124m|e2e-1558m) "$BUNDLE/run.sh" bench "$part" ;;
      *) echo "device_run: unknown part '$part'"; false ;;
    esac || { status=1; echo "######## device_run: $part FAILED"; }
  done
  exit $status
} 2>&1 | tee "$OUT/device_run.log"
status=${PIPESTATUS[0]}
[ -d "$BENCH_OUT" ] && tar -czf "$OUT/bench_out.tgz" -C "$(dirname "$BENCH_OUT")" \
  "$(basename "$BENCH_OUT")"
exit "$status"
