#!/usr/bin/env bash
# test/emu/run_emu_tests.sh - runs the emulated CUDA tier's programs (test/emu/README.md); the
# make targets of test/emu/emu.mk build them first.
#
#   run_emu_tests.sh gpu  BIN   every test/gpu test on the emulator against the CPU backend, on the
#                               tests' emulated shapes (GPU_TEST_EMULATED=1): each launch once,
#                               under a random thread order (EMU_ORDER=random:SEED, a fresh seed,
#                               printed: a thread reading what another writes without a barrier
#                               reads it unwritten in one direction or the other, and the
#                               comparison with the CPU shows it); with TEST_FULL=1 (make
#                               test-emu-full) the order check: each launch under the forward and
#                               the reverse order with bitwise-equal results required
#                               (EMU_ORDER=forward,reverse), twice the time
#   run_emu_tests.sh asan BIN SELF
#                               the tests of the kernels with shared memory, tiles and vector paths
#                               in the AddressSanitizer (+ alignment) build (one order: the
#                               sanitizers are the check), and the self-tests built with it (one
#                               reads past a __shared__ array, one loads a misaligned int4); one
#                               test per kernel family (rmsnorm shares layernorm's backward
#                               reduction, gelu and add_ swiglu's and cast's vector paths, fp8_amax
#                               sum_'s reduction, attention_ragged attention_awkward's flash
#                               tiles): those five with TEST_FULL=1 only (make test-emu-full)
#   run_emu_tests.sh train BIN  the whole CUDA trainer on the emulator (BIN: ./train_emu) against
#                               ./train_cpu: test/test_gpu_train.py at its emulated sizes, with
#                               $BUILD/emu/test_model_grads as the CUDA model program; one order
#                               (forward) but a rerun in reverse (see the test's docstring); and
#                               $BUILD/emu/test_fp8_sites (test/test_fp8_sites.cpp) before it
#   run_emu_tests.sh streams BIN
#                               the trainer's layouts under the stream schedules of EMU_STREAMS,
#                               bitwise against sync, and sabotaged copies that must fail
#                               (test/test_stream_schedules.py; TEST_FULL=1: the full matrix)
#                               and [kernels] cuda_graph's replays bitwise against eager runs
#                               (test/test_cuda_graphs.py; TEST_FULL=1: its sabotaged copy too)
#   run_emu_tests.sh self BIN   the emulator's own tests (test/emu/test_emu.cu), and two builds
#                               that must fail: an intrinsic and a PTX instruction the emulator
#                               does not provide must stop the build, naming them
#
# GPU_TEST_SEED=N repeats a run's random inputs (the programs print the seed they used).
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:?usage: run_emu_tests.sh gpu|asan|self|train|streams BIN}
bin=${2:?usage: run_emu_tests.sh gpu|asan|self|train|streams BIN}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

case "$mode" in
  gpu)
    if [ "${TEST_FULL:-0}" = 1 ]; then orders=forward,reverse; else orders=random:$RANDOM$RANDOM; fi
    orders=${EMU_ORDER:-$orders}
    echo "emu-gpu: EMU_ORDER=$orders$([ "${TEST_FULL:-0}" = 1 ] || echo " (the order check" \
      "forward,reverse only with TEST_FULL=1: make test-emu-full)")"
    EMU_ORDER=$orders GPU_TEST_EMULATED=1 "$bin"
    ;;
  asan)
    # Fibers switch stacks under AddressSanitizer's feet: the emulator tells it (blocks.cpp), and
    # stack-use-after-return detection, which cannot follow such switches, stays off.
    status=0
    export ASAN_OPTIONS=detect_stack_use_after_return=0:detect_leaks=0
    if [ -n "${3:-}" ]; then "$3" || status=1; fi
    tests="layernorm rope swiglu sum_ cast attention_awkward attention_block attention_cached copy_columns classifier
           moe_ encoder_backward grad_compression"
    if [ "${TEST_FULL:-0}" = 1 ]; then
      tests="$tests rmsnorm add_ fp8_amax gelu attention_ragged grouped_matmul"
    else
      echo "emu-asan: rmsnorm add_ fp8_amax gelu attention_ragged grouped_matmul only with TEST_FULL=1 (make test-emu-full)"
    fi
    for t in $tests; do
      EMU_ORDER=forward GPU_TEST_EMULATED=1 "$bin" "$t" || status=1
    done
    exit $status
    ;;
  train)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1
    # One OS thread per process: the trainer's grids are small, and a second OpenMP thread per
    # launch cost 2.3x the CPU time for the same work (measured: 0.91 s vs 2.1 s user for 4 steps).
    export OMP_NUM_THREADS=1 EMU_ORDER=forward
    status=0
    # Every FP8 linear call of a step on the emulated backend against float64 (run_gpu.sh fp8's
    # twin), on one rank for each recipe with and without MoE, and at tp = 2.
    fp8_sites() {  # prints the summary line, or everything when it fails
      local out
      if out=$("$@" 2>&1); then echo "  $* : $(tail -1 <<<"$out")"
      else echo "$out"; echo "  $* : FAILED"; status=1; fi
    }
    for args in "tensorwise 0" "delayed 0" "tensorwise 1" "delayed 1"; do
      fp8_sites "${BUILD:-build}/emu/test_fp8_sites" $args $RANDOM
    done
    fp8_sites mpirun --oversubscribe --bind-to none -np 2 "${BUILD:-build}/emu/test_fp8_sites" \
      delayed 1 $RANDOM
    # The step's counts per kernel (EMU_COUNTS) against test/emu_counts_table.json.
    TRAIN=$bin /usr/bin/python3 test/test_emu_counts.py || status=1
    TRAIN=$bin CUDA_MODEL_GRADS=${BUILD:-build}/emu/test_model_grads GPU_TEST_EMULATED=1 \
      PYTHONUNBUFFERED=1 /usr/bin/python3 test/test_gpu_train.py "${@:3}" || status=1
    exit $status
    ;;
  streams)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 EMU_ORDER=forward
    status=0
    TRAIN=$bin PYTHONUNBUFFERED=1 /usr/bin/python3 test/test_stream_schedules.py "${@:3}" || status=1
    # [kernels] cuda_graph: the step captured and replayed, bitwise equal to eager
    TRAIN=$bin PYTHONUNBUFFERED=1 /usr/bin/python3 test/test_cuda_graphs.py || status=1
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
