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
# An OpenMP thread that finds no work sleeps at once rather than spinning first (libgomp spins
# ~300k iterations by default): with two groups on two cores a spinning thread takes the core
# from the other group's work (the emulated tier's launches measured 3.7 s of CPU spinning
# against 2.4 s sleeping for the same test).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
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
# The emulated tier's programs are built here too, so that its groups (below) only run them and
# can run beside other groups: two makes building the same objects at once would race. Where
# that build fails the emulated groups run one at a time, each rebuilding and failing by itself.
emu_run=run
have_cuda_headers() { [ -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda_runtime.h" ]; }
if have_cuda_headers && ! make -j2 BUILD="$BUILD" emu-bins; then
  echo "run_all: the emulated tier's build FAILED (its groups below fail with it)"
  emu_run=run_alone
fi

SUITE_JOBS=${SUITE_JOBS:-2}      # two groups at a time (test/suite.sh); SUITE_JOBS=1: one
source test/suite.sh
suite_options "$@"
SUITE_GROUPS="${SUITE_ARGS[*]}"  # `test/run_all.sh plan model`: only those groups

# The longest groups first, so that the two lanes end together.
# The CUDA backend on the CPU emulator (test/emu/README.md; needs only the CUDA headers): every
# test/gpu program under a random thread order, the shared-memory kernels under
# AddressSanitizer, the whole CUDA trainer (./train_emu) against ./train_cpu, its layouts under
# the stream schedules (late, others-first) bitwise against sync with sabotaged copies that must
# fail (test/test_stream_schedules.py), and the emulator's own tests.
if have_cuda_headers; then
  $emu_run emu-gpu     make -s -j2 BUILD="$BUILD" emu-gpu-tests
  $emu_run emu-asan    make -s -j2 BUILD="$BUILD" emu-asan-tests
  $emu_run emu-train   make -s -j2 BUILD="$BUILD" emu-train-tests
  $emu_run emu-streams make -s -j2 BUILD="$BUILD" emu-streams-tests
  # [data] document_mask through ./train_emu's bf16 flash kernels (test_documents.py, part 4)
  $emu_run emu-documents env TRAIN_EMU=./train_emu $PY test/test_documents.py --emulated
  $emu_run emu-self    make -s -j2 BUILD="$BUILD" emu-self-tests
else
  skip emu "no CUDA headers (the emulated tier compiles the .cu files against them)"
fi
run pipeline    $PY test/test_pipeline.py
run diloco      $PY test/test_diloco.py
run grad-compression $PY test/test_grad_compression.py
# The readers' saved fuzz inputs, once each under ASan + UBSan (test/fuzz/README.md); the
# sanitized build of the readers is part of the group's time.
if why=$(test/fuzz/have_engine.sh); then
  run fuzz-corpus bash -c 'make -j2 BUILD="$BUILD" fuzz-bins > "$BUILD/fuzz-bins.log" 2>&1 ||
                           { tail -20 "$BUILD/fuzz-bins.log"; exit 1; }; test/fuzz/run_corpus.sh'
else
  skip fuzz-corpus "no fuzzing engine: $why"
fi
run checkpoint  $PY test/test_checkpoint.py
run plan        $PY test/test_plan.py
run distributed $PY test/test_distributed.py
run zero        $PY test/test_zero.py
if [ -x "$BUILD/emu/test_comm_nccl" ]; then  # the CUDA libraries' stand-ins (test/emu/LIBRARIES.md)
  run emu-libs  test/emu/run_lib_tests.sh
else
  skip emu-libs "no $BUILD/emu/test_comm_nccl (built with the CUDA toolkit, which is missing)"
fi
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
run bench-smoke $PY test/test_bench.py  # the benchmark at tiny sizes, its accounting checked
run mfu         $PY test/test_mfu.py
run hsdp        $PY test/test_hsdp.py  # [parallel] dp_replicate: shard inside replicas
run diloco-groups "$BUILD/test_diloco_groups"
run grad-compression-ops env OPS_LIB="$BUILD/libops_cpu.so" $PY test/test_grad_compression_ops.py
run noise-scale "$BUILD/test_noise_scale"
run noise-scale-trainer $PY test/test_noise_scale.py
run tensor-parallel $PY test/test_tensor_parallel.py
run context-parallel $PY test/test_context_parallel.py
run cp-a2a     $PY test/test_context_parallel_a2a.py  # cp_comm = "all-to-all" / "hybrid"
run documents   $PY test/test_documents.py  # [data] document_mask vs float64, every layout
run data-mix    $PY test/test_data_mix.py  # [data] train of several datasets: draws, layouts, resume
run moe         $PY test/test_moe.py
run llama       $PY test/test_llama.py
run activation-table $PY tools/activation_table.py --recompute block --check 1.2  # docs/SCALING.md
run cp-comm-table $PY tools/cp_comm_table.py --check  # docs/SCALING.md: ring vs all-to-all bytes
run matrix      $PY test/test_matrix.py
run fp8         $PY test/test_fp8.py
run fp8-linear  "$BUILD/test_fp8_linear"
run checkpoint-writers "$BUILD/test_checkpoint_writers"
run export      $PY test/test_export.py
run llama-hf    bash -c "$PY test/test_llama_hf.py && $PY test/test_mixtral_hf.py"  # Llama, Mixtral in/out
run usability   $PY test/test_usability.py
run checkpoint-safety $PY test/test_checkpoint_safety.py
run loss-spikes $PY test/test_loss_spikes.py
run bad-input   $PY test/test_bad_input.py
if [ -x "$BUILD/test_cudnn_graph" ]; then
  run cudnn-graph "$BUILD/test_cudnn_graph"  # the cuDNN attention graphs, checked on the host
else
  skip cudnn-graph "no $BUILD/test_cudnn_graph (built with the CUDA toolkit, which is missing)"
fi
run docs        $PY test/test_docs.py  # README and docs/ against the schema, the tree, this file
# The groups that time something on the wall clock (a watchdog's timeout, a straggler's delay, a
# refusal within 3 s, a trace's spans covering the step), each with the machine to itself.
run_alone watchdog    $PY test/test_watchdog.py
run_alone preemption  $PY test/test_preemption.py
run_alone slurm       $PY test/test_slurm.py  # a private Slurm: srun, the job script's requeue, threads
run_alone async-checkpoint $PY test/test_async_checkpoint.py
run_alone stragglers  $PY test/test_stragglers.py
run_alone trace       $PY test/test_trace.py  # [log] trace: the files against the step, comm, schedule
run_alone elastic     $PY test/test_elastic.py
run_alone long-run    $PY test/test_long_run.py
run_alone mesh        $PY test/test_mesh.py "$BUILD"

suite_finish run_all
