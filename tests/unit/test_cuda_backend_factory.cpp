// The CUDA backend's entry points on any machine: cuda_available() answers without throwing, and asking for the
// backend where there is none is a clear error that says what to do (a machine with a GPU gets a working backend).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
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

TEST_CASE("backend factory: make_backend gives the CPU backend in float and double and refuses the pairs that do not exist") {
  auto f = kernels::make_backend<float>(kernels::Device::cpu);
  auto d = kernels::make_backend<double>(kernels::Device::cpu, kernels::CpuBackendOptions{16});
  CHECK(std::string(f->name()) == "cpu");
  CHECK(std::string(d->name()) == "cpu");
  CHECK(f->supports(kernels::Feature::tree_attention));
  for (int head_dim : {1, 5, 64, 300}) CHECK(f->supports(kernels::Feature::head_norm_rope, head_dim));  // any
  // the pairs that exist, written once (kernels/device.h): what make_backend refuses, the config refuses too
  CHECK(kernels::backend_refusal(kernels::Device::cpu, kernels::Precision::fp32).empty());
  CHECK(kernels::backend_refusal(kernels::Device::cpu, kernels::Precision::fp64).empty());
  CHECK(kernels::backend_refusal(kernels::Device::cuda, kernels::Precision::bf16).empty());
  CHECK_FALSE(kernels::backend_refusal(kernels::Device::cpu, kernels::Precision::bf16).empty());
  CHECK_FALSE(kernels::backend_refusal(kernels::Device::cuda, kernels::Precision::fp64).empty());
  CHECK(kernels::default_precision(kernels::Device::cpu) == kernels::Precision::fp32);
  CHECK(kernels::default_precision(kernels::Device::cuda) == kernels::Precision::bf16);
  CHECK_THROWS_WITH_AS((void)kernels::make_backend<kernels::bf16>(kernels::Device::cpu),
                       doctest::Contains("bf16 needs the CUDA backend"), Error);
  CHECK_THROWS_WITH_AS((void)kernels::make_backend<double>(kernels::Device::cuda),
                       doctest::Contains("fp64 runs on the CPU backend only"), Error);
  if (!kernels::cuda_available()) {
    CHECK_THROWS_WITH_AS((void)kernels::make_backend<kernels::bf16>(kernels::Device::cuda),
                         doctest::Contains("run.device: cpu"), Error);
  } else {
    auto b = kernels::make_backend<kernels::bf16>(kernels::Device::cuda);
    CHECK(std::string(b->name()) == "cuda");
    CHECK_FALSE(b->supports(kernels::Feature::tree_attention));
    CHECK(b->supports(kernels::Feature::head_norm_rope, 64));
    CHECK(b->supports(kernels::Feature::head_norm_rope, 256));
    CHECK_FALSE(b->supports(kernels::Feature::head_norm_rope, 5));    // odd: the fused kernel rotates pairs
    CHECK_FALSE(b->supports(kernels::Feature::head_norm_rope, 258));  // past 4 pairs a lane
  }
}

TEST_CASE("backend factory: kernels::bf16 rounds to nearest even and widens exactly, as CUDA's host conversion") {
  auto bits = [](float x) { return kernels::bf16(x).bits; };
  CHECK(bits(1.0f) == 0x3f80);
  CHECK(bits(-2.0f) == 0xc000);
  CHECK(bits(1.0f + 0x1.0p-8f) == 0x3f80);               // halfway, even below: down
  CHECK(bits(1.0f + 3 * 0x1.0p-8f) == 0x3f82);           // halfway, odd below: up
  CHECK(bits(1.0f + 0x1.0p-8f + 0x1.0p-20f) == 0x3f81);  // above halfway: up
  CHECK(bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bits(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past the largest bf16 to infinity
  CHECK(bits(std::nanf("")) == 0x7fff);                       // the canonical NaN
  CHECK(bits(-0.0f) == 0x8000);
  for (float x : {0.0f, 1.0f, -3.5f, 0x1.fep127f, 0x1.0p-133f}) CHECK(float(kernels::bf16(x)) == x);  // exact
}
