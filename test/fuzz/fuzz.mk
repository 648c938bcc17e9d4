# test/fuzz/fuzz.mk - the fuzz targets (test/fuzz/README.md), included by the Makefile.
#
#   make fuzz                 each target for FUZZ_SECONDS (default 60), new inputs kept in
#                             $(BUILD)/fuzz/corpus/<target>; a crash stops it and names the input
#   make fuzz-bins            the targets only
#   test/fuzz/run_corpus.sh   every saved input (test/fuzz/corpus/<target>) once: make test's part
#
# clang with libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer (Debian: clang,
# libclang-rt-14-dev; tools/install_deps.sh). Each target links only the reader it fuzzes
# (compiled again with the sanitizers) and kernels/common.cpp.
FUZZ_CXX     ?= clang++
FUZZ_SECONDS ?= 60
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_FLAGS   := -std=c++17 -g -O1 -MMD -MP -fno-omit-frame-pointer $(FUZZ_SAN) -I. $(MPI_CFLAGS) \
                $(HDF5_CFLAGS) $(TOML_CFLAGS)
FUZZ_TARGETS ?= config llmc_model token_shard tokenizer manifest checkpoint_resume schedule_file \
                safetensors hf_config data_manifest lock_file
FUZZ_BINS    := $(patsubst %,$(BUILD)/fuzz/fuzz_%,config llmc_model token_shard tokenizer \
                  manifest checkpoint_resume checkpoint_index schedule_file safetensors hf_config \
                  data_manifest lock_file)

# The readers, compiled with the sanitizers and fuzzer coverage.
$(BUILD)/fuzz/obj/%.o: %
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -x c++ -c $< -o $@
fuzz_obj = $(patsubst %,$(BUILD)/fuzz/obj/%.o,$(1) kernels/common.cpp)
CONFIG_READER := config/config.cu config/config_schema.cu config/config_checks.cu \
                 config/layout_rules.cu config/config_hf.cu config/json.cu \
                 config/device_peaks.cu config/size_limits.cu
# The schedule file reader, with the builder, message placement and simulator it runs (and
# pipeline_rules, which the builder calls).
SCHEDULE_READER := parallel/pipeline_file.cu parallel/pipeline_schedule.cu \
                   parallel/pipeline_messages.cu parallel/pipeline_simulator.cu \
                   config/layout_rules.cu

$(BUILD)/fuzz/fuzz_config: $(call fuzz_obj,test/fuzz/fuzz_config.cpp $(CONFIG_READER))
$(BUILD)/fuzz/fuzz_llmc_model: $(call fuzz_obj,test/fuzz/fuzz_llmc_model.cpp $(CONFIG_READER))
$(BUILD)/fuzz/fuzz_token_shard: $(call fuzz_obj,test/fuzz/fuzz_token_shard.cpp data/dataloader.cpp)
$(BUILD)/fuzz/fuzz_hf_config: $(call fuzz_obj,test/fuzz/fuzz_hf_config.cpp $(CONFIG_READER))
$(BUILD)/fuzz/fuzz_safetensors: \
    $(call fuzz_obj,test/fuzz/fuzz_safetensors.cpp checkpoint/safetensors.cu config/json.cu)
$(BUILD)/fuzz/fuzz_tokenizer: $(call fuzz_obj,test/fuzz/fuzz_tokenizer.cpp data/tokenizer.cpp)
$(BUILD)/fuzz/fuzz_manifest: $(call fuzz_obj,test/fuzz/fuzz_manifest.cpp checkpoint/files.cu)
$(BUILD)/fuzz/fuzz_checkpoint_resume: $(call fuzz_obj,test/fuzz/fuzz_checkpoint_resume.cpp \
                                               checkpoint/files.cu checkpoint/hdf5_read.cu)
$(BUILD)/fuzz/fuzz_checkpoint_index: \
    $(call fuzz_obj,test/fuzz/fuzz_checkpoint_index.cpp checkpoint/hdf5_read.cu)
$(BUILD)/fuzz/fuzz_lock_file: $(call fuzz_obj,test/fuzz/fuzz_lock_file.cpp checkpoint/files.cu)
$(BUILD)/fuzz/fuzz_data_manifest: \
    $(call fuzz_obj,test/fuzz/fuzz_data_manifest.cpp data/data_manifest.cpp data/dataloader.cpp)
$(BUILD)/fuzz/fuzz_schedule_file: \
    $(call fuzz_obj,test/fuzz/fuzz_schedule_file.cpp $(SCHEDULE_READER))
$(FUZZ_BINS):
	$(FUZZ_CXX) -fsanitize=fuzzer $(FUZZ_SAN) -o $@ $^ $(TOML_LIBS) $(HDF5_LIBS) $(MPI_LIBS)

-include $(shell find $(BUILD)/fuzz/obj -name '*.d' 2>/dev/null)

.PHONY: fuzz fuzz-bins
fuzz-bins: $(FUZZ_BINS)
fuzz: fuzz-bins
	BUILD=$(BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) test/fuzz/run_fuzz.sh $(FUZZ_TARGETS)
