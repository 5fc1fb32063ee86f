#pragma once
// The GPUs a run is planned for, with the figures --check predicts from: memory (the memory plan), and peak bf16
// tensor rate, memory bandwidth, the TP link and the architecture (the pipeline balance, lib/preflight/
// pipeline_balance.h). Data sheet figures, dense (no sparsity), bf16 with fp32 accumulation.
#include <string>
#include <string_view>
#include <vector>

namespace dflash::preflight {

struct GpuSpec {
  std::string key;       // what --gpu takes: "h200"
  std::string name;      // "H200"
  double memory = 0;     // bytes a run may use
  int sm = 0;            // compute capability × 10 (kernels/gpu_arch.h)
  int sms = 0;           // multiprocessors
  double bf16_flops = 0;  // dense tensor FLOP/s, fp32 accumulation
  double memory_bw = 0;   // bytes/s
  double link_bw = 0;     // bytes/s one way between the GPUs of a TP group (NVLink; PCIe without it)
  double link_latency = 0;  // seconds per all-reduce (NCCL's small-message latency on that link)
  double clock = 0;       // Hz the SMs sustain under load
  std::string link;       // "NVLink 4", "PCIe 5 x16"
};

// h100, h200, b200, rtx-pro-6000.
const std::vector<GpuSpec>& gpu_specs();
// By key; throws a user error listing the keys (and the nearest one) for an unknown name.
const GpuSpec& gpu_spec(std::string_view key);
// The spec of a device by its cudaDeviceProp name ("NVIDIA H200", "NVIDIA RTX PRO 6000 Blackwell Server Edition"),
// or null when it is none of the table's.
const GpuSpec* gpu_spec_for_device(std::string_view device_name);

}  // namespace dflash::preflight
