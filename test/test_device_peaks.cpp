// test/test_device_peaks.cpp - the peak table (config/device_peaks.h) picks the right row for the
// names real drivers report (form factors told apart: an H100 PCIe must not get the SXM peak),
// and the planner's device names. The expected peaks are NVIDIA's datasheet "with sparsity"
// figures halved, written out here independently of the table.
#include <cmath>
#include <cstdio>
#include <string>

#include "config/device_peaks.h"

static int failures = 0;

static void expect(const char* driver_name, const char* row, double bf16, double fp8) {
  const DevicePeak* d = device_peak_by_driver_name(driver_name);
  bool ok = d && std::string(d->name) == row && std::fabs(device_peak_tflops(*d, "bf16") - bf16) < 1 &&
            std::fabs(device_peak_tflops(*d, "fp32") - bf16) < 1 &&
            std::fabs(device_peak_tflops(*d, "fp8") - fp8) < 1;
  std::printf("%s %-28s -> %s (bf16 %.1f, fp8 %.1f)\n", ok ? "ok  " : "FAIL", driver_name,
              d ? d->name : "none", d ? d->bf16_tflops : 0, d ? d->fp8_tflops : 0);
  failures += !ok;
}

int main() {
  expect("NVIDIA H100 80GB HBM3", "H100 SXM", 1979 / 2.0, 3958 / 2.0);
  expect("NVIDIA H100 PCIe", "H100 PCIe", 1513 / 2.0, 3026 / 2.0);
  expect("NVIDIA H100 NVL", "H100 NVL", 1671 / 2.0, 3341 / 2.0);
  expect("NVIDIA H200", "H200 SXM", 1979 / 2.0, 3958 / 2.0);
  expect("NVIDIA H200 NVL", "H200 NVL", 1671 / 2.0, 3341 / 2.0);
  expect("NVIDIA A100-SXM4-80GB", "A100", 624 / 2.0, 624 / 2.0);
  expect("NVIDIA A100 80GB PCIe", "A100", 624 / 2.0, 624 / 2.0);
  expect("NVIDIA B200", "B200", 4500 / 2.0, 9000 / 2.0);
  for (const char* unknown : {"cpu (2 threads)", "NVIDIA GeForce RTX 4090", "emulated GPU"}) {
    bool ok = device_peak_by_driver_name(unknown) == nullptr;
    std::printf("%s %-28s -> none\n", ok ? "ok  " : "FAIL", unknown);
    failures += !ok;
  }
  for (const char* name : {"H100 SXM", "H100 PCIe", "H200 SXM", "A100", "B200"}) {
    const DevicePeak* d = device_peak_by_name(name);
    bool ok = d && std::string(d->name) == name;
    std::printf("%s [plan] device \"%s\"\n", ok ? "ok  " : "FAIL", name);
    failures += !ok;
  }
  bool refused = device_peak_by_name("H100") == nullptr && device_peak_by_name("h100 sxm") == nullptr;
  std::printf("%s [plan] device names are exact (\"H100\", \"h100 sxm\" unknown)\n", refused ? "ok  " : "FAIL");
  failures += !refused;
  std::printf(failures ? "%d check(s) FAILED\n" : "all device peak checks passed\n", failures);
  return failures ? 1 : 0;
}
