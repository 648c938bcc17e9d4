// kernels/counter_rng.h - SplitMix64, the counter-based hash behind the random numbers that must
// not depend on the layout: the initial weights (model/init.cu, a value per (seed, tensor,
// index)) and the data mix's draws (data/data_mix.cpp, a dataset per (seed, global row)). A pure
// function of its input: any rank computes any draw without the ones before it.
#pragma once
#include <cstdint>

constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;  // 2^64 / golden ratio

inline uint64_t splitmix64(uint64_t x) {
  x += kSplitMixGamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The top 53 bits of a hash as a uniform double in [0, 1).
inline double uniform53(uint64_t h) { return (double)(h >> 11) * 0x1.0p-53; }
