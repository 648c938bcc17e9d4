// parallel/hsdp.cu - Hybrid Sharded Data Parallel ([parallel] dp_replicate = R): shard inside a
// block of S ranks, replicate across R blocks (torchtitan's data_parallel_replicate_degree,
// DeepSpeed's hpZ / MiCS). Any ZeRO stage (0-3, parallel/zero.cu has the ladder) runs on top.
//
// The idea. FSDP over all N = dp ranks divides the state by N, but every all-gather and every
// reduce-scatter spans all N ranks - across nodes, over the slow links, several times a step.
// HSDP cuts the data-parallel group into R replicas of S = N/R consecutive ranks (one node, say):
// the ZeRO stages shard over the S ranks of a replica only, so every weight gather and gradient
// reduce-scatter stays inside it, and only the gradient shards cross between replicas, once per
// step. The gradient of the global batch is still the sum over all N ranks, taken in two stages:
//
//     g_shard(s) = sum over the S ranks of replica r of their shard s of g     (reduce-scatter)
//     g(s)       = sum over the R replicas of g_shard(s)                         (all-reduce)
//
// after which the R ranks holding shard s (one per replica) hold the same gradient, run the same
// AdamW on the same master shard, and stay bitwise equal without exchanging weights (DDP's
// argument, applied per shard). The order of the fp32 additions differs from one flat reduction,
// so HSDP equals plain FSDP within rounding, not bitwise.
//
// Who talks to whom. dp ranks d = 0 .. N-1 of a gradient group (its members in order; with cp > 1
// the dp x cp group, with experts the ranks holding the same experts: every group is cut alike):
//
//   shard group    d / S * S .. d / S * S + S - 1   (S consecutive)   gathers, reduce-scatters
//   replica group  d % S, d % S + S, ..., d % S + (R-1) S   (R ranks)  all-reduce of the shard
//
//   N = 4, R = 2, S = 2:        shard groups {0 1} {2 3}      replica groups {0 2} {1 3}
//      replica 0: [d0 | d1]  <-- all-reduce shard 0: d0 <-> d2, shard 1: d1 <-> d3 -->
//      replica 1: [d2 | d3]       replica 1's ranks hold the same shards as replica 0's
//
// The mesh (parallel/mesh.cu) has the sub-groups as their own axes (dp-shard / dp-replica,
// dp*cp-shard / dp*cp-replica, ep-dp-shard / ep-dp-replica); the placement map says which a unit
// uses (ParamUnit::grad_replicas, shard_axis, replica_axis below), so the store, the planner and
// the checkpoints read it from there.
//
// Bytes per step, per rank, Psi parameters of a unit in fp32 gradients (b bytes per weight),
// payload (ring wire factors: (n-1)/n for gathers and reduce-scatters, 2(n-1)/n for all-reduce):
//
//   collective                         group        FSDP over N     HSDP (R x S)
//   gradient reduce-scatter            shard        4 Psi over N    4 Psi over S    per micro-batch
//                                                                                   (ZeRO-1: once)
//   gradient all-reduce of the shard   replica      -               4 Psi/S over R  once per step
//   weight all-gather (ZeRO-1/2 once,  shard        b Psi over N    b Psi over S
//   FSDP twice per micro-batch)
//   state on the device                             16 Psi / N      16 Psi / S (fp32)
//
// On the slow links only the replica all-reduce: 2 (R-1)/R x 4 Psi/S bytes per step, against
// FSDP's (N-1)/N x (4 + 2b) Psi per micro-batch when its groups span nodes. Under DDP (zero = 0)
// the unit is one shard of the whole unit: the all-reduce over the shard group and then over the
// replicas is a two-level all-reduce, the same bytes as DDP's in two hops.
//
// Timeline of one step, FSDP, R = 2, S = 2, two units (u1, u0) and the root; the replica
// all-reduce of a unit's shard follows its last reduce-scatter on the comm stream:
//
//   compute |fwd 0|fwd 1|head|bwd 1      |bwd 0      |emb |           |AdamW on the shards|
//   comm    |AG 1 |          |AG 0|RS 1(S)|AR 1(R)|RS 0(S)|AR 0(R)|RS root|AR root|
//            (S): inside a replica (one node)   (R): across the replicas (one rank per node)
//
// Checkpoints store logical tensors, so a run under dp_replicate resumes under any layout and
// back (the load fills each rank's shard from them). Each element is written once: the R ranks
// of a replica group hold the same shard, so each writes its replica-th of R equal parts of it
// (saver_range; the index attribute writer_dp_replicate says how the writers were cut).
#include "parallel/param_store.h"

Axis shard_axis(const ParamUnit& u) {
  if (u.grad_replicas <= 1) return u.grad_axis;
  switch (u.grad_axis) {
    case Axis::DP: return Axis::DPShard;
    case Axis::DPCP: return Axis::DPCPShard;
    case Axis::EPDP: return Axis::EPDPShard;
    default: BUG("HSDP: no shard group of axis %s", axis_name(u.grad_axis));
  }
}

Axis replica_axis(const ParamUnit& u) {
  if (u.grad_replicas <= 1) return Axis::Count;
  switch (u.grad_axis) {
    case Axis::DP: return Axis::DPReplica;
    case Axis::DPCP: return Axis::DPCPReplica;
    case Axis::EPDP: return Axis::EPDPReplica;
    default: BUG("HSDP: no replica group of axis %s", axis_name(u.grad_axis));
  }
}

// rank = replica * S + place in the replica (the shard groups are blocks of S consecutive ranks).
FlatRange saver_range(const ParamUnit& u, int rank, int ranks) {
  const int R = u.grad_replicas, S = ranks / R;
  if (R <= 1) return shard_range(u.numel, rank, ranks);
  const FlatRange shard = shard_range(u.numel, rank % S, S);
  const size_t n = shard.size(), part = rank / S;
  return {shard.first + n * part / R, shard.first + n * (part + 1) / R};
}

// After the last micro-step's reduction of the unit over its shard group (queued on the comm
// stream), the replicas sum their shards: one all-reduce of shard_numel floats over R ranks.
void hsdp_reduce_replicas(ParamStore& st, int unit) {
  UnitState& us = st.units[unit];
  if (!us.replica || us.replica->size < 2) return;
  grad_sum(st, *us.replica, us.grad, us.shard_numel);  // in [parallel] reduce_dtype
}
