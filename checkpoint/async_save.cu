// checkpoint/async_save.cu - asynchronous checkpoints (checkpoint/async_save.h): a host copy of
// this rank's state, a writer thread per save, and the usual commit once every rank's file is
// written.
#include "checkpoint/async_save.h"

#include <chrono>

static double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The writer thread: the rank file from the copy, each part freed once it is in the file.
static void write_copy(AsyncSave* a, int rank) {
  a->problem = h5_write_rank_file(save_rank_file(a->target, rank), a->contents, [a](size_t i) {
    if (i > 0) std::vector<float>().swap(a->parts[i - 1]);
    return (const float*)a->parts[i].data();
  }, &a->digest);
  a->parts.clear();
  a->written_s = seconds_since(a->target.start);
  a->written.store(true, std::memory_order_release);
}

double async_save_begin(AsyncSave& a, const Config& cfg, int step, const GPTLayout& layout,
                        ParamStore& store, const RunState& run, Mesh& mesh) {
  const auto t0 = std::chrono::steady_clock::now();
  Comm& world = mesh[Axis::World];
  async_save_poll(a, cfg, layout, world, /*wait=*/true);  // one save in flight at a time
  a.target = save_begin(cfg, step, run, world);
  a.contents = rank_file_contents(layout, save_writer_shards(mesh), store, mesh.shape);
  a.contents.writer = world.rank, a.contents.step = step;
  ops::stream_sync(store.compute);  // the optimizer step has landed in the shards
  a.parts.assign(a.contents.items(), {});  // the parts, then the residuals (hdf5_format.h)
  for (size_t i = 0; i < a.parts.size(); i++) {
    a.parts[i].resize(a.contents.item_floats(i));
    copy_item(store, a.contents, i, a.parts[i].data());
  }
  a.copy_s = seconds_since(a.target.start);
  a.written.store(false);
  a.in_flight = true;
  a.writer = std::thread(write_copy, &a, world.rank);
  return seconds_since(t0);
}

void async_save_poll(AsyncSave& a, const Config& cfg, const GPTLayout& layout, Comm& world,
                     bool wait) {
  if (!a.in_flight) return;
  if (wait) a.writer.join();
  if (!wait && !all_agree(world, a.written.load(std::memory_order_acquire))) return;
  if (!wait) a.writer.join();
  char how[160];
  std::snprintf(how, sizeof(how), "; asynchronous: copied to host in %.3f s, written while "
                "training went on", a.copy_s);
  a.in_flight = false;
  save_finish(cfg, layout, a.target, world, a.problem, a.digest, a.written_s, how);
}
