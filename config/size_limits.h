// config/size_limits.h - shapes and counts that would exhaust memory or time, refused before any
// work: the int rules of the sizes, the upper bounds of the counts, and the least memory a shape
// needs against what this machine has free.
//
// Sizes. Every size the trainer derives from [model] (the padded vocabulary, the parameter
// count, each tensor's bytes) is computed here in floating point first, so nothing overflows
// before it is checked: vocab_size must leave the padded vocabulary (a multiple of 128) an int,
// at most 2147483520; the parameter count must be below 2^53 (exact in a double; a byte count of
// it below 2^63).
//
// Files. The config file must be a regular file of at most 1 MiB (kMaxConfigBytes): a FIFO or
// /dev/urandom given as the config would otherwise never return. config.json is read under
// JSON's own limit (config/config_hf.cu), also regular files only.
//
// Counts. [log] sample_tokens <= 65536 and val_batches <= 1000000: a count past them runs for
// days, not the minutes a sample or an evaluation is for (docs/CONFIG.md).
//
// Memory (memory_bound_problem, each rank at start-up, before the model is laid out: a shape of
// 10^8 layers would take minutes and gigabytes just to describe). A lower bound of what the rank
// must hold, from the shape, the layout and the ZeRO stage alone:
//   the working copy of its weights (compute dtype; sharded over dp with ZeRO-3),
//   the fp32 master and both Adam moments, 12 bytes per weight (sharded over dp from ZeRO-1; on
//     the host with optimizer_offload = "cpu", in a file with "nvme"),
//   one activation per layer and token, the input each block keeps for its backward,
//   a Llama's rotary tables, max_seq_len x head_dim floats (on the host too),
// each divided by every degree that could split it (tp, pp, cp, ep), so the real figure is
// larger. A bound above the device's free memory (or, for what lives on the host, the host's
// MemAvailable; on the CPU backend the device is the host) is refused naming the keys that
// make the shape large and the bytes needed. This bound is cheap arithmetic, so that absurd
// shapes never reach the planner; train.cu then runs the planner (training/plan.h: the step
// dry, a fraction of a second) and checks its exact figures the same way (plan_memory_problem).
#pragma once
#include <cstddef>
#include <string>

#include "config/config.h"

constexpr long long kMaxConfigBytes = 1 << 20;  // a config file (TOML) is read whole
constexpr int kMaxVocabSize = 2147483520;  // INT_MAX rounded down to a multiple of 128
constexpr int kMaxSampleTokens = 65536;
constexpr int kMaxValBatches = 1000000;

// The parameters of cfg.model, computed in long double (no overflow at any int shape).
long double model_parameters(const ModelConfig& m);
// "" or why the rank cannot hold the shape: `device_free` bytes on its device, `host_free` on
// its host (device_is_host: the CPU backend, where they are one).
std::string memory_bound_problem(const Config& cfg, size_t device_free, size_t host_free,
                                 bool device_is_host);
// The host's MemAvailable (/proc/meminfo), in bytes; 0 when unknown.
size_t host_available_memory();
