// The op-case table (backend_ops.h) on the CPU backend, in float and in double (the double run checks the table's
// references and bounds as much as the kernels: its bounds are ~2^-29 of the float ones). The CUDA backends run the
// same table in tests/cuda/test_cuda_backend_ops.cpp.
#include <doctest/doctest.h>

#include "backend_ops.h"

using namespace dflash;

TEST_CASE("backend ops: every op case of the table on the CPU backend in float, within its derived bound") {
  auto be = kernels::make_backend<float>(kernels::Device::cpu);
  test::ops::run_table<float>(*be);
}

TEST_CASE("backend ops: every op case of the table on the CPU backend in double, within its derived bound") {
  auto be = kernels::make_backend<double>(kernels::Device::cpu);
  test::ops::run_table<double>(*be);
}
