// kernels/cpu/adamw.cpp - the AdamW update on the CPU backend: the host loop of
// kernels/host_adamw.cpp (PyTorch's order of operations, in fp32, over OpenMP threads), which the
// optimizer offload (parallel/offload.cu) runs too. The clipping factor, when it comes in device
// memory (AdamWStep::device_grad_scale), is host memory on this backend: read in place.
#include "kernels/cpu/cpu_common.h"
#include "kernels/host_adamw.h"

namespace ops {

void adamw_update(float* master, void* param_out, const float* grad, float* m, float* v, size_t n,
                  const AdamWStep& step, DType param_dt, Stream s) {
  OP_SPAN(adamw_update);
  if (is_dry(s)) return;
  AdamWStep on_host = step;  // "device" memory is host memory here: the factor is read directly
  if (step.device_grad_scale) on_host.grad_scale = *step.device_grad_scale;
  on_host.device_grad_scale = nullptr;
  host_adamw_update(master, param_out, grad, m, v, n, on_host, param_dt);
}

}  // namespace ops
