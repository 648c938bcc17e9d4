// kernels/cpu/adamw.cpp - the AdamW update on the CPU backend: the host loop of
// kernels/host_adamw.cpp (PyTorch's order of operations, in fp32, over OpenMP threads), which the
// optimizer offload (parallel/offload.cu) runs too.
#include "kernels/cpu/cpu_common.h"
#include "kernels/host_adamw.h"

namespace ops {

void adamw_update(float* master, void* param_out, const float* grad, float* m, float* v, size_t n,
                  const AdamWStep& step, DType param_dt, Stream s) {
  OP_SPAN(adamw_update);
  if (is_dry(s)) return;
  host_adamw_update(master, param_out, grad, m, v, n, step, param_dt);
}

}  // namespace ops
