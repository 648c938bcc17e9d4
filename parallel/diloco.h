// parallel/diloco.h - DiLoCo islands: K groups of data-parallel ranks that train alone for H
// steps and then meet for one outer optimizer step (Douillard et al., 2023).
//
// The idea. The dp ranks form K islands of dp/K consecutive dp ranks. Inside an island training
// is what it is without islands - DDP, ZeRO-1/2, FSDP, tensor, pipeline and context parallelism,
// experts with expert parallelism - because the island's groups are the mesh's groups
// (parallel/mesh.h: with islands the dp group, dp x cp (dense gradients and FSDP shards under cp)
// and ep-dp (expert gradients) are the island's, the ep all-to-all groups lie inside one island
// (config/layout_rules.cu: ep | dp/K * cp), and the gradient norm, FP8 agreement and the MoE
// balance counts stay inside the island too), and AdamW (the inner optimizer) updates the
// island's weights. Every H steps the islands meet. Each rank keeps,
// for the shard of every unit that it updates (parallel/param_store.h: the whole unit under DDP,
// under ZeRO and FSDP 1/(dp/K) of it, 1/(dp/K * cp) with cp, 1/(dp/K * cp / ep) of its expert
// units; of its tp rank's, pipeline stage's and ep rank's units), w_sync, the
// weights of the last meeting, and the outer momentum m (fp32, one value per weight of the
// shard, on the device, the same in every island):
//
//     delta  = mean over islands of (w_sync - w_island)        one all-reduce, island group
//     m      = mu * m + delta                                    (diloco_outer_momentum = mu)
//     w_sync = w_sync - lr_outer * (delta + mu * m)              Nesterov (diloco_outer_lr)
//     w      = w_sync on every rank                              (AdamW's m and v are kept)
//
// With one island, lr_outer = 1 and mu = 0 this is w = w_island: plain training.
//
// Who talks to whom. The island group of a rank (parallel/axis.h: Axis::Island) is the ranks at
// the same place in every island: same dp index inside the island, same tp, pp and cp
// coordinates, hence the same index in the island's dp x cp and the same ep rank (the island's
// ep blocks start at a multiple of ep). They hold the same shards of the same units - dense,
// router and experts alike (test/test_diloco_groups.cpp checks it on the placement map) - so
// the outer step is elementwise on the shard and no layout is special: the placement map
// already said which weights each rank updates. After the
// step the working copies follow as after an AdamW step (update_begin/update_end/updates_done of
// the parameter store: ZeRO-1/2 all-gather the new weights inside the island). Copies of a weight
// held by several ranks of an island (tp-replicated tails, the tied embedding's two pipeline
// stages) see the same deltas and stay equal.
//
// Bytes. Only the meeting crosses islands: one fp32 all-reduce per unit of the shard over the
// island group (K ranks): 4 S bytes of payload every H steps per rank, S the weights of its
// shards (the whole tp/pp/ep-local model under DDP, its shards of it under ZeRO/FSDP, as above);
// 4 S / H per step amortised (a ring puts 2(K-1)/K of it on the wire per rank). Inside an island
// the usual reductions over dp/K (dp/K * cp, and dp/K * cp / ep for experts) ranks, and the
// expert all-to-alls over its ep ranks.
//
// Where it lives. w_sync and m are the store's state (UnitState::outer_sync and outer_m, counted
// in its state memory: 8 bytes per weight of the shard), checkpointed as the logical tensors
// diloco/sync/<tensor> and diloco/m/<tensor> (checkpoint/hdf5_format.h); the outer arithmetic
// runs on the device (ops::diloco_outer_delta, ops::diloco_outer_step), the delta in one work
// buffer of the largest shard, reduced in place.
#pragma once

#include "config/config.h"
#include "parallel/mesh.h"
#include "parallel/param_store.h"

struct Diloco {
  int islands = 0, every = 1;  // 0: off (diloco_init not called)
  float outer_lr = 0.7f, momentum = 0.9f;
  Comm* island = nullptr;  // same place in every island
  float* delta = nullptr;  // device, the largest shard
};

bool diloco_enabled(const Config& cfg);  // [parallel] diloco_islands >= 1 (0 = off)
// The groups the parameter store uses (mesh_comms), its "world" (the gradient norm) the island's
// when there are islands: an island trains alone.
CommsByAxis diloco_store_comms(Mesh& mesh, const Config& cfg);
// Allocates every unit's outer state in the store's state memory: w_sync = the store's master
// weights, zero momentum. After the store is filled (a resumed checkpoint then overwrites both).
// With a count-only store (the planner) it only counts.
void diloco_init(Diloco& d, const Config& cfg, ParamStore& store, Comm& island);
// The payload of one outer all-reduce on this rank (island axis): 4 bytes per weight of its
// shards.
size_t diloco_outer_bytes(const ParamStore& store);
// After the optimizer step of `step` (1-based): every H steps, the outer step above.
void diloco_after_step(Diloco& d, ParamStore& store, int step);
