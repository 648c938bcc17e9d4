#!/usr/bin/env bash
# test/emu/run_lib_tests.sh - the tests of the library stand-ins of the emulated CUDA build
# (test/emu/LIBRARIES.md), as one group: `make emu-lib-tests` builds the programs and runs this.
# Each test draws a fresh seed and prints it; EMU_TEST_SEED=<n> repeats one.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
PY=/usr/bin/python3
SEED_ARG=${EMU_TEST_SEED:+$EMU_TEST_SEED}

source test/suite.sh

run emu-cublaslt  $PY test/emu/test_cublaslt.py "$BUILD"
run emu-cub       $PY test/emu/test_cub.py "$BUILD"
run emu-cudnn     "$BUILD/emu/test_cudnn"
run emu-nccl-np3  timeout 120 mpirun -np 3 "$BUILD/emu/test_nccl" $SEED_ARG
run emu-nccl-np4  timeout 120 mpirun -np 4 "$BUILD/emu/test_nccl" $SEED_ARG
# The project's communicator test on the NCCL backend (parallel/comm_nccl.cu over the stand-in).
for np in 3 4; do
  run emu-comm-nccl-np$np env COMM_TEST_BACKEND=nccl ${EMU_TEST_SEED:+COMM_TEST_SEED=$EMU_TEST_SEED} \
    timeout 120 mpirun -np $np "$BUILD/emu/test_comm_nccl"
done

# The watchdog on the NCCL backend: a stopped peer, and the thread that aborts (test_watchdog.py).
run emu-nccl-watchdog $PY test/test_watchdog.py --comm "$BUILD/emu/test_watchdog_comm_nccl" nccl

suite_finish emu-lib-tests
