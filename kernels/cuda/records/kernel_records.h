#pragma once
// What nvcc compiled for each kernel, per architecture: registers, static shared memory, stack and
// __launch_bounds__, as ptxas reports them (`nvcc --resource-usage`, `.maxntid` in the PTX). The table is
// generated at build time by cmake/kernel_records.cmake from the same sources (kernels/cuda/*.cu and the emulated
// GPU's test kernels); the emulated GPU refuses a launch that the real GPU would refuse from it, and --check
// reads it for a named GPU without one. No CUDA header: it only holds numbers and names.
#include <string>
#include <string_view>

#include "kernels/gpu_arch.h"

namespace dflash::kernels::cuda {

struct KernelRecord {
  const char* mangled;  // the entry function as ptxas names it (Itanium mangling, nvcc's anonymous namespaces)
  int sm;               // 90, 100, 120
  KernelResources res;
};

// Whether this build recorded the kernels (nvcc was found when it was configured); the reason when not.
bool kernel_records_available();
const char* kernel_records_missing_reason();

// The record of a kernel on architecture `sm`, by its canonical name (canonical_kernel_name), or null.
const KernelRecord* find_kernel_record(std::string_view canonical, int sm);

// A kernel's name with everything that differs between nvcc's demangled entry names and the host compiler's
// spelling of the same function removed: "void " and the parameter list, anonymous namespaces as "{anon}",
// qualifiers inside the template arguments, integer suffixes (128u → 128), spaces. E.g.
// "dflash::kernels::cuda::{anon}::flash_forward_tc_kernel<128,64,CausalTiles,CausalParams>".
std::string canonical_kernel_name(std::string_view name);

}  // namespace dflash::kernels::cuda

// The host compiler's name of kernel K (for the emulated GPU's launches), canonical. In a namespace of its own:
// the host compiler spells a name relative to the namespace of the function that prints it.
namespace dflash_kernel_name {
template <auto K>
std::string of() {
  std::string_view p = __PRETTY_FUNCTION__;  // "... [with auto K = ns::kernel<args>; ...]"
  p = p.substr(p.find("K = ") + 4);
  int depth = 0;
  size_t end = 0;
  for (; end < p.size(); ++end) {
    const char c = p[end];
    if (c == '<' || c == '(') ++depth;
    else if (c == '>' || c == ')') --depth;
    else if ((c == ';' || c == ']') && depth == 0) break;
  }
  return dflash::kernels::cuda::canonical_kernel_name(p.substr(0, end));
}
}  // namespace dflash_kernel_name
