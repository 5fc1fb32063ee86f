#pragma once
// Peak resident memory of this process, for benchmarks that report what a computation added.
#include <cstddef>

namespace dflash {

// Current resident set size in bytes (from /proc/self/statm).
size_t resident_bytes();
// Peak resident set size in bytes since process start or the last reset_peak_resident() (VmHWM).
size_t peak_resident_bytes();
// Resets the kernel's peak-RSS watermark (writes "5" to /proc/self/clear_refs); false if not permitted.
bool reset_peak_resident();

}  // namespace dflash
