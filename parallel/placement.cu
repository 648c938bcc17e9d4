// parallel/placement.cu - building placements and the geometry every shard and every block of a
// tensor is computed with (parallel/placement.h).
#include "parallel/placement.h"

#include <algorithm>

#include "kernels/common.h"

int64_t TensorPlacement::local_rows() const {
  int64_t n = 0;
  for (const RowRange& r : row_ranges) n += r.count;
  return n;
}

TensorPlacement replicated(const std::string& name, int64_t rows, int64_t cols) {
  TensorPlacement t;
  t.name = name;
  t.rows = rows;
  t.cols = cols;
  t.row_ranges = {{0, rows}};
  t.local_cols = cols;
  return t;
}

TensorPlacement split_rows(const std::string& name, int64_t rows, int64_t cols, int parts,
                           int tp_rank, int tp) {
  CHECK(rows % ((int64_t)parts * tp) == 0, "%s: %lld rows do not split into %d x tp=%d parts",
        name.c_str(), (long long)rows, parts, tp);
  return split_row_sections(name, std::vector<int64_t>(parts, rows / parts), cols, tp_rank, tp);
}

TensorPlacement split_row_sections(const std::string& name, const std::vector<int64_t>& sections,
                                   int64_t cols, int tp_rank, int tp) {
  int64_t rows = 0;
  for (int64_t n : sections) {
    CHECK(n % tp == 0, "%s: a section of %lld rows does not split over tp=%d", name.c_str(),
          (long long)n, tp);
    rows += n;
  }
  TensorPlacement t = replicated(name, rows, cols);
  t.row_ranges.clear();
  int64_t first = 0;
  for (int64_t n : sections) {
    t.row_ranges.push_back({first + tp_rank * (n / tp), n / tp});
    first += n;
  }
  t.tp_split = tp > 1;
  return t;
}

TensorPlacement split_cols(const std::string& name, int64_t rows, int64_t cols, int tp_rank,
                           int tp) {
  CHECK(cols % tp == 0, "%s: %lld columns do not split over tp=%d", name.c_str(),
        (long long)cols, tp);
  TensorPlacement t = replicated(name, rows, cols);
  t.local_cols = cols / tp;
  t.col_first = tp_rank * t.local_cols;
  t.tp_split = tp > 1;
  return t;
}

void add_tensor(ParamUnit& u, TensorPlacement t) {
  t.offset = round_up(u.numel, kTensorAlign);
  u.numel = t.offset + t.local_numel();
  u.tensors.push_back(t);
}

// Checks that decayed, split and partial tensors each form the ranges the header promises, and
// records where those ranges end.
void finish_unit(ParamUnit& u) {
  u.numel = round_up(u.numel, kTensorAlign);
  u.decay_numel = u.split_numel = 0;
  u.partial_begin = u.numel;
  bool seen_undecayed = false, seen_replicated = false, seen_partial = false;
  for (const TensorPlacement& t : u.tensors) {
    const size_t end = t.offset + t.local_numel();
    CHECK(!(t.decay && seen_undecayed), "%s: decayed tensors must come first in a unit",
          t.name.c_str());
    CHECK(!(t.tp_split && seen_replicated), "%s: split tensors must come before replicated ones",
          t.name.c_str());
    CHECK(!(seen_partial && !t.grad_partial_over_tp) && !(t.tp_split && t.grad_partial_over_tp),
          "%s: tensors with partial gradients must close the unit", t.name.c_str());
    if (t.decay) u.decay_numel = end;
    else seen_undecayed = true;
    if (t.tp_split) u.split_numel = end;
    else seen_replicated = true;
    if (t.grad_partial_over_tp && !seen_partial) u.partial_begin = t.offset;
    seen_partial = seen_partial || t.grad_partial_over_tp;
  }
}

int fsdp_pool_slots(const std::vector<ParamUnit>& units) {
  for (const ParamUnit& u : units)
    if (u.paired) return 3;
  return 2;
}

// ---------------------------------------------------------------------------------------------
// Geometry
// ---------------------------------------------------------------------------------------------
size_t padded_numel(size_t numel, int ranks) {
  return round_up(numel, (size_t)ranks * kTensorAlign);
}

FlatRange shard_range(size_t numel, int rank, int ranks) {
  const size_t slice = padded_numel(numel, ranks) / ranks;
  return {(size_t)rank * slice, (size_t)(rank + 1) * slice};
}

FlatRange clip(FlatRange r, size_t limit) {
  return {std::min(r.first, limit), std::min(r.end, limit)};
}

size_t owned_end(const ParamUnit& u, int tp_rank) {
  if (u.tied_copy) return 0;
  return tp_rank == 0 ? u.numel : u.split_numel;
}

// Local row `lr` of t: its global row.
static int64_t global_row(const TensorPlacement& t, int64_t lr, int64_t* rows_left_in_range) {
  for (const RowRange& r : t.row_ranges) {
    if (lr < r.count) {
      *rows_left_in_range = r.count - lr;
      return r.first + lr;
    }
    lr -= r.count;
  }
  FATAL("%s: local row out of range", t.name.c_str());
}

// Appends the blocks of `rows` whole-or-partial local rows starting at local (lr, lc), width w.
static void add_row_blocks(const TensorPlacement& t, int64_t lr, int64_t lc, int64_t rows,
                           int64_t w, std::vector<Block>& out) {
  while (rows > 0) {
    int64_t left = 0;
    const int64_t g = global_row(t, lr, &left);
    const int64_t per = t.rows / t.stacked;  // a stacked tensor's rows per expert
    const int64_t n = std::min({rows, left, per - g % per});
    out.push_back({g, n, t.col_first + lc, w, (size_t)(lr * t.local_cols + lc)});
    lr += n;
    rows -= n;
  }
}

std::vector<Block> global_blocks(const TensorPlacement& t, size_t local_first, size_t count) {
  std::vector<Block> out;
  const int64_t W = t.local_cols;
  int64_t at = (int64_t)local_first;
  const int64_t end = at + (int64_t)count;
  if (at < end && at % W != 0) {  // partial first row
    const int64_t n = std::min(W - at % W, end - at);
    add_row_blocks(t, at / W, at % W, 1, n, out);
    at += n;
  }
  if (end - at >= W) {  // whole rows
    const int64_t rows = (end - at) / W;
    add_row_blocks(t, at / W, 0, rows, W, out);
    at += rows * W;
  }
  if (at < end) add_row_blocks(t, at / W, 0, 1, end - at, out);  // partial last row
  return out;
}

std::vector<Block> blocks_in_range(const TensorPlacement& t, FlatRange r) {
  const size_t a = std::max(r.first, t.offset), b = std::min(r.end, t.offset + t.local_numel());
  if (a >= b) return {};
  std::vector<Block> blocks = global_blocks(t, a - t.offset, b - a);
  for (Block& bl : blocks) bl.local += t.offset;
  return blocks;
}
