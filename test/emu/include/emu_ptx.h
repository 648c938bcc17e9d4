// test/emu/include/emu_ptx.h - the PTX instructions of kernels/cuda/attention_ptx.cuh, emulated
// (test/emu/ptx.cpp). attention_ptx.cuh calls these in the emulated build instead of its inline
// asm; the kernels above it are the same code in both builds.
//
//   cp.async.{ca,cg}.shared.global [dst], [src], cp_size, src_size
//       Per thread: queued, and copied (src_size bytes, the rest of cp_size zero-filled) only
//       when a cp.async.wait_group of the same thread completes its group - the latest point the
//       PTX ISA allows, so that reading the destination before the wait reads stale data (and
//       another thread's copy is visible only after its wait and a barrier). dst must be in the
//       block's shared memory, src outside it, both aligned to cp_size.
//   cp.async.commit_group / cp.async.wait_group n
//       commit closes the thread's open copies into a group; wait completes the thread's oldest
//       groups until at most n are pending (copies never committed are not waited for).
//   ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16
//       Warp-collective: lanes 8i..8i+7 give the row addresses of matrix i (16 bytes each,
//       16-byte aligned, in shared memory); lane l receives in register i the two 16-bit
//       elements at row l/4, columns 2(l%4) and 2(l%4)+1 of matrix i (with .trans: rows 2(l%4)
//       and 2(l%4)+1 of column l/4), the lower column (row) in the low half.
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, c
//       Warp-collective D = A B + C, A 16x16, B 16x8 bf16, C and D fp32, with g = lane/4,
//       t = lane%4: a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..],
//       a[3] = A[g+8][2t+8..]; b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g];
//       c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1] (the low half holds the lower
//       index). Each D[i][j] = C[i][j] + A[i][0]B[0][j] + ... + A[i][15]B[15][j] summed in fp32
//       in that order, one rounding per addition (the products of bf16 values are exact in fp32).
//       A tensor core adds in another, undocumented way, so results agree with a GPU's to fp32
//       rounding, not bitwise.
#pragma once

#include <cstdint>

namespace emu {

void cp_async(void* smem, const void* gmem, int cp_size, int src_size, const char* name,
              const char* file, int line);
void cp_async_commit();
void cp_async_wait(int n);
void ldmatrix(uint32_t* r, int num, bool trans, const void* smem_row, const char* name,
              const char* file, int line);
void mma_m16n8k16_bf16_f32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                           const float (&c)[4], const char* file, int line);

}  // namespace emu
