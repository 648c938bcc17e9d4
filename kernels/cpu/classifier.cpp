// kernels/cpu/classifier.cpp - softmax cross-entropy over the first V of Vp logit columns, loss
// and (optionally) its gradient written over the logits, one pass per row.
//
// Rows in parallel. Per row (vectorised loops of vector_math.h): m = max of the first V logits,
// e = exp(x - m) kept in a row buffer, l = sum e in double, loss = m + log l - x[target],
// softmax = e / l. With dloss != 0 the row becomes (softmax - onehot) * dloss for the first V
// columns and 0 for the padded ones, so nothing in columns >= V (which hold whatever the padded
// rows of wte produced) reaches the loss or the gradient. A target < 0 is ignored: loss 0 and,
// with dloss != 0, an all-zero gradient row.
#include <vector>

#include "kernels/cpu/vector_math.h"

namespace ops {
namespace cpu {
namespace {

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
      const float inv_sum = (float)(1.0 / sum);
      for (int v = 0; v < V; v++) store(row, v, e[v] * inv_sum * dloss);
      store(row, target, (e[target] * inv_sum - 1.0f) * dloss);
      for (int v = V; v < Vp; v++) store(row, v, 0.0f);
    }
  }
}

}  // namespace
}  // namespace cpu

void classifier_forward_backward(void* logits, float* losses, const int* targets, float dloss,
                                 int N, int V, int Vp, DType dt, Stream s) {
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
