// The GPU table of --check (lib/preflight/gpu_specs.h). Sources: NVIDIA's data sheets (H100 SXM, H200 SXM, HGX
// B200, RTX PRO 6000 Blackwell): dense bf16 989.4 / 989.4 / 2250 / 503.8 TFLOP/s, memory 3.35 / 4.8 / 8 / 1.792
// TB/s, NVLink 4 / 4 / 5 at 450 / 450 / 900 GB/s a direction, the RTX PRO 6000 on PCIe 5 x16 (no NVLink: ring
// all-reduce at an effective ~40 GB/s). Clocks: what the SMs sustain under tensor load, not the boost.
#include "lib/preflight/gpu_specs.h"

#include <algorithm>
#include <cctype>

#include "lib/core/error.h"

namespace dflash::preflight {

const std::vector<GpuSpec>& gpu_specs() {
  static const std::vector<GpuSpec> specs = {
      {"h100", "H100 SXM", 80e9, 90, 132, 989.4e12, 3.35e12, 450e9, 10e-6, 1.755e9, "NVLink 4"},
      {"h200", "H200", 141e9, 90, 132, 989.4e12, 4.8e12, 450e9, 10e-6, 1.755e9, "NVLink 4"},
      {"b200", "B200", 180e9, 100, 148, 2250e12, 8.0e12, 900e9, 10e-6, 1.9e9, "NVLink 5"},
      {"rtx-pro-6000", "RTX PRO 6000 Blackwell", 95e9, 120, 188, 503.8e12, 1.792e12, 40e9, 25e-6, 2.4e9,
       "PCIe 5 x16"},
  };
  return specs;
}

const GpuSpec& gpu_spec(std::string_view key) {
  std::string keys;
  for (const GpuSpec& g : gpu_specs()) {
    if (g.key == key) return g;
    keys += (keys.empty() ? "" : ", ") + g.key;
  }
  DFLASH_USER_FAIL("--gpu {}: not a GPU --check knows; one of {}", key, keys);
  return gpu_specs().front();  // not reached
}

const GpuSpec* gpu_spec_for_device(std::string_view device_name) {
  std::string n(device_name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (n.find("emulated") != std::string::npos) return nullptr;  // the emulated GPU is no GPU to predict for
  if (n.find("rtx pro 6000") != std::string::npos) return &gpu_spec("rtx-pro-6000");
  for (const char* k : {"h100", "h200", "b200"})
    if (n.find(k) != std::string::npos) return &gpu_spec(k);
  return nullptr;
}

}  // namespace dflash::preflight
