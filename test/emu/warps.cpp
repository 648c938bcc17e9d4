// test/emu/warps.cpp - the warp operations of the emulator: __syncwarp, the shuffles and
// __reduce_max_sync here, ldmatrix and mma in ptx.cpp, all through warp_sync.
//
// A warp operation completes when every lane of its mask waits in the same operation with the
// same mask. Each lane that arrives files its WarpCall (kept on its own stack) and suspends; the
// last lane of the mask to arrive calls the operation's `complete` function, which reads every
// lane's operands and writes every lane's result, and makes the other lanes runnable. So values
// cross lanes only when the whole group is there, as the *_sync intrinsics and .sync.aligned
// instructions promise, and never by accident of the order in which the emulator ran the lanes.
// Errors (with threads, files and lines): a mask without the calling lane, a lane of the mask
// that does not exist (block size not a multiple of 32) or has exited, lanes meeting in one
// operation from different source lines (only __syncwarp may), a shuffle reading a lane outside
// its mask. A lane waiting in another operation (a shuffle of its half-warp, say) has just not
// arrived yet; if it never can, the block stalls and blocks.cpp reports the deadlock.
#include <cstring>

#include "test/emu/emu_internal.h"

namespace emu {

namespace {

// The lanes of the mask must exist and be alive when a warp operation starts (a lane that exits
// later, while the operation waits for it, is caught in fiber_exit). A lane that waits in another
// operation has just not arrived yet (it may be finishing a shuffle of its half-warp); if it
// never can, the block stalls and the deadlock is reported.
void check_warp_members(const Block& b, const Fiber& f, const WarpCall* call) {
  const unsigned warp = f.state.warp;
  for (int l = 0; l < 32; l++) {
    if (!(call->mask >> l & 1u)) continue;
    const int t = (int)warp * 32 + l;
    if (t >= b.threads)
      fail("%s (%s:%d, mask 0x%08x): lane %d of warp %u does not exist (the block has %d "
           "threads)", call->name, call->file, call->line, call->mask, l, warp, b.threads);
    if (b.fibers[t].wait == Wait::Done)
      fail("%s (%s:%d, mask 0x%08x): lane %d has exited", call->name, call->file, call->line,
           call->mask, l);
  }
}

// The lanes of a shuffle, a reduction, ldmatrix or mma must execute the same instruction (CUDA
// and the PTX ISA leave anything else undefined); only __syncwarp may be met from different
// places.
void check_same_place(WarpCall* const* lanes, const WarpCall* call) {
  for (int l = 0; l < 32; l++) {
    const WarpCall* c = lanes[l];
    if ((call->mask >> l & 1u) &&
        (c->line != call->line || (c->file != call->file && std::strcmp(c->file, call->file))))
      fail("the lanes of mask 0x%08x meet in %s from different places: %s:%d and %s:%d (CUDA "
           "requires the same instruction)", call->mask, call->name, c->file, c->line, call->file,
           call->line);
  }
}

}  // namespace

void warp_sync(WarpCall* call) {
  Fiber* f = running_fiber();
  if (!f) fail("%s (%s:%d) called outside a kernel", call->name, call->file, call->line);
  Block& b = *running_block();
  const unsigned lane = f->state.lane, warp = f->state.warp, bit = 1u << lane;
  if (!(call->mask & bit))
    fail("%s (%s:%d): the mask 0x%08x leaves out the calling lane %u", call->name, call->file,
         call->line, call->mask, lane);
  // The group of lanes waiting in this operation with this mask; the first lane opens it. (Other
  // lanes' calls are read only when the group completes: they live on other fibers' stacks.)
  WarpState& w = b.warps[warp];
  int g = 0;
  while (g < w.group_count && !(w.groups[g].complete == call->complete &&
                                w.groups[g].mask == call->mask && !(w.groups[g].arrived & bit)))
    g++;
  if (g == w.group_count) {
    if (g == 4) fail("%s (%s:%d): more than 4 warp operations in flight in one warp", call->name,
                     call->file, call->line);
    check_warp_members(b, *f, call);
    w.groups[g] = WarpGroup{call->complete, call->mask, 0};
    w.group_count++;
  }
  w.lanes[lane] = call;
  w.groups[g].arrived |= bit;
  if (w.groups[g].arrived != call->mask) {
    f->wait = Wait::Warp;
    f->wait_name = call->name;
    f->wait_file = call->file;
    f->wait_line = call->line;
    f->warp_call = call;
    yield_fiber();
    return;
  }
  // The last lane: the operation completes for all of them.
  w.groups[g] = w.groups[--w.group_count];
  if (call->complete != &complete_nothing) check_same_place(w.lanes, call);
  call->complete(w.lanes, call->mask);
  for (unsigned m = call->mask & ~bit; m; m &= m - 1) {
    const int l = __builtin_ctz(m);
    w.lanes[l] = nullptr;
    make_runnable(b, (int)warp * 32 + l);
  }
  w.lanes[lane] = nullptr;
}

void complete_nothing(WarpCall* const*, unsigned) {}

void complete_shuffle(WarpCall* const* lanes, unsigned mask) {
  for (int l = 0; l < 32; l++) {
    if (!(mask >> l & 1u)) continue;
    const WarpCall* c = lanes[l];
    const int src = c->src_lane;
    if (src < 0 || src > 31 || !(mask >> src & 1u))
      fail("%s (%s:%d): lane %d reads lane %d, outside the mask 0x%08x (undefined in CUDA)",
           c->name, c->file, c->line, l, src, mask);
    if (lanes[src]->bytes != c->bytes)
      fail("%s (%s:%d): lanes shuffle values of different sizes", c->name, c->file, c->line);
    std::memcpy(c->out, lanes[src]->in, (size_t)c->bytes);
  }
}

template <typename T>
void reduce_max(WarpCall* const* lanes, unsigned mask) {
  bool first = true;
  T m = 0;
  for (int l = 0; l < 32; l++) {
    if (!(mask >> l & 1u)) continue;
    T v;
    std::memcpy(&v, lanes[l]->in, sizeof(T));
    m = first || v > m ? v : m;
    first = false;
  }
  for (int l = 0; l < 32; l++)
    if (mask >> l & 1u) std::memcpy(lanes[l]->out, &m, sizeof(T));
}
void complete_reduce_max_u32(WarpCall* const* lanes, unsigned mask) {
  reduce_max<uint32_t>(lanes, mask);
}
void complete_reduce_max_s32(WarpCall* const* lanes, unsigned mask) {
  reduce_max<int32_t>(lanes, mask);
}

}  // namespace emu
