#!/usr/bin/env bash
# test/run_all.sh - the whole CPU test suite (`make test`, and what CI runs through .ci/run).
#
# Builds both binaries (./train with nvcc when the CUDA toolkit is present: CI compiles and links
# the CUDA backend on every run even though it has no GPU to run it), the test programs and the
# bundled dataset, then runs every test and prints a summary. Exit status 1 if any test failed.
# Every test compares against a reference (PyTorch float64, the one-rank run, exact analytic
# values) with a stated tolerance; see the docstring at the top of each. What a group cannot run
# here it skips out loud, and the summary counts every skip with its reason (test/suite.sh);
# `make deps` (tools/install_deps.sh) installs what the skipping groups need.
# Arguments name groups to run alone: `test/run_all.sh plan model` (the build still runs first);
# `--only PATTERN` runs only the checks whose names contain PATTERN (exported as TEST_ONLY, which
# the shared check helpers read: test/README.md, "Running one check").
set -uo pipefail
cd "$(dirname "$0")/.."
export BUILD=${BUILD:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI told what it will use, so that a trainer process starts in 0.2 s rather than 0.8 s
# (most of test_config's time, and much of the trainer tests', was MPI's start-up): every rank
# runs on this one machine, where Open MPI picks ob1 over shared memory (vader) anyway, but only
# after probing UCX, OFI and TCP; and a trainer run without mpirun (a singleton) starts no orted
# daemon. The transport and the arithmetic are those of a default run. A rank waiting in MPI
# yields the core (the ranks of a test outnumber the cores) rather than spinning on it.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_ess_singleton_isolated=1
export OMPI_MCA_mpi_yield_when_idle=1
PY=/usr/bin/python3

if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  # ./train plus the GPU test and benchmark programs: they cannot run here, but must build.
  targets="all gpu-programs emu-lib-test-bins"
else
  echo "run_all: no CUDA toolkit found: building ./train_cpu only"
  targets="cpu"
fi
make -j2 BUILD="$BUILD" $targets test-bins "$BUILD/bench_kernels_cpu" || { echo "run_all: BUILD FAILED"; exit 1; }
tools/prepare_fortunes.sh || { echo "run_all: dataset preparation failed"; exit 1; }

source test/suite.sh
suite_options "$@"
SUITE_GROUPS="${SUITE_ARGS[*]}"  # `test/run_all.sh plan model`: only those groups

run ops         env OPS_LIB="$BUILD/libops_cpu.so" $PY test/test_ops.py
run llama-ops   env OPS_LIB="$BUILD/libops_cpu.so" $PY test/test_llama_ops.py
run model       $PY test/test_model.py
run moe-grads   $PY test/test_moe_grads.py
run moe-options $PY test/test_moe_options.py
run train       $PY test/test_train.py
run data        "$BUILD/test_data"
run pipeline-schedule "$BUILD/test_pipeline_schedule"
run pipeline-file "$BUILD/test_pipeline_file"
run pipeline-balance "$BUILD/test_pipeline_balance"
run pipeline-headers "$BUILD/test_pipeline_headers"  # the header timelines, drawn again
run cp-plan     "$BUILD/test_context_parallel_plan"
run expert-dispatch "$BUILD/test_expert_dispatch_plan"
run parallel-identity "$BUILD/test_parallel_identity"
run ring-attention $PY test/test_ring_attention.py
run attention-block $PY test/test_attention_block.py
run ring-gqa    bash -c 'mpirun -np 2 "$BUILD/test_ring_gqa" && mpirun -np 3 "$BUILD/test_ring_gqa"'
run moe-router  $PY test/test_moe_router.py
run moe-dispatch $PY test/test_moe_dispatch.py
run sample      $PY test/test_sample.py
run eval        $PY test/test_eval.py
run tokenize    $PY test/test_tokenize.py
run tokenizer-json $PY test/test_tokenizer_json.py
run config      env CONFIG_BIN=./train_cpu $PY test/test_config.py
run mesh        $PY test/test_mesh.py "$BUILD"
run bench-smoke $PY test/test_bench.py  # the benchmark at tiny sizes, its accounting checked
run mfu         $PY test/test_mfu.py
run distributed $PY test/test_distributed.py
run zero        $PY test/test_zero.py
run diloco      $PY test/test_diloco.py
run diloco-groups "$BUILD/test_diloco_groups"
run grad-compression-ops env OPS_LIB="$BUILD/libops_cpu.so" $PY test/test_grad_compression_ops.py
run grad-compression $PY test/test_grad_compression.py
run noise-scale "$BUILD/test_noise_scale"
run noise-scale-trainer $PY test/test_noise_scale.py
run tensor-parallel $PY test/test_tensor_parallel.py
run pipeline    $PY test/test_pipeline.py
run context-parallel $PY test/test_context_parallel.py
run documents   $PY test/test_documents.py  # [data] document_mask vs float64, every layout
run moe         $PY test/test_moe.py
run llama       $PY test/test_llama.py
run plan        $PY test/test_plan.py
run activation-table $PY tools/activation_table.py --recompute block --check 1.2  # docs/SCALING.md
run matrix      $PY test/test_matrix.py
run fp8         $PY test/test_fp8.py
run fp8-linear  "$BUILD/test_fp8_linear"
run checkpoint-writers "$BUILD/test_checkpoint_writers"
run checkpoint  $PY test/test_checkpoint.py
run export      $PY test/test_export.py
run llama-hf    $PY test/test_llama_hf.py
run usability   $PY test/test_usability.py
run checkpoint-safety $PY test/test_checkpoint_safety.py
run watchdog    $PY test/test_watchdog.py
run preemption  $PY test/test_preemption.py
run slurm       $PY test/test_slurm.py  # a private Slurm: srun, the job script's requeue, threads
run async-checkpoint $PY test/test_async_checkpoint.py
run loss-spikes $PY test/test_loss_spikes.py
run stragglers  $PY test/test_stragglers.py
run trace       $PY test/test_trace.py  # [log] trace: the files against the step, comm, schedule
run elastic     $PY test/test_elastic.py
run bad-input   $PY test/test_bad_input.py
run long-run    $PY test/test_long_run.py
run docs        $PY test/test_docs.py  # README and docs/ against the schema, the tree, this file
# The readers' saved fuzz inputs, once each under ASan + UBSan (test/fuzz/README.md); the
# sanitized build of the readers is part of the group's time.
if why=$(test/fuzz/have_engine.sh); then
  run fuzz-corpus bash -c 'make -j2 BUILD="$BUILD" fuzz-bins > "$BUILD/fuzz-bins.log" 2>&1 ||
                           { tail -20 "$BUILD/fuzz-bins.log"; exit 1; }; test/fuzz/run_corpus.sh'
else
  skip fuzz-corpus "no fuzzing engine: $why"
fi
if [ -x "$BUILD/test_cudnn_graph" ]; then
  run cudnn-graph "$BUILD/test_cudnn_graph"  # the cuDNN attention graphs, checked on the host
else
  skip cudnn-graph "no $BUILD/test_cudnn_graph (built with the CUDA toolkit, which is missing)"
fi
if [ -x "$BUILD/emu/test_comm_nccl" ]; then  # the CUDA libraries' stand-ins (test/emu/LIBRARIES.md)
  run emu-libs  test/emu/run_lib_tests.sh
else
  skip emu-libs "no $BUILD/emu/test_comm_nccl (built with the CUDA toolkit, which is missing)"
fi
# The CUDA backend on the CPU emulator (test/emu/README.md; needs only the CUDA headers): the
# emulator's own tests, every test/gpu program under two thread orders, the shared-memory
# kernels under AddressSanitizer, the whole CUDA trainer (./train_emu) against ./train_cpu, and
# its layouts under the stream schedules (late, others-first) bitwise against sync, with
# sabotaged copies that must fail (test/test_stream_schedules.py).
if [ -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda_runtime.h" ]; then
  run emu-self    make -s -j2 BUILD="$BUILD" emu-self-tests
  run emu-gpu     make -s -j2 BUILD="$BUILD" emu-gpu-tests
  run emu-asan    make -s -j2 BUILD="$BUILD" emu-asan-tests
  run emu-train   make -s -j2 BUILD="$BUILD" emu-train-tests
  run emu-streams make -s -j2 BUILD="$BUILD" emu-streams-tests
else
  skip emu "no CUDA headers (the emulated tier compiles the .cu files against them)"
fi

suite_finish run_all
