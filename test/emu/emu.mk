# test/emu/emu.mk - build rules of the emulated CUDA tier (test/emu/README.md), included by the
# Makefile. The CUDA backend's kernels (kernels/cuda/*.cu) and the GPU test programs
# (test/gpu/*.cu) are compiled by g++ through the emulator: preprocessed with
# test/emu/include/emu_cuda.h force-included, rewritten by test/emu/rewrite.cpp (launches,
# __shared__, __launch_bounds__, inline PTX), compiled as C++ and linked with the emulated runtime
# (test/emu/*.cpp), the library stand-ins of test/emu/libs.mk ($(EMU_STANDINS): cuBLASLt, NCCL,
# cuDNN; cub is a header in test/emu/include) and the CPU backend as the oracle.
#
#   make emu-gpu-tests   build/emu/test_gpu: every test/gpu program, each launch run under the
#                        forward and the reverse thread order with bitwise-equal results
#   make emu-asan-tests  build/emu-asan/test_gpu under AddressSanitizer (and the alignment
#                        sanitizer: a misaligned vector access faults on a GPU), on the kernels
#                        that use shared memory or vector paths (test/emu/run_emu_tests.sh asan)
#   make emu-self-tests  the emulator's own tests (test/emu/test_emu*.cu, negative builds)
#   make emu-tests       all three
#   make train_emu       the whole CUDA trainer on the emulator: ./train_emu
#   make emu-train-tests ./train_emu against ./train_cpu (test/test_gpu_train.py, emulated sizes)
#                        and test_fp8_sites on the emulated backend
#   make test-emu        emu-gpu-tests, then emu-train-tests
#   make emu-bins        every program the targets above run, built and not run (test/run_all.sh
#                        builds them before its groups, which then run side by side)

EMU_DIR      := $(BUILD)/emu
EMU_ASAN_DIR := $(BUILD)/emu-asan
EMU_CUDA_INC := -isystem $(CUDA_HOME)/include

# Preprocessing a kernel source: the emulator's header first, test/emu/include ahead of the CUDA
# headers (its cub/cub.cuh stands in for cub), the CUDA headers as system headers.
EMU_CPPFLAGS := -std=c++17 -fopenmp -I. -Itest/emu/include $(EMU_CUDA_INC) $(MPI_CFLAGS) \
                -DGPT5D_EMULATED_CUDA -include test/emu/include/emu_cuda.h
# Compiling: no floating-point contraction (a * b + c stays two roundings, as the CPU backend
# computes), the nvcc-only pragmas (#pragma unroll) ignored.
EMU_OPT      ?= -O2
# Line tables only (-g1): enough for a sanitizer's or a debugger's file:line, and it compiles the
# emulated objects 20% (plain) to 45% (AddressSanitizer) faster than -g. `make EMU_DEBUG=-g` for
# variables in a debugger.
EMU_DEBUG    ?= -g1
EMU_CXXFLAGS := -std=c++17 $(EMU_OPT) $(EMU_DEBUG) -fopenmp -ffp-contract=off -fno-strict-aliasing -Wall \
                -Wno-unknown-pragmas -Wno-sign-compare \
                -Wno-unused-parameter -Wno-unused-variable -Wno-unused-but-set-variable
EMU_ASAN     := -fsanitize=address,alignment -fno-sanitize-recover=alignment -fno-omit-frame-pointer
# The counter of EMU_COUNTS (test/emu/counts.cpp): every load and store of the emulated code
# calls __tsan_{read,write}N, which counts.cpp defines (no sanitizer runtime is linked: only the
# calls). Outside a counted launch each returns after one flag test.
EMU_COUNT_FLAGS := -fsanitize=thread --param tsan-instrument-func-entry-exit=0 \
                   --param tsan-distinguish-volatile=0
# The emulator itself (plain C++, not rewritten).
EMU_LIBFLAGS := -std=c++17 $(EMU_OPT) -g -MMD -MP -fopenmp -ffp-contract=off -Wall -Wextra \
                -Wno-unused-parameter -I. $(EMU_CUDA_INC)

EMU_RUNTIME_SRC := test/emu/blocks.cpp test/emu/counts.cpp test/emu/fiber.cpp test/emu/launch.cpp test/emu/ptx.cpp \
                   test/emu/runtime.cpp test/emu/shared.cpp test/emu/streams.cpp \
                   test/emu/warps.cpp test/emu/graphs.cpp
EMU_GPU_SRC  := $(wildcard kernels/cuda/*.cu) $(wildcard test/gpu/*.cu)

emu_obj  = $(patsubst %,$(EMU_DIR)/obj/%.o,$(1))
asan_obj = $(patsubst %,$(EMU_ASAN_DIR)/obj/%.o,$(1))

$(EMU_DIR)/rewrite: test/emu/rewrite.cpp
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -Wall -o $@ $<

# A CUDA source through the emulator: preprocess (with its dependency file), rewrite, compile.
$(EMU_DIR)/obj/%.o: % $(EMU_DIR)/rewrite
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CPPFLAGS) -x c++ -E -MMD -MP -MF $(@:.o=.d) -MT $@ $< -o $(@:.o=.ii)
	$(EMU_DIR)/rewrite $(@:.o=.ii) $(@:.o=.rw.ii)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_COUNT_FLAGS) -c $(@:.o=.rw.ii) -o $@
$(EMU_ASAN_DIR)/obj/%.o: % $(EMU_DIR)/rewrite
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CPPFLAGS) $(EMU_ASAN) -x c++ -E -MMD -MP -MF $(@:.o=.d) -MT $@ $< -o $(@:.o=.ii)
	$(EMU_DIR)/rewrite $(@:.o=.ii) $(@:.o=.rw.ii)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_ASAN) -O1 -c $(@:.o=.rw.ii) -o $@

# The emulator's runtime, and the library stand-ins, as plain C++.
$(EMU_DIR)/lib/%.o: %
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_LIBFLAGS) -c $< -o $@
$(EMU_ASAN_DIR)/lib/%.o: %
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_LIBFLAGS) $(EMU_ASAN) -O1 -c $< -o $@

EMU_REF_OBJ := $(call obj,ref,$(wildcard kernels/cpu/*.cpp)) \
               $(call obj,host,kernels/common.cpp kernels/host_adamw.cpp kernels/host_diloco.cpp parallel/expert_dispatch_plan.cu)

# test/gpu as one program, as $(BUILD)/test_gpu, with the CUDA backend emulated.
$(EMU_DIR)/test_gpu: $(call emu_obj,$(EMU_GPU_SRC)) $(EMU_REF_OBJ) \
                     $(patsubst %,$(EMU_DIR)/lib/%.o,$(EMU_RUNTIME_SRC)) $(EMU_STANDINS)
	$(CXX) -o $@ $^ $(LDLIBS)
$(EMU_ASAN_DIR)/test_gpu: $(call asan_obj,$(EMU_GPU_SRC)) $(EMU_REF_OBJ) \
                          $(patsubst %,$(EMU_ASAN_DIR)/lib/%.o,$(EMU_RUNTIME_SRC)) $(EMU_STANDINS)
	$(CXX) $(EMU_ASAN) -o $@ $^ $(LDLIBS)

# The emulator's own tests: kernels written to probe it, compiled through it (also under
# AddressSanitizer, where an index past a __shared__ array must be reported).
EMU_SELF_SRC := test/emu/test_emu.cu test/emu/test_emu_ptx.cu test/emu/test_emu_graphs.cu
$(EMU_DIR)/test_emu: $(call emu_obj,$(EMU_SELF_SRC)) $(call obj,host,kernels/common.cpp) \
                     $(patsubst %,$(EMU_DIR)/lib/%.o,$(EMU_RUNTIME_SRC))
	$(CXX) -o $@ $^ $(LDLIBS)
# The counter's kernels of known traffic (test/emu/test_counts.cu, checked by test_counts.py).
$(EMU_DIR)/test_counts: $(call emu_obj,test/emu/test_counts.cu) \
                        $(patsubst %,$(EMU_DIR)/lib/%.o,$(EMU_RUNTIME_SRC)) $(EMU_STANDINS)
	$(CXX) -o $@ $^ $(LDLIBS)
$(EMU_ASAN_DIR)/test_emu: $(call asan_obj,$(EMU_SELF_SRC)) $(call obj,host,kernels/common.cpp) \
                          $(patsubst %,$(EMU_ASAN_DIR)/lib/%.o,$(EMU_RUNTIME_SRC))
	$(CXX) $(EMU_ASAN) -o $@ $^ $(LDLIBS)

# The whole CUDA trainer on the emulator: the shared host code (the g++ objects of ./train), the
# CUDA backend's emulated objects (the same ones $(EMU_DIR)/test_gpu links: built once),
# parallel/comm_nccl.cu and its watchdog over the NCCL stand-in, the other stand-ins. And test_model_grads on the
# emulated CUDA backend ($(BUILD)/cuda_test_model_grads's twin).
EMU_RUNTIME_OBJ := $(patsubst %,$(EMU_DIR)/lib/%.o,$(EMU_RUNTIME_SRC))
EMU_NCCL_OBJ    := $(BUILD)/emu/host/parallel/comm_nccl.cu.o \
                   $(BUILD)/emu/host/parallel/nccl_watchdog.cu.o
EMU_CUDA_OBJ    := $(call emu_obj,$(CUDA_SRC)) $(EMU_NCCL_OBJ) $(EMU_RUNTIME_OBJ) $(EMU_STANDINS)
train_emu: $(SHARED_OBJ) $(EMU_CUDA_OBJ)
	$(CXX) -o $@ $^ $(LDLIBS)
# The same under AddressSanitizer (the kernels and the emulator; the host code as in ./train):
# every access of a kernel at the trainer's own shapes checked. Not in the suite (several times
# slower); run by hand, see test/emu/README.md.
$(EMU_ASAN_DIR)/train_emu: $(SHARED_OBJ) $(call asan_obj,$(CUDA_SRC)) $(EMU_NCCL_OBJ) \
    $(patsubst %,$(EMU_ASAN_DIR)/lib/%.o,$(EMU_RUNTIME_SRC)) $(EMU_STANDINS)
	$(CXX) $(EMU_ASAN) -o $@ $^ $(LDLIBS)
$(EMU_DIR)/test_model_grads: $(BUILD)/host/test/test_model_grads.cpp.o \
    $(filter-out $(BUILD)/host/train.cu.o,$(SHARED_OBJ)) $(EMU_CUDA_OBJ)
	$(CXX) -o $@ $^ $(LDLIBS)
# test_fp8_sites on the emulated CUDA backend ($(BUILD)/cuda_test_fp8_sites's twin): every FP8
# linear call of a step through the cuBLASLt stand-in's FP8 GEMMs, against float64.
$(EMU_DIR)/test_fp8_sites: $(BUILD)/host/test/test_fp8_sites.cpp.o \
    $(filter-out $(BUILD)/host/train.cu.o,$(SHARED_OBJ)) $(EMU_CUDA_OBJ)
	$(CXX) -o $@ $^ $(LDLIBS)

.PHONY: emu-tests emu-gpu-tests emu-asan-tests emu-self-tests emu-train-tests test-emu emu-bins
emu-bins: $(EMU_DIR)/test_gpu $(EMU_ASAN_DIR)/test_gpu $(EMU_ASAN_DIR)/test_emu $(EMU_DIR)/test_emu \
          $(EMU_DIR)/test_counts \
          $(EMU_DIR)/rewrite train_emu $(EMU_DIR)/test_model_grads $(EMU_DIR)/test_fp8_sites \
          train_cpu $(BUILD)/test_model_grads
emu-tests: emu-self-tests emu-gpu-tests emu-asan-tests
emu-gpu-tests: $(EMU_DIR)/test_gpu
	test/emu/run_emu_tests.sh gpu $(EMU_DIR)/test_gpu
emu-asan-tests: $(EMU_ASAN_DIR)/test_gpu $(EMU_ASAN_DIR)/test_emu
	test/emu/run_emu_tests.sh asan $(EMU_ASAN_DIR)/test_gpu $(EMU_ASAN_DIR)/test_emu
emu-self-tests: $(EMU_DIR)/test_emu $(EMU_DIR)/rewrite $(EMU_DIR)/test_counts
	test/emu/run_emu_tests.sh self $(EMU_DIR)/test_emu
	/usr/bin/python3 test/emu/test_counts.py $(EMU_DIR)/test_counts
emu-train-tests: train_emu $(EMU_DIR)/test_model_grads $(EMU_DIR)/test_fp8_sites train_cpu \
                 $(BUILD)/test_model_grads
	BUILD=$(BUILD) test/emu/run_emu_tests.sh train ./train_emu
# One after the other (each uses both cores; under -j2 make would run them side by side).
test-emu: emu-gpu-tests
	$(MAKE) --no-print-directory BUILD=$(BUILD) emu-train-tests

# (Dependency files: the Makefile includes every .d under $(BUILD).)

# The streams' schedules (test/test_stream_schedules.py, test/emu/streams.cpp): every layout of
# ./train_emu under EMU_STREAMS schedules against sync, and sabotaged copies of it that must
# fail; and [kernels] cuda_graph's replays against eager runs (test/test_cuda_graphs.py). emu-train-link-info prints what a sabotaged copy is built with (one host source changed,
# compiled as $(BUILD)/host/%.o is, and linked as train_emu is).
emu-streams-tests: train_emu train_cpu
	BUILD=$(BUILD) test/emu/run_emu_tests.sh streams ./train_emu
emu-train-link-info:
	@echo "CXX=$(CXX)"
	@echo "CXXFLAGS=$(CXXFLAGS)"
	@echo "OBJ=$(SHARED_OBJ) $(EMU_CUDA_OBJ)"
	@echo "LDLIBS=$(LDLIBS)"
.PHONY: emu-streams-tests emu-train-link-info
