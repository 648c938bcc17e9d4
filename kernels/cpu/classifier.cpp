// kernels/cpu/classifier.cpp - softmax cross-entropy over the first V of Vp logit columns, loss
// and (optionally) its gradient written over the logits, one pass per row.
//
// Rows in parallel. Per row (vectorised loops of vector_math.h): m = max of the first V logits,
// e = exp(x - m) kept in a row buffer, l = sum e in double, loss = m + log l - x[target],
// softmax = e / l. With dloss != 0 the row becomes (softmax - onehot) * dloss for the first V
// columns and 0 for the padded ones, so nothing in columns >= V (which hold whatever the padded
// rows of wte produced) reaches the loss or the gradient. A target < 0 is ignored: loss 0 and,
// with dloss != 0, an all-zero gradient row.
//
// The vocabulary-parallel form (tensor parallelism) splits the same computation in three:
// per-shard row statistics (max, sum of exp relative to it, target logit), their merge over the
// shards (global max M; sum = sum_r sum_r' * exp(max_r - M), in double), and the gradient from
// the merged statistics. Rows in parallel in each.
#include <limits>
#include <vector>

#include "kernels/cpu/vector_math.h"

namespace ops {
namespace cpu {
namespace {

// A row of `width` logits becomes the softmax gradient, from e = exp(x - shift) of its first
// `valid` columns: e * inv_sum * dloss, minus dloss at column `target` (if it is among them), and
// 0 on the padding after them.
template <typename T>
void store_softmax_gradient(T* row, const float* e, float inv_sum, int target, int valid,
                            int width, float dloss) {
  for (int v = 0; v < valid; v++) store(row, v, e[v] * inv_sum * dloss);
  if (target >= 0 && target < valid) store(row, target, (e[target] * inv_sum - 1.0f) * dloss);
  for (int v = valid; v < width; v++) store(row, v, 0.0f);
}

template <typename T>
void classifier_typed(T* logits, float* losses, const int* targets, float dloss, int N, int V,
                      int Vp) {
#pragma omp parallel if ((size_t)N * V > CPU_PARALLEL_MIN)
  {
    std::vector<float> x(V), e(V);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      T* row = logits + (size_t)n * Vp;
      const int target = targets[n];
      if (target < 0) {
        losses[n] = 0.0f;
        if (dloss != 0.0f)
          for (int v = 0; v < Vp; v++) store(row, v, 0.0f);
        continue;
      }
      load_row(x.data(), row, V);
      const float max = max_span(x.data(), V);
      exp_shifted(e.data(), x.data(), max, V);
      const double sum = sum_span(e.data(), V);
      losses[n] = max + (float)std::log(sum) - x[target];
      if (dloss == 0.0f) continue;
      store_softmax_gradient(row, e.data(), (float)(1.0 / sum), target, V, Vp, dloss);
    }
  }
}

// Stats of one row of a shard: columns [col0, col0 + Vs), valid below V.
template <typename T>
void shard_row_stats(float* st, const T* row, int target, int Vs, int col0, int V,
                     std::vector<float>& x) {
  const int valid = std::max(0, std::min(Vs, V - col0));
  st[0] = -std::numeric_limits<float>::infinity();
  st[1] = 0.0f;
  st[2] = 0.0f;
  if (valid == 0) return;
  load_row(x.data(), row, valid);
  st[0] = max_span(x.data(), valid);
  exp_shifted(x.data(), x.data(), st[0], valid);
  st[1] = (float)sum_span(x.data(), valid);
  if (target >= col0 && target < col0 + valid) st[2] = load(row, target - col0);
}

template <typename T>
void shard_stats_typed(float* stats, const T* logits, const int* targets, int N, int Vs, int col0,
                       int V) {
#pragma omp parallel if ((size_t)N * Vs > CPU_PARALLEL_MIN)
  {
    std::vector<float> x(Vs);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++)
      shard_row_stats(stats + 3 * (size_t)n, logits + (size_t)n * Vs, targets[n], Vs, col0, V, x);
  }
}

template <typename T>
void shard_backward_typed(T* logits, const float* stats, const int* targets, float dloss, int N,
                          int Vs, int col0, int V) {
  const int valid = std::max(0, std::min(Vs, V - col0));
#pragma omp parallel if ((size_t)N * Vs > CPU_PARALLEL_MIN)
  {
    std::vector<float> x(Vs);
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      T* row = logits + (size_t)n * Vs;
      const float* st = stats + 3 * (size_t)n;
      const int target = targets[n];
      if (target < 0) {
        for (int v = 0; v < Vs; v++) store(row, v, 0.0f);
        continue;
      }
      load_row(x.data(), row, valid);
      exp_shifted(x.data(), x.data(), st[0], valid);
      store_softmax_gradient(row, x.data(), (float)(1.0 / (double)st[1]), target - col0, valid,
                             Vs, dloss);
    }
  }
}

}  // namespace
}  // namespace cpu

void classifier_shard_stats(float* stats, const void* logits, const int* targets, int N, int Vs,
                            int col0, int V, DType dt, Stream s) {
  OP_SPAN(classifier_shard_stats);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::shard_stats_typed(stats, (const S*)logits, targets, N, Vs, col0, V);
  });
}

void classifier_merge_stats(float* stats, float* losses, const float* parts_stats,
                            const int* targets, int parts, int N, Stream s) {
  OP_SPAN(classifier_merge_stats);
  if (is_dry(s)) return;
#pragma omp parallel for schedule(static) if ((size_t)N * parts > CPU_PARALLEL_MIN)
  for (int n = 0; n < N; n++) {
    float max = -std::numeric_limits<float>::infinity(), target_logit = 0.0f;
    for (int r = 0; r < parts; r++) max = std::max(max, parts_stats[(size_t)(r * N + n) * 3]);
    double sum = 0.0;
    for (int r = 0; r < parts; r++) {
      const float* p = parts_stats + (size_t)(r * N + n) * 3;
      if (p[1] > 0.0f) sum += (double)p[1] * std::exp((double)p[0] - (double)max);
      target_logit += p[2];
    }
    float* st = stats + 3 * (size_t)n;
    st[0] = max;
    st[1] = (float)sum;
    st[2] = target_logit;
    losses[n] = targets[n] < 0 ? 0.0f : max + (float)std::log(sum) - target_logit;
  }
}

void classifier_shard_backward(void* logits, const float* stats, const int* targets, float dloss,
                               int N, int Vs, int col0, int V, DType dt, Stream s) {
  OP_SPAN(classifier_shard_backward);
  if (is_dry(s)) return;
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::shard_backward_typed((S*)logits, stats, targets, dloss, N, Vs, col0, V);
  });
}

void classifier_forward_backward(void* logits, float* losses, const int* targets, float dloss,
                                 int N, int V, int Vp, DType dt, Stream s) {
  OP_SPAN(classifier_forward_backward);
  if (is_dry(s)) return;
  CHECK(V > 0 && V <= Vp, "classifier: vocab %d, padded vocab %d", V, Vp);
  for (int n = 0; n < N; n++)
    CHECK(targets[n] < V, "classifier: target %d at row %d is not below the vocab size %d",
          targets[n], n, V);
  cpu::dispatch_dtype(dt, [&](auto tag) {
    using S = decltype(tag);
    cpu::classifier_typed((S*)logits, losses, targets, dloss, N, V, Vp);
  });
}

}  // namespace ops
