// parallel/diloco_state.h - DiLoCo's outer state in the parameter store ([parallel]
// diloco_islands; the algorithm, who talks to whom and the bytes: parallel/diloco.h). Per unit,
// for this rank's shard (shard_numel fp32 values each): the weights of the last meeting and the
// outer momentum, on the device (in pinned host memory under optimizer offload), and with
// diloco_compression = "int8" the error feedback of the outer delta, on the device. The store
// keeps it because checkpoints read and write it as two more states of every shard
// (StateKind::OuterSync, OuterMomentum, parallel/param_store.h); parallel/diloco.cu fills it.
#pragma once
#include <cstddef>
#include <vector>

struct OuterState {
  std::vector<float*> sync;      // w_sync per unit; empty without DiLoCo
  std::vector<float*> momentum;  // the outer momentum m per unit
  // int8 meetings: what this rank's compressed outer all-reduces have not sent yet, per unit
  // (residual_numel floats); empty without them or with one island.
  std::vector<float*> residual;
  std::vector<size_t> residual_numel;
  bool on() const { return !sync.empty(); }
  bool compressed() const { return !residual.empty(); }
  // Unit u's residual and its length (null and 0 where there is none).
  float* residual_at(size_t u) const { return u < residual.size() ? residual[u] : nullptr; }
  size_t residual_numel_at(size_t u) const {
    return u < residual_numel.size() ? residual_numel[u] : 0;
  }
};
