# test/emu/libs.mk - build rules of the library stand-ins of the emulated CUDA build (cuBLASLt,
# NCCL over MPI, cuDNN reporting "not supported"; cub is the header test/emu/include/cub/cub.cuh)
# and of their tests. Included by the Makefile (-include test/emu/libs.mk). See
# test/emu/LIBRARIES.md.
#
#   make emu-lib-tests     builds and runs every stand-in test (well under a minute)
#   $(BUILD)/emu/libcuda_standins.a   what the emulated ./train_emu and test programs link
#
# The stand-ins are plain g++ (no kernels): the real CUDA headers give every type and declaration
# (-isystem keeps their warnings out of -Wall -Wextra), the stand-ins define the functions.

EMU_INCLUDE   := test/emu/include
EMU_LIB_FLAGS := $(CXXFLAGS) -isystem $(CUDA_HOME)/include
EMU_STANDIN_SRC := $(wildcard test/emu/lib/*.cpp)
EMU_STANDIN_OBJ := $(patsubst %,$(BUILD)/emu/standins/%.o,$(EMU_STANDIN_SRC))
EMU_STANDINS   := $(BUILD)/emu/libcuda_standins.a

$(BUILD)/emu/standins/%.o: %
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_LIB_FLAGS) -c $< -o $@

$(EMU_STANDINS): $(EMU_STANDIN_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@
	ar rcs $@ $^

# The tests of the stand-ins (test/emu/test_*.cpp; their numpy halves are test/emu/test_*.py).
$(BUILD)/emu/test_cublaslt: test/emu/test_cublaslt.cpp test/emu/cublaslt_cases.h $(EMU_STANDINS)
	$(CXX) $(EMU_LIB_FLAGS) -o $@ $< $(EMU_STANDINS) $(LDLIBS)

$(BUILD)/emu/test_nccl: test/emu/test_nccl.cpp test/emu/nccl_collective_checks.h \
                        test/emu/nccl_p2p_checks.h $(EMU_STANDINS)
	$(CXX) $(EMU_LIB_FLAGS) -o $@ $< $(EMU_STANDINS) $(LDLIBS)

$(BUILD)/emu/test_cub: test/emu/test_cub.cpp $(EMU_INCLUDE)/cub/cub.cuh
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_LIB_FLAGS) -I$(EMU_INCLUDE) -o $@ $<

# attention_cudnn.cu itself, compiled by g++ against the cuDNN stand-in.
$(BUILD)/emu/test_cudnn: test/emu/test_cudnn.cpp kernels/cuda/attention_cudnn.cu \
                         $(BUILD)/host/kernels/common.cpp.o $(EMU_STANDINS)
	$(CXX) $(EMU_LIB_FLAGS) -Wno-unknown-pragmas -o $@ $< $(BUILD)/host/kernels/common.cpp.o \
	  $(EMU_STANDINS) $(LDLIBS)

# The project's communicator test (test/test_comm.cpp) on the NCCL backend: parallel/comm_nccl.cu
# compiled by g++ against the NCCL stand-in, the "device" memory functions from the test-only
# test/emu/ops_host_memory.cpp. Run with COMM_TEST_BACKEND=nccl.
$(BUILD)/emu/host/%.o: % $(EMU_STANDINS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_LIB_FLAGS) -x c++ -c $< -o $@
EMU_NCCL_BACKEND_OBJ := $(call obj,host,$(filter-out parallel/comm_nccl_absent.cu,\
                          $(COMM_FAKE_DEVICE_SRC))) \
                        $(BUILD)/emu/host/parallel/comm_nccl.cu.o \
                        $(BUILD)/emu/host/parallel/nccl_watchdog.cu.o \
                        $(BUILD)/emu/host/test/emu/ops_host_memory.cpp.o
EMU_COMM_TEST_OBJ := $(EMU_NCCL_BACKEND_OBJ) $(call obj,host,test/test_comm.cpp)
$(BUILD)/emu/test_comm_nccl: $(EMU_COMM_TEST_OBJ) $(EMU_STANDINS)
	$(CXX) -o $@ $(EMU_COMM_TEST_OBJ) $(EMU_STANDINS) $(LDLIBS)
# The watchdog's operations (test/test_watchdog_comm.cpp) on the NCCL backend: its thread sees
# the stand-in's call never return and aborts (test/test_watchdog.py drives it).
$(BUILD)/emu/test_watchdog_comm_nccl: $(EMU_NCCL_BACKEND_OBJ) \
                                      $(call obj,host,test/test_watchdog_comm.cpp) $(EMU_STANDINS)
	$(CXX) -o $@ $(filter %.o,$^) $(EMU_STANDINS) $(LDLIBS)

EMU_LIB_TEST_BINS := $(BUILD)/emu/test_cublaslt $(BUILD)/emu/test_nccl $(BUILD)/emu/test_cub \
                     $(BUILD)/emu/test_cudnn $(BUILD)/emu/test_comm_nccl \
                     $(BUILD)/emu/test_watchdog_comm_nccl

.PHONY: emu-standins emu-lib-test-bins emu-lib-tests
emu-standins: $(EMU_STANDINS)
emu-lib-test-bins: $(EMU_LIB_TEST_BINS)
emu-lib-tests: emu-lib-test-bins
	BUILD=$(BUILD) test/emu/run_lib_tests.sh
