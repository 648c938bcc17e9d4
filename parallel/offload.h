// parallel/offload.h - the data of optimizer offload: where a rank's fp32 master weights and Adam
// moments live when they are not on the device (host memory or a file), and the buffers that
// carry gradients down and new weights up. How it works, and the bytes, are at the top of
// parallel/offload.cu; its functions are the store's (parallel/param_store.h).
#pragma once
#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/ops.h"

enum class OffloadKind { None, Cpu, Nvme };

// One step's offload traffic (reset with store_stats_reset), as the metrics and the planner
// report it: bytes over the host link each way, bytes read from and written to the file, and the
// wall time of the host optimizer (from the first unit's update to the last one's).
struct OffloadStats {
  uint64_t to_host_bytes = 0, to_device_bytes = 0;
  uint64_t disk_read_bytes = 0, disk_write_bytes = 0;
  double host_ms = 0;
};

struct Offload {
  OffloadKind kind = OffloadKind::None;  // set before param_store_init
  std::string dir;                       // nvme: [train] offload_dir, set before param_store_init
  // Per unit. grad: the gradient shard in host memory, copied down as soon as it is final.
  // cpu: master, m, v of the shard in host memory. nvme: the unit's region of the file,
  // [master | m | v], each part `part_bytes` (the shard rounded up to kOffloadBlock).
  std::vector<float*> grad, master, m, v;
  std::vector<ops::Event> grad_copied;  // the gradient's copy down is done
  // The step's clipping factor (computed on the device, parallel/param_store.cu grad_norm),
  // copied down before the first unit's host update: pinned, outside `memory` (4 bytes).
  float* clip_factor = nullptr;
  ops::Event factor_copied = nullptr;
  std::vector<size_t> file_offset, part_bytes;
  // Two slots, used by units alternately (unit u: slot u % 2), so that one unit's transfers and
  // file reads run while the other is updated. staging: the new weights in the compute dtype on
  // their way up; sent: that copy is done. nvme: state, the unit's region as read from the file;
  // io, the file work under way for the slot (a read, or a write-back then the next read).
  void* staging[2] = {nullptr, nullptr};
  ops::Event sent[2] = {nullptr, nullptr};
  float* state[2] = {nullptr, nullptr};
  std::future<std::string> io[2];
  std::string path;   // nvme: this rank's file
  int fd = -1;
  size_t disk_bytes = 0;  // the file's size
  HostAllocator memory;   // every host buffer above (pinned)
  OffloadStats stats;
  double update_start = 0;  // seconds, steady clock: when the host optimizer began this step
};
