// The op-case table (tests/unit/backend_ops.h: one list of op cases with a double reference and derived per-dtype
// bounds) on the CUDA backend in float and bf16. The CPU backend runs the same table in
// tests/unit/test_backend_ops.cpp. Without a GPU (or without the CUDA backend) main.cpp reports these skipped.
#include <doctest/doctest.h>

#if DFLASH_WITH_CUDA
#include "kernels/backend.h"
#include "tests/unit/backend_ops.h"

using namespace dflash;

TEST_CASE("cuda twin ops: every op case of the table on the CUDA backend in float, within its derived bound") {
  auto be = kernels::make_backend<float>(kernels::Device::cuda);
  test::ops::run_table<float>(*be);
}

TEST_CASE("cuda twin ops: every op case of the table on the CUDA backend in bf16, within its derived bound") {
  auto be = kernels::make_backend<kernels::bf16>(kernels::Device::cuda);
  test::ops::run_table<kernels::bf16>(*be);
}
#endif
