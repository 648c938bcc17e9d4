// parallel/diloco.h - DiLoCo islands: K groups of data-parallel ranks that train alone for H
// steps and then meet for one outer optimizer step (Douillard et al., 2023).
//
// The idea. The dp ranks form K islands of dp/K consecutive dp ranks. Inside an island training
// is plain DDP: the gradient all-reduce runs over the island's dp group (parallel/mesh.h: with
// islands the dp group is the island's) and AdamW (the inner optimizer) updates the island's
// weights. Every H steps the islands meet. Each keeps w_sync, the weights of the last meeting,
// and the outer momentum m (both fp32, one value per weight, the same on every rank):
//
//     delta  = mean over islands of (w_sync - w_island)        one all-reduce, island group
//     m      = mu * m + delta                                    (diloco_outer_momentum = mu)
//     w_sync = w_sync - lr_outer * (delta + mu * m)              Nesterov (diloco_outer_lr)
//     w      = w_sync on every rank                              (AdamW's m and v are kept)
//
// With one island, lr_outer = 1 and mu = 0 this is w = w_island: plain training.
//
// Bytes. Only the meeting crosses islands: one fp32 all-reduce of the N weights of a rank's
// replica over the island group (K ranks), 4N bytes of payload every H steps, 4N/H per step
// amortised (a ring puts 2(K-1)/K of it on the wire per rank). Inside an island: DDP's 4N per
// step over dp/K ranks.
//
// Where it lives. w_sync and m are host memory (2 x 4N bytes per rank, like the DiLoCo paper's
// outer state on the CPU); the delta travels through one device buffer of the largest unit
// (work memory) so that NCCL can reduce it. The arithmetic is on the host, in fp32, in the order
// above; the new weights go back into the master weights of the parameter store and its
// compute-dtype working copy.
#pragma once
#include <vector>

#include "config/config.h"
#include "parallel/param_store.h"

struct Diloco {
  int islands = 0, every = 1;  // 0: off (diloco_init not called)
  float outer_lr = 0.7f, momentum = 0.9f;
  Comm* island = nullptr;                  // same place in every island
  std::vector<std::vector<float>> w_sync;  // per unit, the unit's numel
  std::vector<std::vector<float>> outer_m;
  float* delta = nullptr;                  // device, the largest unit
};

bool diloco_enabled(const Config& cfg);  // [parallel] diloco_islands >= 1 (0 = off)
// Keeps the store's weights as the first w_sync; zero momentum. After the store is filled. With
// a count-only store (the planner) it only counts the device buffer.
void diloco_init(Diloco& d, const Config& cfg, ParamStore& store, Comm& island);
// The payload of one outer all-reduce on this rank (island axis): 4 bytes per weight it holds.
size_t diloco_outer_bytes(const ParamStore& store);
// After the optimizer step of `step` (1-based): every H steps, the outer step above.
void diloco_after_step(Diloco& d, ParamStore& store, int step);
