// test/emu/ptx.cpp - the PTX instructions of kernels/cuda/attention_ptx.cuh, emulated at the
// level of a warp, as the PTX ISA specifies them (the layouts are spelled out in
// test/emu/include/emu_ptx.h; section "Warp-level matrix instructions" of the PTX ISA for ldmatrix
// and mma.m16n8k16, "Data movement: cp.async" for the copies).
//
// ldmatrix and mma are warp-collective (.sync.aligned): each lane hands its operands to the
// warp operation (blocks.cpp, warp_sync), which waits until all 32 lanes are there - a lane that
// has exited, or a warp of fewer than 32 threads, is an error - and the last lane to arrive
// computes the results of all of them from the operands of all of them. So the data move between
// lanes exactly as the fragment layouts say, and a kernel that gets a layout wrong gets wrong
// numbers, as it would on a GPU.
//
// cp.async is per thread: the copy is queued with its group and performed when the thread's
// cp.async.wait_group completes that group (the latest moment the ISA allows), never earlier.
#include <cstring>

#include "test/emu/emu_internal.h"

namespace emu {

namespace {

float bf16_to_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t low_half(uint32_t r) { return (uint16_t)(r & 0xFFFFu); }
uint16_t high_half(uint32_t r) { return (uint16_t)(r >> 16); }

void check_full_warp(WarpCall* const* lanes, unsigned mask) {
  if (mask != 0xFFFFFFFFu)
    fail("%s (%s:%d) needs all 32 lanes of the warp; mask 0x%08x", lanes[0]->name, lanes[0]->file,
         lanes[0]->line, mask);
}

// --- ldmatrix ---------------------------------------------------------------------------------
struct LdmatrixIn {
  const void* row;  // this lane's row address
  int num;          // matrices: 1, 2 or 4
  bool trans;
};

void complete_ldmatrix(WarpCall* const* lanes, unsigned mask) {
  check_full_warp(lanes, mask);
  const LdmatrixIn& first = *static_cast<const LdmatrixIn*>(lanes[0]->in);
  const int num = first.num;
  const bool trans = first.trans;
  uint16_t m[4][8][8];  // [matrix][row][column]
  for (int l = 0; l < 32; l++) {
    const LdmatrixIn& in = *static_cast<const LdmatrixIn*>(lanes[l]->in);
    if (in.num != num || in.trans != trans)
      fail("%s (%s:%d): the lanes of the warp disagree on the shape", lanes[l]->name,
           lanes[l]->file, lanes[l]->line);
    if (l >= 8 * num) continue;  // lanes beyond the matrices' rows give no address
    if (reinterpret_cast<uintptr_t>(in.row) % 16 != 0)
      fail("%s (%s:%d): lane %d's row address %p is not 16-byte aligned", lanes[l]->name,
           lanes[l]->file, lanes[l]->line, l, in.row);
    if (!find_shared(in.row, 16))
      fail("%s (%s:%d): lane %d's row [%p, +16) is not in the block's shared memory",
           lanes[l]->name, lanes[l]->file, lanes[l]->line, l, in.row);
    std::memcpy(m[l / 8][l % 8], in.row, 16);
  }
  for (int l = 0; l < 32; l++) {
    uint32_t* r = static_cast<uint32_t*>(lanes[l]->out);
    const int g = l / 4, c = 2 * (l % 4);
    for (int i = 0; i < num; i++) {
      const uint16_t lo = trans ? m[i][c][g] : m[i][g][c];
      const uint16_t hi = trans ? m[i][c + 1][g] : m[i][g][c + 1];
      r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
  }
}

// --- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ---------------------------------------
struct MmaIn {
  uint32_t a[4];
  uint32_t b[2];
  float c[4];
};

void complete_mma(WarpCall* const* lanes, unsigned mask) {
  check_full_warp(lanes, mask);
  count_tensor_flops(2.0 * 16 * 8 * 16);  // EMU_COUNTS: one m16n8k16 per warp
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; l++) {
    const MmaIn& in = *static_cast<const MmaIn*>(lanes[l]->in);
    const int g = l / 4, t = l % 4;
    for (int half = 0; half < 2; half++) {
      // a[0]: row g, a[1]: row g+8, a[2]: row g cols +8, a[3]: row g+8 cols +8.
      A[g][2 * t + half] = bf16_to_float(half ? high_half(in.a[0]) : low_half(in.a[0]));
      A[g + 8][2 * t + half] = bf16_to_float(half ? high_half(in.a[1]) : low_half(in.a[1]));
      A[g][2 * t + 8 + half] = bf16_to_float(half ? high_half(in.a[2]) : low_half(in.a[2]));
      A[g + 8][2 * t + 8 + half] = bf16_to_float(half ? high_half(in.a[3]) : low_half(in.a[3]));
      B[2 * t + half][g] = bf16_to_float(half ? high_half(in.b[0]) : low_half(in.b[0]));
      B[2 * t + 8 + half][g] = bf16_to_float(half ? high_half(in.b[1]) : low_half(in.b[1]));
      C[g][2 * t + half] = in.c[half];
      C[g + 8][2 * t + half] = in.c[2 + half];
    }
  }
  float D[16][8];
  for (int i = 0; i < 16; i++)
    for (int j = 0; j < 8; j++) {
      float acc = C[i][j];
      for (int k = 0; k < 16; k++) acc += A[i][k] * B[k][j];  // exact product, one rounding
      D[i][j] = acc;
    }
  for (int l = 0; l < 32; l++) {
    float* d = static_cast<float*>(lanes[l]->out);
    const int g = l / 4, t = l % 4;
    d[0] = D[g][2 * t];
    d[1] = D[g][2 * t + 1];
    d[2] = D[g + 8][2 * t];
    d[3] = D[g + 8][2 * t + 1];
  }
}

void perform(const AsyncCopy& c) {
  std::memcpy(c.dst, c.src, (size_t)c.src_size);
  std::memset(static_cast<char*>(c.dst) + c.src_size, 0, (size_t)(c.cp_size - c.src_size));
}

}  // namespace

void ldmatrix(uint32_t* r, int num, bool trans, const void* smem_row, const char* name,
              const char* file, int line) {
  LdmatrixIn in{smem_row, num, trans};
  WarpCall call{&complete_ldmatrix, name, 0xFFFFFFFFu, 0, 0, &in, r, file, line};
  warp_sync(&call);
}

void mma_m16n8k16_bf16_f32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                           const float (&c)[4], const char* file, int line) {
  MmaIn in{{a[0], a[1], a[2], a[3]}, {b0, b1}, {c[0], c[1], c[2], c[3]}};
  float out[4];
  WarpCall call{&complete_mma, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                0xFFFFFFFFu, 0, 0, &in, out, file, line};
  warp_sync(&call);
  for (int i = 0; i < 4; i++) d[i] = out[i];
}

// --- cp.async ----------------------------------------------------------------------------------
void cp_async(void* smem, const void* gmem, int cp_size, int src_size, const char* name,
              const char* file, int line) {
  Fiber* f = running_fiber();
  if (!f) fail("%s (%s:%d) outside a kernel", name, file, line);
  if (src_size < 0 || src_size > cp_size)
    fail("%s (%s:%d): src-size %d outside [0, %d]", name, file, line, src_size, cp_size);
  if (reinterpret_cast<uintptr_t>(smem) % cp_size || reinterpret_cast<uintptr_t>(gmem) % cp_size)
    fail("%s (%s:%d): dst %p and src %p must be aligned to the %d-byte copy", name, file, line,
         smem, gmem, cp_size);
  if (!find_shared(smem, (size_t)cp_size))
    fail("%s (%s:%d): dst [%p, +%d) is not in the block's shared memory", name, file, line, smem,
         cp_size);
  if (src_size > 0 && find_shared(gmem, 1))
    fail("%s (%s:%d): src %p is in shared memory; cp.async copies from global", name, file, line,
         gmem);
  if (src_size > 0) count_global_read(gmem, (size_t)src_size);  // EMU_COUNTS
  f->copies.push_back(AsyncCopy{smem, gmem, cp_size, src_size, -1});
}

void cp_async_commit() {
  Fiber* f = running_fiber();
  if (!f) fail("cp.async.commit_group outside a kernel");
  bool any = false;
  for (AsyncCopy& c : f->copies)
    if (c.group < 0) {
      c.group = f->next_group;
      any = true;
    }
  (void)any;  // an empty group is allowed and completes at once
  f->next_group++;
}

void cp_async_wait(int n) {
  Fiber* f = running_fiber();
  if (!f) fail("cp.async.wait_group outside a kernel");
  const long complete_before = f->next_group - n;  // groups older than the n most recent
  size_t kept = 0;
  for (size_t i = 0; i < f->copies.size(); i++) {
    const AsyncCopy& c = f->copies[i];
    if (c.group >= 0 && c.group < complete_before)
      perform(c);
    else
      f->copies[kept++] = c;
  }
  f->copies.resize(kept);
}

void complete_all_copies(Fiber& f) {
  for (const AsyncCopy& c : f.copies) perform(c);
  f.copies.clear();
}

}  // namespace emu
