// kernels/cuda/attention_ptx.cuh - inline-PTX wrappers used by the flash attention kernels
// (through attention_tiles.cuh): cp.async with zero-fill, ldmatrix (plain and transposed) and the
// bf16 tensor-core mma.sync m16n8k16 with fp32 accumulators. Nothing else: keeping the PTX in one
// small file lets a host-side emulator of these few instructions stand in for it, so that the
// tile logic of attention_tiles.cuh and the kernels can be checked without a GPU.
//
// The emulated tier (test/emu, built with GPT5D_EMULATED_CUDA defined) replaces the inline asm
// with the emulator's warp-level model of the same instructions (test/emu/include/emu_ptx.h);
// that switch is the only difference between the two builds of the attention kernels.
#pragma once
#include <stdint.h>

namespace attention_tiles {

#ifdef GPT5D_EMULATED_CUDA

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  emu::cp_async(smem, gmem, 16, valid ? 16 : 0, "cp.async.cg.shared.global", __FILE__, __LINE__);
}
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  emu::cp_async(smem, gmem, 4, valid ? 4 : 0, "cp.async.ca.shared.global", __FILE__, __LINE__);
}
__device__ __forceinline__ void cp_async_commit() { emu::cp_async_commit(); }
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  emu::cp_async_wait(n);
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  emu::ldmatrix(r, 4, false, smem_row, "ldmatrix.sync.aligned.m8n8.x4.shared.b16", __FILE__,
                __LINE__);
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  emu::ldmatrix(r, 4, true, smem_row, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", __FILE__,
                __LINE__);
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  emu::mma_m16n8k16_bf16_f32(d, a, b0, b1, d, __FILE__, __LINE__);
}

#else  // the real instructions

// --- cp.async ------------------------------------------------------------------------------------

// 16 bytes global -> shared; with valid == false nothing is read and the 16 bytes are zeroed.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
  int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}
// 4 bytes global -> shared, zero when !valid (per-row statistics: lse, D).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem);
  int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most n groups committed by this thread are still in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

// --- ldmatrix and mma ---------------------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem_row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  uint32_t addr = (uint32_t)__cvta_generic_to_shared(smem_row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// d += a @ b for one 16x8 output tile: bf16 inputs, fp32 accumulation.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif  // GPT5D_EMULATED_CUDA

}  // namespace attention_tiles
