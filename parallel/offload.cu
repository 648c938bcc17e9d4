// parallel/offload.cu - optimizer offload: the fp32 master weights and Adam moments of a rank's
// shard kept off the device, in host memory (ZeRO-Offload) or in a file (ZeRO-Infinity's NVMe
// offload), and AdamW run on the host.
//
// The idea. At any ZeRO stage (parallel/zero.cu) each rank updates 1/N of the model, and the
// update is the only thing that touches the master and the moments: 12 of the 16-18 bytes per
// parameter, used once per step, elementwise. The device must hold what the forward and the
// backward read and write (the working weights and the gradients); the optimizer state can live
// anywhere that the host can stream through once a step:
//
//   backward, unit u    its gradient shard is final -> copied down to host memory (the comm
//                       stream, behind the reduction, while units u-1 ... 0 run their backward)
//   step, unit u        AdamW on the host (kernels/host_adamw.h: vectorised, OpenMP) over the
//                       host master, m, v and gradient; it writes the new weights in the compute
//                       dtype into a staging buffer -> copied up into the unit's working copy
//   ZeRO-1/2            the new shards all-gathered, as without offload
//
// "cpu" keeps master, m and v of every unit in pinned host memory. "nvme" keeps them in one file
// per rank under [train] offload_dir, unit after unit ([master | m | v], each part rounded up to
// 4 KiB, read and written as one aligned block: O_DIRECT where the file system takes it), and
// holds two units' worth in host memory: while unit u is updated from slot u % 2, the file read of
// unit u+1 runs on a thread into the other slot, after the write-back of unit u-1 out of it.
//
//   host     |wait grad 0, read 0|AdamW 0|AdamW 1|AdamW 2| ...
//   io thread                    |read 1 |wb 0, read 2|wb 1, read 3| ...
//   comm         (grads down during the backward)     |up 0|up 1|up 2| ... |AG 0|AG 1| ...
//
// AdamW needs the step's global gradient norm (clipping), which needs every gradient: so the
// host update starts after the backward, and what overlaps the backward is the gradients' trip
// down. The norm and its clipping factor are computed on the device (parallel/param_store.cu);
// the factor comes down behind them, and the host waits for it once, before unit 0's update.
// These waits (the factor, each unit's gradient, each staging slot's copy up) are the offload's
// own host synchronisations: the host computes on the gradients, so it must have them. The file is scratch: a run re-creates it at start-up from the checkpoint (or the init),
// so a job killed mid-step loses nothing that a checkpoint holds, and it is removed at the end.
//
// Bytes, per rank, for Psi parameters, N ranks, compute dtype of b bytes:
//   device   the working weights and gradients of the stage (ZeRO-1: (b + 4) Psi, ZeRO-2:
//            b Psi + 4 Psi/N, ZeRO-3: (b + 4) Psi/N); no master, no moments
//   host     cpu: 16 Psi/N (master, m, v, gradient); nvme: 4 Psi/N (the gradient) + two slots
//            of the largest unit's shard (3 x 4 bytes each); both: two staging buffers (b bytes)
//   disk     nvme: 12 Psi/N (rounded up per unit to 4 KiB parts)
//   per step host link: 4 Psi/N down (gradients), b Psi/N up (weights); nvme file: 12 Psi/N read
//            and 12 Psi/N written
// All of it comes from the HostAllocator and the counters below, so the planner (which runs this
// code in count-only mode: no file, no host buffers, no host AdamW) reports exactly these.
//
// On the CPU backend the same path runs: "device" memory is host memory, the copies are memcpy,
// and the host AdamW is the backend's own loop, so an offloaded run equals the plain one bit for
// bit.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>

#include "parallel/param_store.h"

namespace {

constexpr size_t kOffloadBlock = 4096;  // file offsets, sizes and buffers are multiples of it

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// pread or pwrite of exactly `bytes`; "" or what failed, naming the file.
std::string file_io(int fd, void* buf, size_t bytes, size_t offset, bool write,
                    const std::string& path) {
  char* p = (char*)buf;
  while (bytes > 0) {
    const ssize_t n = write ? pwrite(fd, p, bytes, (off_t)offset) : pread(fd, p, bytes, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return std::string("cannot ") + (write ? "write " : "read ") + path + ": " +
             (n < 0 ? std::strerror(errno) : "unexpected end of file");
    p += n, bytes -= (size_t)n, offset += (size_t)n;
  }
  return "";
}

// Creates this rank's file (replacing a stale one) and reserves its bytes; "" or the problem,
// naming the directory.
std::string create_file(Offload& o, int world_rank) {
  char name[64];
  std::snprintf(name, sizeof(name), "/offload_rank%05d.bin", world_rank);
  o.path = o.dir + name;
  struct statvfs fs;
  if (statvfs(o.dir.c_str(), &fs) != 0)
    return "[train] offload_dir " + o.dir + ": " + std::strerror(errno);
  const double free_bytes = (double)fs.f_bavail * fs.f_frsize;
  char need[160];
  std::snprintf(need, sizeof(need), "this rank's file needs %.1f MiB, %.1f MiB are free",
                o.disk_bytes / 1048576.0, free_bytes / 1048576.0);
  if (free_bytes < (double)o.disk_bytes) return "[train] offload_dir " + o.dir + " is full: " + need;
  o.fd = open(o.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (o.fd < 0 && errno == EINVAL)  // the file system takes no direct I/O (tmpfs): the page cache
    o.fd = open(o.path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (o.fd < 0) return "[train] offload_dir " + o.dir + ": cannot create " + o.path + ": " +
                       std::strerror(errno);
  const int rc = posix_fallocate(o.fd, 0, (off_t)o.disk_bytes);
  if (rc == 0) return "";
  close(o.fd);
  o.fd = -1;
  unlink(o.path.c_str());
  return "[train] offload_dir " + o.dir + ": cannot reserve the file's bytes (" +
         std::strerror(rc) + "): " + need;
}

// File work for slot s, after whatever the slot's thread is doing.
void queue_io(Offload& o, int s, std::function<std::string()> work) {
  std::future<std::string> before = std::move(o.io[s]);
  o.io[s] = std::async(std::launch::async, [before = std::move(before), work]() mutable {
    const std::string problem = before.valid() ? before.get() : "";
    return problem.empty() ? work() : problem;
  });
}

void wait_io(Offload& o, int s) {
  if (!o.io[s].valid()) return;
  const std::string problem = o.io[s].get();
  CHECK(problem.empty(), "optimizer offload: %s", problem.c_str());
}

// Unit u's region of the file into (or out of) slot s.
void queue_region(Offload& o, int u, int s, bool write) {
  const size_t bytes = 3 * o.part_bytes[u], offset = o.file_offset[u];
  float* buf = o.state[s];
  queue_io(o, s, [&o, buf, bytes, offset, write] {
    return file_io(o.fd, buf, bytes, offset, write, o.path);
  });
}

bool on_file(const Offload& o) { return o.kind == OffloadKind::Nvme; }

// The host master, m and v of unit u: resident (cpu) or slot s (nvme).
void host_state(Offload& o, int u, int s, float** master, float** m, float** v) {
  if (!on_file(o)) {
    *master = o.master[u], *m = o.m[u], *v = o.v[u];
    return;
  }
  const size_t part = o.part_bytes[u] / sizeof(float);
  *master = o.state[s], *m = o.state[s] + part, *v = o.state[s] + 2 * part;
}

}  // namespace

void offload_init(ParamStore& st) {
  Offload& o = st.offload;
  HostAllocator& h = o.memory;
  auto host_floats = [&](size_t n) { return (float*)allocate_host(h, n * sizeof(float)); };
  size_t largest = 0;
  for (const UnitState& us : st.units) {
    const size_t n = us.shard_numel;
    largest = std::max(largest, n);
    o.grad.push_back(host_floats(n));
    o.grad_copied.push_back(allocate_event(st.work_memory));
    if (!on_file(o)) {
      o.master.push_back(host_floats(n)), o.m.push_back(host_floats(n));
      o.v.push_back(host_floats(n));
      continue;
    }
    o.part_bytes.push_back(round_up(n * sizeof(float), kOffloadBlock));
    o.file_offset.push_back(o.disk_bytes);
    o.disk_bytes += 3 * o.part_bytes.back();
  }
  o.factor_copied = allocate_event(st.work_memory);
  if (!st.count_only) o.clip_factor = (float*)ops::alloc_host_pinned(sizeof(float));
  for (int s = 0; s < 2; s++) {
    o.staging[s] = allocate_host(h, largest * dtype_size(st.dt));
    o.sent[s] = allocate_event(st.work_memory);
    if (on_file(o)) o.state[s] = (float*)allocate_host(h, 3 * round_up(largest * 4, kOffloadBlock));
  }
  if (!on_file(o) || st.count_only) return;
  const std::string problem = create_file(o, st.world_rank);
  CHECK(problem.empty(), "optimizer offload \"nvme\": %s", problem.c_str());
}

void offload_destroy(ParamStore& st) {
  Offload& o = st.offload;
  for (int s = 0; s < 2; s++) wait_io(o, s);
  if (o.fd >= 0) {
    close(o.fd);
    unlink(o.path.c_str());
    o.fd = -1;
  }
  ops::release_host_pinned(o.clip_factor);
  o.clip_factor = nullptr;
  host_allocator_free(o.memory);
}

void offload_grad_to_host(ParamStore& st, int u) {
  Offload& o = st.offload;
  const UnitState& us = st.units[u];
  const size_t bytes = us.shard_numel * sizeof(float);
  ops::copy_to_host_async(o.grad[u], us.grad, bytes, st.comm);  // behind the reduction
  ops::event_record(o.grad_copied[u], st.comm);
  o.stats.to_host_bytes += bytes;
}

ShardForUpdate offload_update_begin(ParamStore& st, int u) {
  Offload& o = st.offload;
  const UnitState& us = st.units[u];
  const int s = u % 2, units = (int)st.units.size();
  if (u == 0) {
    o.update_start = now_s();
    if (on_file(o) && !st.count_only) queue_region(o, 0, 0, false);
    ops::copy_to_host_async(o.clip_factor, st.clip_factor, sizeof(float), st.compute);
    ops::event_record(o.factor_copied, st.compute);
    if (!st.count_only) ops::event_sync(o.factor_copied);  // the factor is in host memory
  }
  if (!st.count_only) {
    ops::event_sync(o.sent[s]);         // the copy up out of this slot (unit u-2) is done
    ops::event_sync(o.grad_copied[u]);  // the gradient is in host memory
  }
  if (on_file(o)) {
    o.stats.disk_read_bytes += 3 * o.part_bytes[u];
    if (!st.count_only) {
      wait_io(o, s);  // unit u's region is in slot s
      if (u + 1 < units) queue_region(o, u + 1, 1 - s, false);  // after unit u-1's write-back
    }
  }
  ShardForUpdate r;
  host_state(o, u, s, &r.master, &r.m, &r.v);
  r.grad = o.grad[u];
  r.copy = o.staging[s];
  r.writes_copy = true;
  r.offset = us.shard_offset;
  r.on_host = true;
  return r;
}

void offload_update_end(ParamStore& st, int u) {
  Offload& o = st.offload;
  const UnitState& us = st.units[u];
  const int s = u % 2;
  const size_t bytes = us.shard_numel * dtype_size(st.dt);
  ops::copy_to_device_async(us.param_shard, o.staging[s], bytes, st.comm);
  ops::event_record(o.sent[s], st.comm);
  o.stats.to_device_bytes += bytes;
  if (!on_file(o)) return;
  o.stats.disk_write_bytes += 3 * o.part_bytes[u];
  if (!st.count_only) queue_region(o, u, s, true);
}

void offload_updates_done(ParamStore& st) {
  Offload& o = st.offload;
  for (int s = 0; s < 2; s++) wait_io(o, s);
  o.stats.host_ms = (now_s() - o.update_start) * 1e3;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints and loading: one state of one unit, through slot 0 (no step is under way).
// ---------------------------------------------------------------------------------------------
static float* resident(Offload& o, int u, StateKind k) {
  return k == StateKind::Master ? o.master[u] : k == StateKind::AdamM ? o.m[u] : o.v[u];
}

static void state_part_io(Offload& o, int u, StateKind k, bool write) {
  for (int s = 0; s < 2; s++) wait_io(o, s);
  const std::string problem = file_io(o.fd, o.state[0], o.part_bytes[u],
                                      o.file_offset[u] + (size_t)k * o.part_bytes[u], write, o.path);
  CHECK(problem.empty(), "optimizer offload: %s", problem.c_str());
}

void offload_state_read(ParamStore& st, int u, StateKind k, size_t first, size_t count,
                        float* host) {
  Offload& o = st.offload;
  const size_t at = first - st.units[u].shard_offset;
  if (!on_file(o)) return (void)std::memcpy(host, resident(o, u, k) + at, count * sizeof(float));
  state_part_io(o, u, k, false);
  std::memcpy(host, o.state[0] + at, count * sizeof(float));
}

void offload_state_write(ParamStore& st, int u, StateKind k, const float* host) {
  Offload& o = st.offload;
  const size_t bytes = st.units[u].shard_numel * sizeof(float);
  if (!on_file(o)) return (void)std::memcpy(resident(o, u, k), host, bytes);
  std::memset(o.state[0], 0, o.part_bytes[u]);
  std::memcpy(o.state[0], host, bytes);
  state_part_io(o, u, k, true);
}

std::string offload_banner(const ParamStore& st) {
  if (!store_offloaded(st)) return "";
  const Offload& o = st.offload;
  char line[4096];
  std::snprintf(line, sizeof(line), "offload  optimizer state and AdamW on the host (\"%s\"): "
                "%.1f MiB of pinned host memory%s, %.1f MiB on disk on rank 0\n",
                on_file(o) ? "nvme" : "cpu", o.memory.bytes / 1048576.0,
                o.path.empty() ? "" : (", file " + o.path).c_str(), o.disk_bytes / 1048576.0);
  return line;
}
