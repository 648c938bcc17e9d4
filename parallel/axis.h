// parallel/axis.h - the axes of the device mesh, as names. The mesh (parallel/mesh.h) has one
// group per axis; the placement map (parallel/placement.h) names the axis whose group sums a
// unit's gradient; the communicator's counters (parallel/comm.h) are kept per axis.
//
//   World  every rank
//   DP     ranks that differ only in their data-parallel coordinate
//   TP, PP, CP   the same for tensor, pipeline and context parallelism
//   EP     within dp x cp, consecutive blocks of ep ranks (the expert all-to-all)
//   DPCP   ranks that differ in dp and/or cp (dense gradients when cp > 1)
//   EPDP   within dp x cp, the ranks with the same ep coordinate (expert gradients)
//   Stage  the ranks of one pipeline stage: every axis but pp (FP8 amax agreement)
//   Embed  the first and the last pipeline stage of one pipeline (the tied embedding)
//   Island the ranks with the same place in each DiLoCo island (parallel/diloco.cu)
//   IslandWorld  every rank of this rank's DiLoCo island (the world without islands): the
//         gradient norm of the island's own training
//   CPA2A  [parallel] cp_comm = "hybrid": the cp ranks of this rank's all-to-all group (cp_a2a
//         consecutive ones); CPRing: the ranks at the same place of every such group (the ring
//         across them). One rank each under "ring" and "all-to-all", which use the cp group.
//   DPShard, DPCPShard, EPDPShard        HSDP ([parallel] dp_replicate = R > 1, parallel/hsdp.cu):
//   DPReplica, DPCPReplica, EPDPReplica  a gradient group (DP, DPCP, EPDP) cut into R blocks of
//         consecutive members; a Shard group is this rank's block (the ZeRO stages shard over
//         it), a Replica group the members at this rank's place in every block (they all-reduce
//         the shard). Without HSDP each is the rank alone (no unit names it).
#pragma once

enum class Axis : int { World = 0, DP, TP, PP, CP, EP, DPCP, EPDP, Stage, Embed, Island,
                        IslandWorld, CPA2A, CPRing, DPShard, DPReplica, DPCPShard, DPCPReplica,
                        EPDPShard, EPDPReplica, Count };

// "world", "dp", "tp", "pp", "cp", "ep", "dp*cp", "ep-dp", "stage", "embed", "island",
// "island-world", "cp-a2a", "cp-ring", "dp-shard", "dp-replica", "dp*cp-shard", "dp*cp-replica",
// "ep-dp-shard", "ep-dp-replica"
const char* axis_name(Axis a);
