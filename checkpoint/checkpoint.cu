// checkpoint/checkpoint.cu - the save and resume protocols of checkpoint/checkpoint.h: who writes
// what when, how the ranks agree, how a checkpoint is committed and how one is found, verified
// and loaded. The bytes on disk are checkpoint/hdf5_format.cu's business, the durable file
// operations and the manifest checkpoint/files.cu's.
//
// Agreeing. Every step that can fail on one rank (a full disk, a corrupt file only one rank was
// asked to checksum) ends in fail_together: all ranks agree whether everyone succeeded
// (all_agree over the world); if not, the ranks' messages are gathered (all_gather_strings over
// the world) and every rank stops with the first one (FATAL_ALL: rank 0 prints it).
// No rank ever leaves the others waiting in a collective they will not reach.
#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <optional>
#include <tuple>

#include "checkpoint/data_record.h"
#include "checkpoint/dir_lock.h"
#include "checkpoint/files.h"
#include "checkpoint/hdf5_format.h"
#include "checkpoint/save_phases.h"
#include "kernels/trace.h"

static const StateKind kStates[] = {StateKind::Master, StateKind::AdamM, StateKind::AdamV};

static std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld", (long long)step);
  return name;
}

// "step_000123" -> 123; false for anything else (temporaries included).
static bool parse_step_dir(const std::string& name, int64_t* step) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return false;
  if (name.find_first_not_of("0123456789", 5) != std::string::npos) return false;
  *step = std::stoll(name.substr(5));
  return true;
}

// The step directories of `dir`, newest first.
static std::vector<int64_t> checkpoint_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  for (const std::string& name : list_dir(dir)) {
    int64_t s;
    if (parse_step_dir(name, &s) && is_directory(dir + "/" + name)) steps.push_back(s);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

static double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The first non-empty message over the ranks, in rank order ("" if every rank succeeded).
static std::string first_problem(Comm& world, const std::string& mine) {
  if (all_agree(world, mine.empty())) return "";
  for (const std::string& problem : all_gather_strings(world, mine))
    if (!problem.empty()) return problem;
  return "";
}

// Stops the job with `what` + the first problem of any rank; returns if there is none.
static void fail_together(Comm& world, const std::string& problem, const std::string& what) {
  const std::string first = first_problem(world, problem);
  if (first.empty()) return;
  FATAL_ALL("%s%s", what.c_str(), first.c_str());  // every rank holds `first`: one message
}

// fail_together for a save: first rank 0 removes the save's temporary directory, so that a failed
// save (a full disk) leaves the directory as the previous save left it.
static void fail_save_together(Comm& world, const std::string& problem, const std::string& what,
                               const std::string& tmp) {
  const std::string first = first_problem(world, problem);
  if (first.empty()) return;
  if (world.rank == 0) {
    remove_tree(tmp);
    sync_dir(parent_dir(tmp));
  }
  FATAL_ALL("%s%s", what.c_str(), first.c_str());
}

// The model's shape as the index records it, and the format version it needs (hdf5_format.h).
static void record_shape(CheckpointMeta& m, const ModelConfig& model, const GPTLayout& g) {
  m.L = g.L, m.NH = g.NH, m.C = g.C, m.T = g.T, m.V = g.V, m.Vp = g.Vp, m.maxT = g.maxT;
  m.llama = g.llama, m.NKV = g.NKV, m.F = g.F, m.tied = g.tied;
  if (g.E == 0) return;
  m.format_version = kCheckpointFormatMoe;
  m.E = g.E, m.d_expert = g.d_expert, m.moe_every = model.moe_every;
  m.n_shared = model.n_shared_experts;
}

// ---------------------------------------------------------------------------------------------
// Saving
// ---------------------------------------------------------------------------------------------
bool checkpoint_due(const Config& cfg, int step) {
  const CheckpointConfig& c = cfg.checkpoint;
  return !c.dir.empty() && ((c.every > 0 && step % c.every == 0) || step == cfg.train.steps);
}

double checkpoint_snapshot_if_due(AsyncSave& async, const Config& cfg, int step,
                                  const GPTLayout& layout, ParamStore& store, const RunState& run,
                                  Mesh& mesh) {
  if (!cfg.checkpoint.async || !checkpoint_due(cfg, step) || step == cfg.train.steps) return -1;
  return async_save_begin(async, cfg, step, layout, store, run, mesh);
}

bool checkpoint_after_step(AsyncSave& async, const Config& cfg, int step, const GPTLayout& layout,
                           ParamStore& store, const RunState& run, Mesh& mesh, bool now) {
  const bool last = step == cfg.train.steps;
  const bool began = async.in_flight && async.target.step == step;
  async_save_poll(async, cfg, layout, mesh[Axis::World], /*wait=*/now || last);
  if (began) return true;  // finished above when `now`
  if (cfg.checkpoint.dir.empty() || (!now && !checkpoint_due(cfg, step))) return false;
  checkpoint_save(cfg, step, layout, store, run, mesh);
  return true;
}

// Every rank's file digest, on every rank (in writer order: writer = world rank here).
static std::vector<FileDigest> gather_digests(Comm& world, const FileDigest& mine) {
  const uint64_t send[2] = {mine.bytes, mine.crc32};
  std::vector<uint64_t> recv(2 * (size_t)world.size);
  all_gather_host(world, send, sizeof(send), recv.data());
  std::vector<FileDigest> all(world.size);
  for (int r = 0; r < world.size; r++) {
    all[r].bytes = recv[2 * r];
    all[r].crc32 = (uint32_t)recv[2 * r + 1];
  }
  return all;
}

// Deletes the oldest checkpoints of this run's history beyond `keep`: directories step_N with
// N <= step (higher ones belong to a run abandoned by resuming an older checkpoint; each is
// replaced when this run reaches its step). Each is renamed to a temporary first.
static void remove_beyond_keep(const std::string& dir, int64_t step, int keep) {
  std::vector<int64_t> steps;
  for (int64_t s : checkpoint_steps(dir))
    if (s <= step) steps.push_back(s);
  for (size_t i = (size_t)keep; i < steps.size(); i++) {
    const std::string victim = dir + "/" + step_dir_name(steps[i]);
    const std::string doomed = victim + ".deleted.tmp";
    if (rename(victim.c_str(), doomed.c_str()) == 0) remove_tree(doomed);
  }
  sync_dir(dir);
}

// Rank 0, after every rank file is on disk: index, manifest, rename, `latest`, keep.
static std::string commit(const Config& cfg, int step, const GPTLayout& layout,
                          const RunState& run, const std::string& tmp,
                          const std::vector<FileDigest>& rank_digests) {
  const std::string dir = cfg.checkpoint.dir, name = step_dir_name(step);
  CheckpointMeta meta;
  meta.step = step;
  meta.seed = cfg.train.seed;
  meta.data = run.data;
  meta.loss_trend = run.loss_trend;
  meta.moe_bias = run.moe_bias;
  meta.config_toml = cfg.toml_text;
  meta.writers = (int)rank_digests.size();
  meta.writer_tp = layout.tp.size();
  meta.writer_cp = layout.cp->size;
  meta.writer_pp = layout.pp.p();
  meta.writer_pp_virtual = layout.pp.v;
  meta.writer_pp_order = layout.pp.order == StageOrder::V ? 1 : 0;
  for (int s = 0; s + 1 < (int)layout.stage_first.size(); s++)  // recorded when not equal
    meta.writer_pp_layers.push_back(layout.stage_first[s + 1] - layout.stage_first[s]);
  if (std::adjacent_find(meta.writer_pp_layers.begin(), meta.writer_pp_layers.end(),
                         std::not_equal_to<int>()) == meta.writer_pp_layers.end())
    meta.writer_pp_layers.clear();
  meta.writer_ep = layout.ep->size;
  meta.islands = cfg.parallel.diloco_islands;
  meta.writer_dp_replicate = cfg.parallel.dp_replicate;
  record_shape(meta, cfg.model, layout);
  std::vector<ManifestEntry> entries(1);
  entries[0].file = kIndexFileName;
  std::string problem = h5_write_index(tmp + "/" + kIndexFileName,
                                       writer_units(cfg.model, writer_shape(meta)), meta,
                                       &entries[0].digest);
  for (size_t w = 0; w < rank_digests.size(); w++)
    entries.push_back({rank_file_name((int)w), rank_digests[w]});
  entries.emplace_back();
  if (problem.empty()) problem = data_record_write(tmp, run.mix, &entries.back());
  if (problem.empty()) problem = write_file_synced(tmp + "/manifest.txt", manifest_text(entries));
  if (problem.empty()) problem = sync_dir(tmp);
  // Commit: from here on the checkpoint is complete under its final name.
  if (problem.empty()) problem = rename_replacing(tmp, dir + "/" + name);
  if (problem.empty()) problem = sync_dir(dir);
  if (problem.empty()) problem = write_file_atomically(dir + "/latest", name + "\n");
  if (!problem.empty()) return problem;
  remove_tree(tmp);  // what a swap left there: a same-named checkpoint of an abandoned run
  remove_beyond_keep(dir, step, cfg.checkpoint.keep);
  return "";
}

SaveTarget save_begin(const Config& cfg, int step, const RunState& run, Comm& world) {
  SaveTarget t;
  t.start = std::chrono::steady_clock::now();
  t.step = step, t.run = run;
  t.dir = cfg.checkpoint.dir, t.name = step_dir_name(step);
  t.tmp = t.dir + "/" + t.name + ".tmp";
  std::string problem;
  if (world.rank == 0) {
    problem = make_dir(t.dir);
    remove_tree(t.tmp);
    if (problem.empty()) problem = make_dir(t.tmp);
  }
  fail_save_together(world, problem, "checkpoint " + t.dir + "/" + t.name + " not saved: ", t.tmp);
  return t;
}

std::string save_rank_file(const SaveTarget& t, int rank) {
  return t.tmp + "/" + rank_file_name(rank);
}

// Its slices of the ranks holding its units: over dp x cp, or its island's with DiLoCo (the dp
// group is the island's; dp x cp index = dp_rank * cp + cp_rank).
WriterShards save_writer_shards(Mesh& mesh) {
  const int cp = mesh.shape.cp, per = mesh.shape.dp / mesh.shape.islands;
  return WriterShards{mesh[Axis::DP].rank * cp + mesh[Axis::CP].rank, mesh[Axis::DP].size * cp,
                      mesh.shape.ep, mesh_coords(mesh.shape, mesh.world_rank).dp / per};
}

void save_finish(const Config& cfg, const GPTLayout& layout, const SaveTarget& t, Comm& world,
                 const std::string& write_problem, const FileDigest& digest, double written_s,
                 const std::string& how) {
  const std::string not_saved = "checkpoint " + t.dir + "/" + t.name + " not saved: ";
  std::string problem = write_problem;
  if (!problem.empty()) problem = "rank " + std::to_string(world.rank) + ": " + problem;
  fail_save_together(world, problem, not_saved, t.tmp);
  const std::vector<FileDigest> digests = gather_digests(world, digest);
  if (world.rank == 0) problem = commit(cfg, t.step, layout, t.run, t.tmp, digests);
  fail_save_together(world, problem, not_saved, t.tmp);
  if (world.rank != 0) return;
  uint64_t bytes = 0;
  for (const FileDigest& d : digests) bytes += d.bytes;
  std::printf("checkpoint %s/%s saved in %.3f s (%d rank files, %.1f MiB, written in %.3f s%s)\n",
              t.dir.c_str(), t.name.c_str(), seconds_since(t.start), world.size,
              bytes / 1048576.0, written_s, how.c_str());
  std::fflush(stdout);
}

void checkpoint_save(const Config& cfg, int step, const GPTLayout& layout, ParamStore& store,
                     const RunState& run, Mesh& mesh) {
  Comm& world = mesh[Axis::World];
  trace::Span whole(trace::Lane::Host, "checkpoint", "checkpoint save", nullptr);
  std::optional<trace::Span> phase(std::in_place, trace::Lane::Host, "checkpoint", "save begin",
                                   nullptr);  // the phases of checkpoint/save_phases.h
  const SaveTarget t = save_begin(cfg, step, run, world);
  phase.emplace(trace::Lane::Host, "checkpoint", "rank file", nullptr);
  ops::stream_sync(store.compute);  // the optimizer step has landed in the shards
  FileDigest digest;
  const std::string problem = h5_write_rank_file(save_rank_file(t, world.rank), store, layout,
                                                 save_writer_shards(mesh), mesh.shape, &digest,
                                                 world.rank, step);
  phase.emplace(trace::Lane::Host, "checkpoint", "save finish", nullptr);
  save_finish(cfg, layout, t, world, problem, digest, seconds_since(t.start), "");
}

// ---------------------------------------------------------------------------------------------
// Resuming
// ---------------------------------------------------------------------------------------------
// Leftovers of interrupted saves and deletions: step_*.tmp directories and latest.tmp.
static void remove_stale_temporaries(const std::string& dir) {
  for (const std::string& name : list_dir(dir)) {
    const bool tmp = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
    if (tmp && (name.compare(0, 5, "step_") == 0 || name == "latest.tmp")) {
      std::printf("checkpoint: removing %s/%s, left by an interrupted save\n", dir.c_str(),
                  name.c_str());
      remove_tree(dir + "/" + name);
    }
  }
  sync_dir(dir);
}

// Whether ckpt passes its manifest (presence and size of every file, the CRC32s shared over the
// ranks; agreed): "" or the first problem.
static std::string verify(const std::string& ckpt, Comm& world) {
  std::vector<ManifestEntry> entries;
  std::string problem = manifest_read(ckpt, &entries);
  if (problem.empty() && std::none_of(entries.begin(), entries.end(), [](const ManifestEntry& e) {
        return e.file == kIndexFileName;
      }))
    problem = ckpt + "/manifest.txt does not list " + kIndexFileName;
  if (problem.empty()) problem = manifest_verify(ckpt, entries, world.rank, world.size);
  return first_problem(world, problem);
}

// resume = "latest": the checkpoint `latest` names, or, when `latest` is missing or damaged or
// names a checkpoint that fails its manifest, the newest valid one older than it (any, when
// `latest` is no guide). "" when the directory holds no checkpoint. Every rank returns the same
// (the verification is agreed); rank 0 says what it skipped and why.
static std::string resolve_latest(const std::string& dir, Comm& world) {
  std::string text, why;
  int64_t named = -1;
  if (!read_text_file(dir + "/latest", &text)) why = dir + "/latest is missing";
  const std::string name = text.substr(0, text.find_last_not_of(" \n\r\t") + 1);
  if (why.empty() && !parse_step_dir(name, &named))
    why = dir + "/latest is damaged (it names no step_* directory)";
  if (why.empty() && !is_directory(dir + "/" + name)) {
    why = dir + "/latest names " + name + ", which does not exist";
    named = -1;
  }
  std::vector<int64_t> candidates;
  for (int64_t s : checkpoint_steps(dir))
    if (named < 0 || s <= named) candidates.push_back(s);
  if (world.rank == 0 && !why.empty() && !candidates.empty())
    std::printf("resume   %s: looking for the newest valid checkpoint\n", why.c_str());
  std::string problems;
  for (int64_t s : candidates) {
    const std::string ckpt = dir + "/" + step_dir_name(s);
    const std::string problem = verify(ckpt, world);
    if (problem.empty()) return ckpt;
    if (world.rank == 0) std::printf("resume   skipping %s: %s\n", ckpt.c_str(), problem.c_str());
    problems += "\n  " + problem;
  }
  if (!candidates.empty()) FATAL_ALL("cannot resume: no valid checkpoint in %s:%s", dir.c_str(),
                                     problems.c_str());
  return "";
}

// The checkpoint directory that [checkpoint] resume names (verified), "" for "latest" when there
// is none yet. Stops the job when there is no valid one.
static std::string resolve(const CheckpointConfig& c, Comm& world) {
  if (c.resume == "latest") return resolve_latest(c.dir, world);
  std::string ckpt;
  if (is_directory(c.resume)) ckpt = c.resume;
  else if (base_name(c.resume) == kIndexFileName) ckpt = parent_dir(c.resume);
  fail_together(world, ckpt.empty() ? "[checkpoint] resume = " + c.resume +
                ": not a checkpoint directory or " + kIndexFileName : "", "cannot resume: ");
  fail_together(world, verify(ckpt, world), "cannot resume: ");
  return ckpt;
}

// At start-up, before any step: [checkpoint] dir exists and every rank can write into it, and a
// run that does not resume does not silently replace the checkpoints already there; the
// directory and the metrics file are this job's alone (dir_lock.h) before anything is removed.
static void prepare_dir(const Config& cfg, Comm& world) {
  const CheckpointConfig& c = cfg.checkpoint;
  std::string problem;
  if (!c.dir.empty()) problem = checkpoint_dir_path_problem(c.dir, cfg.train.steps, world.size);
  fail_together(world, problem, "[checkpoint] dir = " + c.dir + " is too long: ");
  if (!c.dir.empty()) problem = probe_dir(c.dir, ".write_probe_rank_" + std::to_string(world.rank));
  fail_together(world, problem, "[checkpoint] dir = " + c.dir + " cannot hold checkpoints: ");
  job_locks_take(cfg, world);
  if (c.dir.empty()) return;
  if (world.rank == 0) remove_stale_temporaries(c.dir);
  std::string held;
  if (world.rank == 0 && c.resume.empty() && !c.overwrite) {
    for (int64_t s : checkpoint_steps(c.dir)) held += (held.empty() ? "" : ", ") + step_dir_name(s);
    if (held.empty() && path_exists(c.dir + "/latest")) held = "latest";
  }
  fail_together(world, held.empty() ? "" : "[checkpoint] dir = " + c.dir + " already holds "
                "checkpoints (" + held + ") and this run does not resume: set [checkpoint] "
                "resume = \"latest\" to continue from them, or [checkpoint] overwrite = true to "
                "train from scratch and replace them, or choose another dir", "");
}

static std::string shape_text(const CheckpointMeta& m) {
  char s[320];
  int n = std::snprintf(s, sizeof(s), "(n_layer %d, n_head %d, d_model %d, max_seq_len %d, "
                        "vocab_size %d", m.L, m.NH, m.C, m.maxT, m.V);
  if (m.llama)
    n += std::snprintf(s + n, sizeof(s) - n, ", arch llama, n_kv_head %d, d_ff %d, "
                       "tie_embeddings %s", m.NKV, m.F, m.tied ? "true" : "false");
  if (m.E > 0)
    n += std::snprintf(s + n, sizeof(s) - n, ", n_experts %d, d_expert %d, moe_every %d", m.E,
                       m.d_expert, m.moe_every);
  if (m.n_shared > 0)
    n += std::snprintf(s + n, sizeof(s) - n, ", n_shared_experts %d", m.n_shared);
  std::snprintf(s + n, sizeof(s) - n, ")");
  return s;
}

// The index against the model and the manifest: same shape (max_seq_len, not the seq_len it was
// trained at: any seq_len <= max_seq_len resumes it; the experts, not top_k: any top_k uses
// them); every writer file listed.
static std::string check_index(const CheckpointMeta& m, const ModelConfig& model,
                               const GPTLayout& g, const std::vector<ManifestEntry>& entries,
                               const std::string& ckpt) {
  CheckpointMeta want;
  record_shape(want, model, g);
  if (std::tie(m.L, m.NH, m.C, m.maxT, m.V, m.E, m.d_expert, m.moe_every, m.n_shared, m.llama,
               m.NKV, m.F, m.tied) != std::tie(want.L, want.NH, want.C, want.maxT, want.V, want.E,
                                               want.d_expert, want.moe_every, want.n_shared,
                                               want.llama, want.NKV, want.F, want.tied))
    return ckpt + " holds a model of shape " + shape_text(m) + " but the config asks for " +
           shape_text(want);
  for (int w = 0; w < m.writers; w++) {
    const std::string f = rank_file_name(w);
    if (std::none_of(entries.begin(), entries.end(),
                     [&](const ManifestEntry& e) { return e.file == f; }))
      return ckpt + "/manifest.txt does not list " + f + ", which the index reads";
  }
  return "";
}

// Opens the index of a verified checkpoint on every rank and checks it against the model.
static void open_index(const std::string& ckpt, const ModelConfig& model, const GPTLayout& layout,
                       Comm& world, CheckpointIndex* index, CheckpointMeta* meta) {
  std::vector<ManifestEntry> entries;
  std::string problem = manifest_read(ckpt, &entries);
  if (problem.empty()) problem = h5_open_index(ckpt + "/" + kIndexFileName, index, meta);
  if (problem.empty()) problem = check_index(*meta, model, layout, entries, ckpt);
  if (problem.empty()) problem = h5_check_rank_files(ckpt, *meta, world.rank, world.size);
  fail_together(world, problem, "cannot resume: ");
}

// The compressed reductions' residuals (hdf5_format.h): each rank its own, from its own file, when
// the layout is the writer's; else all are dropped, with one warning.
static void resume_residuals(const std::string& ckpt, ParamStore& store, const GPTLayout& layout,
                             Mesh& mesh) {
  Comm& world = mesh[Axis::World];
  const std::string file = ckpt + "/" + rank_file_name(world.rank);
  const bool exists = std::ifstream(file).good();  // a smaller world wrote no such file
  const std::string why = first_problem(
      world, exists ? h5_read_residuals(file, store, residual_layout(store, layout, mesh.shape))
                    : "the checkpoint has no rank file " + rank_file_name(world.rank));
  if (!why.empty()) {
    for (size_t u = 0; u < store.units.size(); u++) {
      const CompressedGrads& g = store.compression;
      const OuterState& o = store.outer;
      if (g.residual_at(u))
        ops::fill_zero(g.residual_at(u), g.residual_numel_at(u) * sizeof(float), store.compute);
      if (o.residual_at(u))
        ops::fill_zero(o.residual_at(u), o.residual_numel_at(u) * sizeof(float), store.compute);
    }
    ops::stream_sync(store.compute);
    const char* which = !store_compressed(store) ? "DiLoCo outer compression residuals"
                        : store.outer.compressed()
                            ? "gradient compression residuals and the DiLoCo outer ones"
                            : "gradient compression residuals";
    if (world.rank == 0)
      std::printf("resume   warning: dropping the %s (%s): what the last steps had not sent is "
                  "lost\n", which, why.c_str());
  }
}

// DiLoCo: a checkpoint of K islands resumes with K islands, each from its own state (any layout
// inside them); a checkpoint without islands starts islands from its state. Returns this rank's
// island in the checkpoint (0: the only one).
static int check_islands(const std::string& ckpt, const CheckpointMeta& meta, int islands,
                         Mesh& mesh) {
  Comm& world = mesh[Axis::World];
  if (meta.islands > 0 && meta.islands != islands)
    fail_together(world, ckpt + " was written by " + std::to_string(meta.islands) + " DiLoCo "
                  "island(s) (their weights differ between outer steps), but [parallel] "
                  "diloco_islands = " + std::to_string(islands) + ": resume it with "
                  "diloco_islands = " + std::to_string(meta.islands), "cannot resume: ");
  if (meta.islands == 0) {
    if (islands > 0 && world.rank == 0)
      std::printf("resume   %s has no DiLoCo islands: each of the %d islands starts from its "
                  "weights, with them as the synchronised weights and zero outer momentum\n",
                  ckpt.c_str(), islands);
    return 0;
  }
  return mesh_coords(mesh.shape, mesh.world_rank).dp / (mesh.shape.dp / mesh.shape.islands);
}

// DiLoCo's synchronised weights and outer momentum: from the checkpoint when it has them, else
// the loaded weights and zero (as diloco_init starts them).
static void resume_outer_state(const CheckpointIndex& index, const CheckpointMeta& meta,
                               ParamStore& store, const GPTLayout& layout) {
  if (!store.outer.on()) return;  // no DiLoCo
  if (meta.islands > 0) {
    for (StateKind kind : {StateKind::OuterSync, StateKind::OuterMomentum})
      param_store_load(store, layout.units, h5_index_fill(index, kind), kind);
    return;
  }
  for (size_t u = 0; u < store.units.size(); u++) {
    UnitState& us = store.units[u];
    float *sync = store.outer.sync[u], *m = store.outer.momentum[u];
    const size_t bytes = us.shard_numel * sizeof(float);
    if (store_offloaded(store)) {  // the outer state lives with the master, in host memory
      store_state_read(store, (int)u, StateKind::Master, us.shard_offset, us.shard_numel, sync);
      std::memset(m, 0, bytes);
      continue;
    }
    ops::copy_on_device(sync, us.master, bytes, store.compute);
    ops::fill_zero(m, bytes, store.compute);
  }
  ops::stream_sync(store.compute);
}

int checkpoint_resume(Config& cfg, const GPTLayout& layout, ParamStore& store,
                      DataMix& train_data, LossTrend* loss_trend,
                      std::vector<float>* moe_bias, Mesh& mesh) {
  Comm& world = mesh[Axis::World];
  const CheckpointConfig& c = cfg.checkpoint;
  prepare_dir(cfg, world);
  if (!c.dir.empty() || !c.resume.empty()) data_record_set(train_data, world);
  barrier(world);
  if (c.resume.empty()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ckpt = resolve(c, world);
  if (ckpt.empty()) {
    if (world.rank == 0)
      std::printf("resume   no checkpoint in %s yet: starting from step 0\n", c.dir.c_str());
    return 0;
  }
  CheckpointIndex index;
  CheckpointMeta meta;
  open_index(ckpt, cfg.model, layout, world, &index, &meta);
  const int island = check_islands(ckpt, meta, cfg.parallel.diloco_islands, mesh);
  for (StateKind kind : kStates)
    param_store_load(store, layout.units, h5_index_fill(index, kind, island_prefix(island)), kind);
  resume_outer_state(index, meta, store, layout);
  h5_close_index(index);
  if (store_has_residuals(store)) resume_residuals(ckpt, store, layout, mesh);

  if (meta.seed != cfg.train.seed && world.rank == 0)
    std::printf("resume   the checkpoint's seed %llu replaces [train] seed %llu\n",
                (unsigned long long)meta.seed, (unsigned long long)cfg.train.seed);
  cfg.train.seed = meta.seed;
  data_mix_set_seed(train_data, meta.seed);
  DataMixState state = data_mix_state(train_data);  // the counts: known only with a mix record
  state.pos[0] = meta.data;
  fail_together(world, data_record_resume(ckpt, cfg.data.allow_changed, train_data, &state,
                                          world), "cannot resume: ");
  data_mix_seek(train_data, state);
  *loss_trend = meta.loss_trend;
  *moe_bias = meta.moe_bias;
  if (world.rank == 0) {
    std::printf("resume   %s: step %lld, written by %d rank(s), loaded by %d in %.3f s\n",
                ckpt.c_str(), (long long)meta.step, meta.writers, world.size, seconds_since(t0));
    if (meta.step >= cfg.train.steps)
      std::printf("resume   [train] steps = %d: nothing left to do\n", cfg.train.steps);
    std::fflush(stdout);
  }
  return (int)meta.step;
}
