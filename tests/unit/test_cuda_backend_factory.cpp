// The CUDA backend's entry points on any machine: cuda_available() answers without throwing, and asking for the
// backend where there is none is a clear error that says what to do (a machine with a GPU gets a working backend).
#include <doctest/doctest.h>

#include <string>

#include "kernels/backend.h"
#include "lib/core/error.h"

using namespace dflash;

TEST_CASE("cuda backend factory: cuda_available never throws, and no device or no CUDA build is a clear error") {
  bool available = true;
  CHECK_NOTHROW(available = kernels::cuda_available());
  if (available) {
    auto be = kernels::make_cuda_backend<float>();
    REQUIRE(be != nullptr);
    CHECK(std::string(be->name()) == "cuda");
    CHECK(be->memory() == MemoryKind::device);
    return;
  }
  try {
    (void)kernels::make_cuda_backend<float>();
    FAIL("make_cuda_backend<float>() returned a backend although cuda_available() is false");
  } catch (const Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("run.device: cuda") != std::string::npos);
    CHECK(what.find("run.device: cpu") != std::string::npos);  // the way out
  }
}
