#!/usr/bin/env bash
# test/emu/run_emu_tests.sh - runs the emulated CUDA tier's programs (test/emu/README.md); the
# make targets of test/emu/emu.mk build them first.
#
#   run_emu_tests.sh gpu  BIN   every test/gpu test on the emulator against the CPU backend, each
#                               launch under the forward and the reverse thread order with
#                               bitwise-equal results required (EMU_ORDER=forward,reverse), on the
#                               tests' emulated shapes (GPU_TEST_EMULATED=1)
#   run_emu_tests.sh asan BIN SELF
#                               the tests of the kernels with shared memory, tiles and vector paths
#                               in the AddressSanitizer (+ alignment) build (one order: the
#                               sanitizers are the check), and the self-tests built with it (one
#                               reads past a __shared__ array, one loads a misaligned int4)
#   run_emu_tests.sh self BIN   the emulator's own tests (test/emu/test_emu.cu), and two builds
#                               that must fail: an intrinsic and a PTX instruction the emulator
#                               does not provide must stop the build, naming them
#
# GPU_TEST_SEED=N repeats a run's random inputs (the programs print the seed they used).
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:?usage: run_emu_tests.sh gpu|asan|self BIN}
bin=${2:?usage: run_emu_tests.sh gpu|asan|self BIN}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

case "$mode" in
  gpu)
    EMU_ORDER=${EMU_ORDER:-forward,reverse} GPU_TEST_EMULATED=1 "$bin"
    ;;
  asan)
    # Fibers switch stacks under AddressSanitizer's feet: the emulator tells it (blocks.cpp), and
    # stack-use-after-return detection, which cannot follow such switches, stays off.
    status=0
    export ASAN_OPTIONS=detect_stack_use_after_return=0:detect_leaks=0
    if [ -n "${3:-}" ]; then "$3" || status=1; fi
    for t in layernorm sum_ add_ cast fp8_amax gelu attention_awkward attention_ragged \
             attention_block copy_columns classifier moe_ encoder_backward; do
      EMU_ORDER=forward GPU_TEST_EMULATED=1 "$bin" "$t" || status=1
    done
    exit $status
    ;;
  self)
    "$bin" || exit 1
    status=0
    for neg in unsupported_intrinsic:__ballot_sync unsupported_ptx:bar.sync; do
      src=test/emu/negative/${neg%%:*}.cu
      want=${neg#*:}
      out=$(make -s BUILD="${BUILD:-build}" "${BUILD:-build}/emu/obj/$src.o" 2>&1)
      if [ $? -ne 0 ] && grep -q -- "$want" <<<"$out"; then
        echo "  build of $src fails naming $want: ok"
      else
        echo "  build of $src should fail naming $want: FAIL"
        echo "$out" | tail -5
        status=1
      fi
    done
    exit $status
    ;;
  *)
    echo "run_emu_tests.sh: unknown mode $mode" >&2
    exit 2
    ;;
esac
