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
// Compressed meetings ([parallel] diloco_compression = "int8"). The all-reduce of the delta is
// grad_compression's int8 all-reduce (parallel/grad_compression.cu, the same code: blocks of 256
// values with an fp32 absmax scale, all-to-all of the chunks, each rank sums its chunk in fp32,
// requantises, all-gather), with error feedback of the outer delta: each rank keeps a residual
// e (OuterState::residual, fp32 on the device, the shard padded to K chunks) and sends
// delta + e; what its quantisation left out (and, for the chunk it owns, the error of
// requantising that chunk's sum) stays in e for the next meeting, so that over any number of
// meetings what arrived + the sum of the residuals = the sum of the deltas. The Nesterov step
// uses what arrived divided by K. Nothing is lost, only delayed by a
// meeting. The residual is per rank, like the gradient residuals: saved in the rank's own file
// (/residual/diloco_unit_<u>, checkpoint/hdf5_format.h) and resumed only under the same layout,
// else dropped with a warning. With one island nothing is sent and there is no residual.
// Under tp an int8 block scale mixes a unit's split deltas (different per tp rank) with its
// tp-replicated ones (the same on every tp rank), so the replicas would receive different
// approximations of the same delta and drift apart: in such a unit tp rank 0 alone sends the
// replicated part (the others zero it), and one all-reduce over tp after the meeting hands
// rank 0's result to all (4 bytes per replicated weight of the shard per meeting, over tp).
//
// Bytes. Only the meeting crosses islands: one all-reduce per unit of the shard over the island
// group (K ranks); S = the weights of a rank's shards (the whole tp/pp/ep-local model under DDP,
// its shards of it under ZeRO/FSDP, as above). Payload as parallel/comm.h counts it (all-reduce and
// all-to-all: the send buffer; all-gather: its output), per rank and meeting:
//   fp32   4 S, in one all-reduce per unit (a ring puts 2(K-1)/K of it on the wire);
//   int8   per unit of n weights an all-to-all and an all-gather of K records of ceil(n/K)
//          one-byte codes (rounded up to 4) and one fp32 scale per 256 codes: 1 byte + 4/256 per
//          weight each, about 2 (1 + 1/64) S in all; a ring puts (K-1)/K of each on the wire,
//          about 2 (1 + 1/64) S (K-1)/K against fp32's 8 S (K-1)/K: a quarter.
// Amortised per step: that / H (--plan prints it). Inside an island the usual reductions over
// dp/K (dp/K * cp, and dp/K * cp / ep for experts) ranks, and the expert all-to-alls over its
// ep ranks.
//
// Where it lives. w_sync and m are the store's state (OuterState::sync and momentum, counted
// in its state memory: 8 bytes per weight of the shard), checkpointed as the logical tensors
// diloco/sync/<tensor> and diloco/m/<tensor> (checkpoint/hdf5_format.h); the outer arithmetic
// runs on the device (ops::diloco_outer_delta, ops::diloco_outer_step), the delta in one work
// buffer of the largest shard, reduced in place (int8: the compressor's scratch, sized for the
// largest shard over K ranks, in the work memory too; the residuals in the state memory).
// Under optimizer offload (parallel/offload.cu) the master lives in host memory (or a file,
// streamed through host slots), so w_sync and m live in pinned host memory (the offload's
// HostAllocator, counted by the planner; with "nvme" too, not in the file) and the step runs on
// the host (kernels/host_diloco.h, the loop the CPU backend's ops run): the delta is computed on
// the host, copied to the device for the island all-reduce (fp32 or int8; the int8 residual stays
// on the device) and back, and the new weights go up through the offload's staging buffer as after
// AdamW.
#pragma once

#include "config/config.h"
#include "parallel/mesh.h"
#include "parallel/param_store.h"

struct Diloco {
  int islands = 0, every = 1;  // 0: off (diloco_init not called)
  float outer_lr = 0.7f, momentum = 0.9f;
  Comm* island = nullptr;  // same place in every island
  float* delta = nullptr;  // device, the largest shard
  float* host_delta = nullptr;  // optimizer offload: pinned host, the largest shard
  GradCompressor compressor;  // [parallel] diloco_compression: kind None (fp32) or Int8
};

bool diloco_enabled(const Config& cfg);  // [parallel] diloco_islands >= 1 (0 = off)
// The groups the parameter store uses (mesh_comms), its "world" (the gradient norm) the island's
// when there are islands: an island trains alone.
CommsByAxis diloco_store_comms(Mesh& mesh, const Config& cfg);
// Allocates every unit's outer state in the store's state memory: w_sync = the store's master
// weights, zero momentum (int8: zero residuals). After the store is filled (a resumed checkpoint
// then overwrites them). With a count-only store (the planner) it only counts.
void diloco_init(Diloco& d, const Config& cfg, ParamStore& store, Comm& island);
// The payload of one meeting on this rank (island axis): fp32 4 bytes per weight of its shards;
// int8 the compressed all-reduce's count above (0 with one island).
size_t diloco_outer_bytes(const Diloco& d, const ParamStore& store);
// After the optimizer step of `step` (1-based): every H steps, the outer step above.
void diloco_after_step(Diloco& d, ParamStore& store, int step);
