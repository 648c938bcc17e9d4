// test/emu/test_emu.h - what the two files of the emulator's self-tests share: the check counter
// and host/device helpers (test_emu.cu: threads, shuffles, barriers, launches, failures;
// test_emu_ptx.cu: ldmatrix, mma, cp.async, fp8).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// Counts a named check and prints "ok" or "FAIL".
void check(bool ok, const std::string& what);

template <typename T>
T* device(size_t n) {
  void* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) std::abort();
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> host(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}
template <typename T>
void upload(T* d, const std::vector<T>& h) {
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
}

// test_emu_ptx.cu
void test_ldmatrix();
void test_mma();
void test_cp_async();
void test_fp8();

// test_emu_graphs.cu
void test_graphs();
