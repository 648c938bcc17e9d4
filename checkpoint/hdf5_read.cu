// checkpoint/hdf5_read.cu - reading a checkpoint's index (checkpoint/hdf5_format.h): its
// metadata, and any block of any logical tensor through its virtual datasets, for whatever
// layout resumes it. Everything a damaged index can make HDF5 say comes back as a message naming
// the file; this is what test/fuzz/fuzz_checkpoint_index.cpp feeds arbitrary bytes.
#include <hdf5.h>

#include "checkpoint/hdf5_format.h"
#include "checkpoint/hdf5_plumbing.h"

using namespace h5;

// The loss's trend; a checkpoint older than it has none: a fresh one.
static LossTrend read_loss_trend(hid_t file) {
  LossTrend t;
  if (H5Lexists(file, "train", H5P_DEFAULT) <= 0) return t;
  H5Id train(ok(H5Gopen2(file, "train", H5P_DEFAULT), "no group train"));
  t.mean = read_attr_f64(train, "loss_mean");
  t.var = read_attr_f64(train, "loss_var");
  t.applied = read_attr_i64(train, "applied");
  t.skipped = read_attr_i64(train, "skipped");
  t.skipped_in_a_row = (int)read_attr_i64(train, "skipped_in_a_row");
  return t;
}

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------
std::string h5_open_index(const std::string& path, CheckpointIndex* index, CheckpointMeta* m) {
  quiet_hdf5();
  try {
    H5Id file(ok(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "cannot open"));
    m->format_version = (int)read_attr_i64(file, "format_version");
    if (m->format_version < kCheckpointFormatDense || m->format_version > kCheckpointFormatMoe)
      return path + ": format version " + std::to_string(m->format_version) +
             ", this trainer reads versions " + std::to_string(kCheckpointFormatDense) + " to " +
             std::to_string(kCheckpointFormatMoe);
    m->step = read_attr_i64(file, "step");
    m->writers = (int)read_attr_i64(file, "writers");
    m->writer_tp = (int)read_attr_or(file, "writer_tp", 1);
    m->writer_pp = (int)read_attr_or(file, "writer_pp", 1);
    m->writer_cp = (int)read_attr_or(file, "writer_cp", 1);
    m->writer_pp_virtual = (int)read_attr_or(file, "writer_pp_virtual", 1);
    m->writer_ep = (int)read_attr_or(file, "writer_ep", 1);
    m->islands = (int)read_attr_or(file, "diloco_islands", 0);
    m->writer_dp_replicate = (int)read_attr_or(file, "writer_dp_replicate", 1);
    m->writer_pp_order = (int)read_attr_or(file, "writer_pp_order", 0);
    m->writer_pp_layers = read_attr_ints_or_empty(file, "writer_pp_layers");
    m->E = (int)read_attr_or(file, "n_experts", 0);
    m->d_expert = (int)read_attr_or(file, "d_expert", 0);
    m->moe_every = (int)read_attr_or(file, "moe_every", 0);
    m->n_shared = (int)read_attr_or(file, "n_shared_experts", 0);
    int* shape[] = {&m->L, &m->NH, &m->C, &m->T, &m->V, &m->Vp};
    const char* names[] = {"n_layer", "n_head", "d_model", "seq_len", "vocab_size",
                           "padded_vocab"};
    for (int i = 0; i < 6; i++) *shape[i] = (int)read_attr_i64(file, names[i]);
    m->maxT = (int)read_attr_or(file, "max_seq_len", m->T);
    m->llama = (int)read_attr_or(file, "llama", 0);  // GPT-2's when absent
    m->NKV = (int)read_attr_or(file, "n_kv_head", m->NH);
    m->F = (int)read_attr_or(file, "d_ff", 4 * m->C);
    m->tied = (int)read_attr_or(file, "tie_embeddings", 1);
    H5Id rng(ok(H5Gopen2(file, "rng", H5P_DEFAULT), "no group rng"));
    H5Id seed(ok(H5Aopen(rng, "seed", H5P_DEFAULT), "no attribute rng/seed"));
    ok(H5Aread(seed, H5T_NATIVE_UINT64, &m->seed), "cannot read rng/seed");
    H5Id data(ok(H5Gopen2(file, "data", H5P_DEFAULT), "no group data"));
    m->data.epoch = read_attr_i64(data, "epoch");
    m->data.shard = read_attr_i64(data, "shard");
    m->data.row = read_attr_i64(data, "row");
    m->loss_trend = read_loss_trend(file);
    if (H5Lexists(file, "train", H5P_DEFAULT) > 0) {
      H5Id train(ok(H5Gopen2(file, "train", H5P_DEFAULT), "no group train"));
      m->moe_bias = read_attr_floats_or_empty(train, "moe_bias");
    }
    index->file = file.release();
    index->path = path;
  } catch (const H5Failure& e) {
    return path + ": " + e.what();
  }
  return "";
}

void h5_close_index(CheckpointIndex& index) {
  if (index.file >= 0) H5Fclose(index.file);
  index.file = -1;
}

// Reads block b of the logical tensor behind `ds` into dst (b.rows x b.cols, row-major).
static void read_block(hid_t ds, const TensorPlacement& t, const Block& b, float* dst) {
  H5Id fspace(ok(H5Dget_space(ds), "H5Dget_space"));
  const int rank = ok(H5Sget_simple_extent_ndims(fspace), "H5Sget_simple_extent_ndims");
  std::vector<hsize_t> dims(rank);
  ok(H5Sget_simple_extent_dims(fspace, dims.data(), nullptr), "H5Sget_simple_extent_dims");
  if (dims != dataset_dims(t))
    throw H5Failure("has shape " + shape_text(dims) + ", the model's tensor is " +
                    shape_text(dataset_dims(t)));
  select_block(fspace, t, b);
  hsize_t n = b.numel();
  H5Id mspace(ok(H5Screate_simple(1, &n, nullptr), "H5Screate_simple"));
  ok(H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, dst), "cannot read");
}

ParamFill h5_index_fill(const CheckpointIndex& index, StateKind kind, const std::string& prefix) {
  const hid_t file = index.file;
  const std::string path = index.path;
  return [file, path, kind, prefix](const TensorPlacement& t, const Block& b, float* dst) {
    const std::string name = prefix + state_kind_name(kind) + "/" + t.name;
    try {
      H5Id ds(ok(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "no such dataset"));
      read_block(ds, t, b, dst);
    } catch (const H5Failure& e) {
      FATAL("checkpoint %s: /%s: %s", path.c_str(), name.c_str(), e.what());
    }
  };
}
