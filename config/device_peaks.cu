// config/device_peaks.cu - the peak table of config/device_peaks.h. Every number is NVIDIA's
// datasheet figure for dense math (the datasheets list "with sparsity" figures, twice these; we
// halve them), and the datasheet's memory bandwidth (A100: the 80GB SXM's 2039 GB/s; its PCIe
// card has 1935). The driver's device names: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe",
// "NVIDIA H100 NVL", "NVIDIA H200" (SXM), "NVIDIA H200 NVL", "NVIDIA A100-SXM4-80GB",
// "NVIDIA A100 80GB PCIe", "NVIDIA B200": matched on the model and the form factor words.
#include "config/device_peaks.h"

#include "kernels/common.h"

namespace {

struct Row {
  DevicePeak peak;
  const char* model;      // must appear in the driver's name
  const char* form;       // must also appear, or nullptr (the SXM rows, after the others)
};

const Row kRows[] = {
    {{"H100 PCIe", 756.5, 1513.0, 2000, "H100 PCIe datasheet: BF16 1513 and FP8 3026 TFLOPS with sparsity"},
     "H100", "PCIe"},
    {{"H100 NVL", 835.5, 1671.0, 3900, "H100 NVL datasheet: BF16 1671 and FP8 3341 TFLOPS with sparsity"},
     "H100", "NVL"},
    {{"H100 SXM", 989.4, 1978.9, 3350, "H100 SXM5 datasheet: BF16 1979 and FP8 3958 TFLOPS with sparsity"},
     "H100", nullptr},
    {{"H200 NVL", 835.5, 1671.0, 4800, "H200 NVL datasheet: BF16 1671 and FP8 3341 TFLOPS with sparsity"},
     "H200", "NVL"},
    {{"H200 SXM", 989.4, 1978.9, 4800, "H200 SXM datasheet: BF16 1979 and FP8 3958 TFLOPS with sparsity "
      "(the H100's tensor cores)"}, "H200", nullptr},
    {{"A100", 312.0, 312.0, 2039, "A100 datasheet: BF16 312 TFLOPS dense (SXM and PCIe alike); no FP8 "
      "tensor cores, so FP8 runs are measured against BF16"}, "A100", nullptr},
    {{"B200", 2250.0, 4500.0, 8000, "HGX B200 datasheet: BF16 4.5 and FP8 9 PFLOPS per GPU with "
      "sparsity"}, "B200", nullptr},
};

bool has(const std::string& s, const char* word) { return word && s.find(word) != std::string::npos; }

}  // namespace

const DevicePeak* device_peak_by_driver_name(const std::string& device_name) {
  for (const Row& r : kRows) {
    if (!has(device_name, r.model)) continue;
    if (r.form && !has(device_name, r.form)) continue;
    return &r.peak;
  }
  return nullptr;
}

const DevicePeak* device_peak_by_name(const std::string& name) {
  for (const Row& r : kRows)
    if (name == r.peak.name) return &r.peak;
  return nullptr;
}

std::string device_peak_names() {
  std::string names;
  for (const Row& r : kRows) names += (names.empty() ? "" : ", ") + std::string(r.peak.name);
  return names;
}

double device_peak_tflops(const DevicePeak& d, const std::string& compute) {
  return compute == "fp8" ? d.fp8_tflops : d.bf16_tflops;
}

double plan_peak_tflops(const Config& c) {
  if (c.plan.peak_tflops > 0) return c.plan.peak_tflops;
  const DevicePeak* d = device_peak_by_name(c.plan.device);
  if (!d) BUG("[plan] device '%s' passed the config checks", c.plan.device.c_str());
  return device_peak_tflops(*d, c.precision.compute);
}
