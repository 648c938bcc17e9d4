// config/device_peaks.h - the dense tensor-core peaks MFU is measured against: a table of the
// GPUs we know (H100 and H200 SXM / PCIe / NVL, A100, B200), with BF16 and FP8 TFLOP/s and where
// each number comes from. The trainer looks its device up by the name the driver reports
// (kernels/cuda: "NVIDIA H100 80GB HBM3"); the planner by [plan] device ("H100 SXM").
#pragma once
#include <string>

#include "config/config.h"

struct DevicePeak {
  const char* name;      // [plan] device's spelling, e.g. "H100 SXM"
  double bf16_tflops;    // dense (no 2:4 sparsity) BF16 tensor-core peak
  double fp8_tflops;     // dense FP8; the BF16 peak on GPUs without FP8 (A100)
  double hbm_gbs;        // memory bandwidth, GB/s (the datasheet's; tools/emu_roofline.py)
  const char* source;    // where the numbers come from, in words
};

// The row of the device the driver calls `device_name`, or nullptr (the CPU, unlisted GPUs).
const DevicePeak* device_peak_by_driver_name(const std::string& device_name);
// The row [plan] device names exactly, or nullptr.
const DevicePeak* device_peak_by_name(const std::string& name);
// "H100 SXM, H100 PCIe, ...": every name device_peak_by_name knows, for error messages.
std::string device_peak_names();
// The peak of `d` at the run's precision: FP8 when compute is "fp8", else BF16 (fp32 runs too,
// since the BF16 peak is the one people compare against).
double device_peak_tflops(const DevicePeak& d, const std::string& compute);
// The peak per GPU the planner's device model uses: [plan] peak_tflops when > 0, else
// [plan] device's dense peak at [precision] compute.
double plan_peak_tflops(const Config& cfg);
