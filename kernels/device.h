#pragma once
// Where a backend runs (run.device) and the type it computes in (run.precision's compute type): the enums the
// config, the models and the programs pass around, and which pairs exist. kernels/backend_factory.cpp keeps the
// pairs (make_backend<T> refuses the others with the same words), so nothing else writes them again.
#include <array>
#include <string>

#include "kernels/bf16.h"

namespace dflash::kernels {

enum class Device { cpu, cuda };
constexpr std::array<const char*, 2> names_of(Device) { return {"cpu", "cuda"}; }

// A backend's compute type: T = float, bf16 (kernels/bf16.h) or double (the CPU's reference for tests).
enum class Precision { fp32, bf16, fp64 };
constexpr std::array<const char*, 3> names_of(Precision) { return {"fp32", "bf16", "fp64"}; }

template <typename T>
constexpr Precision precision_of() {
  if constexpr (std::is_same_v<T, bf16>) return Precision::bf16;
  else if constexpr (std::is_same_v<T, double>) return Precision::fp64;
  else return Precision::fp32;
}

// "" when `device` computes in `precision` (cpu: fp32, fp64; cuda: fp32, bf16); else the user error that names
// the fix.
std::string backend_refusal(Device device, Precision precision);
// What `device` computes in when nothing else is asked for (run.precision auto): fp32 on the CPU, bf16 on CUDA.
Precision default_precision(Device device);

}  // namespace dflash::kernels
