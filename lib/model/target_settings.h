#pragma once
// The target's settings that are names (lib/core/named_enum.h): how a bf16 target sums its TP partials. The config
// key layout.tp_allreduce IS this enum, and model::TargetOptions carries it (lib/model/target.h).
#include <array>

namespace dflash::model {

// The row-parallel all-reduces of a bf16 forward on a transport that sums bf16 in device memory (NCCL): bf16 sums
// the bf16 partials directly (half the bytes; NCCL's ring rounds every hop), fp32 widens them, sums in fp32 and
// rounds once (docs/cuda.md). fp32 forwards and host transports (MPI) always sum in fp32.
enum class TpAllreduce { fp32, bf16 };
constexpr std::array<const char*, 2> names_of(TpAllreduce) { return {"fp32", "bf16"}; }

}  // namespace dflash::model
