# Makefile - one code base, two binaries.
#
#   make          ./train (CUDA kernels, NCCL + MPI) and ./train_cpu (CPU kernels, MPI)
#   make cpu      ./train_cpu only
#   make test     every CPU test (installs dependencies first; see test/run_all.sh)
#   make test-gpu the GPU tests (needs a GPU)
#   make fuzz     each reader's fuzz target for FUZZ_SECONDS (test/fuzz/README.md)
#   make test-emu the CUDA backend and the whole CUDA trainer (./train_emu) on the CPU emulator
#                 (no GPU needed; test/emu/README.md)
#   make run      the quick-start demo: deps, build, fortunes dataset, train, sample
#   make bench    GPU benchmarks (bench/run_all.sh)
#   make bundle   relocatable folder for an air-gapped GPU node (tools/make_bundle.sh)
#   make clean
#
# Everything above the backend seam (train.cu, model/, parallel/, checkpoint/, data/) is plain
# C++ that only calls kernels/ops.h, so it is compiled once with g++ and linked into both
# binaries: the CPU backend (kernels/cpu/) makes ./train_cpu, the CUDA backend (kernels/cuda/,
# compiled by nvcc) makes ./train. The .cu files above the seam hold no device code.

CXX       ?= g++
NVCC      ?= /usr/local/cuda/bin/nvcc
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCH ?= 90
BUILD     ?= build

MPI_CFLAGS  := $(shell mpicxx --showme:compile 2>/dev/null) -DOMPI_SKIP_MPICXX=1
MPI_LIBS    := $(shell mpicxx --showme:link 2>/dev/null)
HDF5_CFLAGS := $(shell pkg-config --cflags hdf5-openmpi 2>/dev/null)
HDF5_LIBS   := $(shell pkg-config --libs hdf5-openmpi 2>/dev/null)
TOML_CFLAGS := $(shell pkg-config --cflags tomlplusplus 2>/dev/null)
TOML_LIBS   := $(shell pkg-config --libs tomlplusplus 2>/dev/null)

OPT       ?= -O3
# Debug information of the g++ objects: -g1 keeps what a backtrace, a profiler and addr2line use
# (functions and line tables) and compiles the host objects about a third faster than -g (e.g.
# model/gpt.cu: 2.8 s against 4.3 s of CPU); `make DEBUG_INFO=-g` adds the variables for gdb.
DEBUG_INFO ?= -g1
CXXFLAGS  := -std=c++17 $(OPT) $(DEBUG_INFO) -MMD -MP -fopenmp -Wall -Wextra -Wno-unused-parameter -I. \
             $(MPI_CFLAGS) $(HDF5_CFLAGS) $(TOML_CFLAGS)
NVCCFLAGS := -std=c++17 $(OPT) -g -MMD -MP -lineinfo -I. --expt-relaxed-constexpr \
             -gencode arch=compute_$(CUDA_ARCH),code=sm_$(CUDA_ARCH) \
             -Xcompiler -fopenmp,-Wall,-Wno-unused-parameter $(MPI_CFLAGS)
LDLIBS    := -fopenmp $(MPI_LIBS) $(HDF5_LIBS) $(TOML_LIBS) -lpthread
# make DEBUG_CHECKS=1: the kernels' own guards that cost time on a GPU (token ids against the
# vocabulary in the CUDA encoder); the CPU backend always checks them.
ifeq ($(DEBUG_CHECKS),1)
  CXXFLAGS  += -DGPT5D_DEBUG_CHECKS
  NVCCFLAGS += -DGPT5D_DEBUG_CHECKS
endif
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas \
             -lcudnn -lnccl

# Sources. Above the seam: every .cu/.cpp in these folders; comm_nccl.cu (with its watchdog
# thread, nccl_watchdog.cu) is the NCCL backend, comm_nccl_absent.cu stands in for it in the CPU
# binary.
SHARED_SRC := train.cu kernels/common.cpp kernels/host_adamw.cpp kernels/host_diloco.cpp kernels/allocator.cpp kernels/trace.cpp \
              $(filter-out parallel/comm_nccl.cu parallel/nccl_watchdog.cu parallel/comm_nccl_absent.cu, \
                $(wildcard config/*.cu parallel/*.cu model/*.cu training/*.cu checkpoint/*.cu data/*.cpp))
CPU_SRC    := $(wildcard kernels/cpu/*.cpp) parallel/comm_nccl_absent.cu
CUDA_SRC   := $(wildcard kernels/cuda/*.cu)
NCCL_SRC   := parallel/comm_nccl.cu parallel/nccl_watchdog.cu

obj = $(patsubst %,$(BUILD)/$(1)/%.o,$(2))
SHARED_OBJ := $(call obj,host,$(SHARED_SRC))
CPU_OBJ    := $(call obj,host,$(CPU_SRC))
CUDA_OBJ   := $(call obj,cuda,$(CUDA_SRC))
NCCL_OBJ   := $(call obj,cuda,$(NCCL_SRC))

.PHONY: all cpu cuda test test-full test-emu-full test-gpu run bench bundle clean deps tools test-bins
all: train_cpu train tools
cpu: train_cpu tools
cuda: train

# Host objects (g++). -x c++ makes g++ read the seam-level .cu files as C++.
$(BUILD)/host/%.o: %
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -x c++ -c $< -o $@

# Device objects (nvcc).
$(BUILD)/cuda/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

train_cpu: $(SHARED_OBJ) $(CPU_OBJ)
	$(CXX) -o $@ $^ $(LDLIBS)

train: $(SHARED_OBJ) $(CUDA_OBJ) $(NCCL_OBJ)
	$(CXX) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# The CPU kernels as a shared library, so that the Python tests can call each op directly (and
# the MoE dispatch plan, which the dispatch ops' test feeds them).
$(BUILD)/pic/%.o: %
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -fPIC -x c++ -c $< -o $@
LIBOPS_SRC := $(wildcard kernels/cpu/*.cpp) kernels/common.cpp kernels/host_adamw.cpp kernels/host_diloco.cpp test/ops_capi.cpp \
              parallel/expert_dispatch_plan.cu
$(BUILD)/libops_cpu.so: $(call obj,pic,$(LIBOPS_SRC))
	$(CXX) -shared -o $@ $^ -fopenmp

# Tools (text -> token shards, and friends).
TOOLS := $(BUILD)/tokenize
tools: $(TOOLS)
$(BUILD)/tokenize: $(call obj,host,tools/tokenize.cpp tools/gpt2_bpe.cpp tools/hf_tokenizer.cpp tools/bpe.cpp \
                               tools/pretokenize.cpp config/json.cu kernels/common.cpp)
	$(CXX) -o $@ $^ -fopenmp

# C++ test programs: test/<name>.cpp linked with everything above the seam and the CPU backend.
TEST_SRC  := $(wildcard test/test_*.cpp)
TEST_BINS := $(patsubst test/%.cpp,$(BUILD)/%,$(TEST_SRC))
$(BUILD)/test_%: $(BUILD)/host/test/test_%.cpp.o $(filter-out $(BUILD)/host/train.cu.o,$(SHARED_OBJ)) $(CPU_OBJ)
	$(CXX) -o $@ $^ $(LDLIBS)
# The communicator's test again, over a pretend GPU whose memory only ops::copy_* may touch:
# proves the MPI backend stages device buffers through the host.
COMM_FAKE_DEVICE_SRC := parallel/comm.cu parallel/comm_mpi.cu parallel/comm_mpi_runtime.cu parallel/host_threads.cu \
                        parallel/comm_nccl_absent.cu config/layout_rules.cu parallel/mesh.cu \
                        parallel/pipeline_schedule.cu parallel/pipeline_messages.cu \
                        parallel/pipeline_simulator.cu parallel/pipeline_file.cu \
                        parallel/pipeline_balance.cu config/device_peaks.cu kernels/common.cpp kernels/trace.cpp
$(BUILD)/test_comm_fake_device: test/test_comm.cpp test/comm_test_support.h test/comm_point_to_point.h \
                               test/comm_send_recv.h \
                               $(call obj,host,$(COMM_FAKE_DEVICE_SRC))
	$(CXX) $(CXXFLAGS) -DCOMM_TEST_FAKE_DEVICE -o $@ $< $(filter %.o,$^) $(LDLIBS)

test-bins: $(TEST_BINS) $(BUILD)/libops_cpu.so $(BUILD)/test_comm_fake_device

# GPU tests: the CUDA backend next to the CPU backend renamed to namespace ref (kernels/ops.h).
GPU_TEST_SRC := $(wildcard test/gpu/*.cu)
$(BUILD)/ref/%.o: %
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -Dops=ref -x c++ -c $< -o $@
$(BUILD)/test_gpu: $(call obj,cuda,$(GPU_TEST_SRC)) $(CUDA_OBJ) $(call obj,ref,$(wildcard kernels/cpu/*.cpp)) $(call obj,host,kernels/common.cpp kernels/host_adamw.cpp kernels/host_diloco.cpp)
	$(CXX) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# The cuDNN attention graphs, validated on the host (test/test_cudnn_graph.cu; no GPU needed).
$(BUILD)/test_cudnn_graph: $(BUILD)/cuda/test/test_cudnn_graph.cu.o $(CUDA_OBJ) $(call obj,host,kernels/common.cpp)
	$(CXX) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

deps:
	tools/install_deps.sh

test: deps
	test/run_all.sh

# The long matrices too (TEST_FULL=1: test/README.md, "make test and the full targets"): every
# group, and the emulated tier's groups alone.
test-full: deps
	TEST_FULL=1 test/run_all.sh

test-emu-full: deps
	TEST_FULL=1 test/run_all.sh emu-self emu-gpu emu-asan emu-train emu-documents emu-streams

test-gpu: all $(BUILD)/test_gpu
	test/run_gpu.sh

run: deps
	tools/run_demo.sh $(ARGS)

bench:
	bench/run_all.sh

bundle: all $(BUILD)/test_gpu
	tools/make_bundle.sh

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# The library stand-ins of the emulated CUDA build and their tests (make emu-lib-tests).
-include test/emu/libs.mk

# The fuzz targets of the readers (make fuzz; test/fuzz/README.md).
-include test/fuzz/fuzz.mk

clean:
	rm -rf $(BUILD) train train_cpu train_emu

# ---------------------------------------------------------------------------------------------
# GPU test programs, kernel benchmark, offline bundle (owner: test/run_gpu.sh, bench/, tools/
# make_bundle.sh). Only additions: extra prerequisites of test-gpu, bench and bundle, new targets.
# ---------------------------------------------------------------------------------------------
# test_model_grads again on the CUDA backend: test/test_gpu_train.py compares it with the CPU one.
$(BUILD)/cuda_test_model_grads: $(BUILD)/host/test/test_model_grads.cpp.o \
    $(filter-out $(BUILD)/host/train.cu.o,$(SHARED_OBJ)) $(CUDA_OBJ) $(NCCL_OBJ)
	$(CXX) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# test_fp8_sites on the CUDA backend: every FP8 linear call of a step (cuBLASLt's FP8 GEMMs, the
# cast and amax kernels) against float64 (test/run_gpu.sh fp8).
$(BUILD)/cuda_test_fp8_sites: $(BUILD)/host/test/test_fp8_sites.cpp.o \
    $(filter-out $(BUILD)/host/train.cu.o,$(SHARED_OBJ)) $(CUDA_OBJ) $(NCCL_OBJ)
	$(CXX) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

# The kernel benchmark: plain C++ over the seam (bench/*.cu hold no device code), so it links with
# either backend; the CPU build is its smoke test on machines without a GPU (--quick).
BENCH_OBJ := $(call obj,host,$(wildcard bench/*.cu) kernels/common.cpp)
$(BUILD)/bench_kernels: $(BENCH_OBJ) $(CUDA_OBJ)
	$(CXX) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)
$(BUILD)/bench_kernels_cpu: $(BENCH_OBJ) $(call obj,host,$(wildcard kernels/cpu/*.cpp) kernels/host_adamw.cpp kernels/host_diloco.cpp)
	$(CXX) -o $@ $^ $(LDLIBS)

# test/gpu/test_moe_dispatch.cu feeds the MoE dispatch ops with the real dispatch plan.
$(BUILD)/test_gpu: $(call obj,host,parallel/expert_dispatch_plan.cu)

GPU_PROGRAMS := $(BUILD)/test_gpu $(BUILD)/test_model_grads $(BUILD)/cuda_test_model_grads \
                $(BUILD)/cuda_test_fp8_sites $(BUILD)/bench_kernels $(BUILD)/test_cudnn_graph
.PHONY: gpu-programs
gpu-programs: all $(GPU_PROGRAMS)
test-gpu: $(GPU_PROGRAMS)
bench: all $(BUILD)/bench_kernels
bundle: $(GPU_PROGRAMS)
.PHONY: bundle-check
bundle-check: bundle
	tools/check_bundle.sh

# The emulated CUDA tier (test/emu/README.md): the emulator, and the emulated test programs.
-include test/emu/emu.mk
