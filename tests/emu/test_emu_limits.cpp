// The emulated GPU refuses what the architecture it emulates (DFLASH_EMU_ARCH) would refuse, from each kernel's
// record as nvcc compiled it (kernels/cuda/records/kernel_records.h): registers × threads against the register
// file, __launch_bounds__, static + dynamic shared memory against the block's limit; cudaFuncGetAttributes and
// cudaDeviceGetAttribute answer as that architecture. ctest runs this binary under sm_90 and sm_120 (and sm_100);
// every case asserts the numbers of the architecture it runs under. Refusals run in a child (this binary as
// `--launch NAME`) so that the emulator's message on stderr can be checked as well as the thrown error.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "kernels/gpu_arch.h"
#include "tests/emu/limit_kernels.h"

namespace {

const dflash::kernels::GpuArch& arch() {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  const dflash::kernels::GpuArch* a = dflash::kernels::find_gpu_arch(major * 10 + minor);
  REQUIRE(a != nullptr);
  return *a;
}

float* device_floats(size_t n) {
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, n * sizeof(float)) == cudaSuccess);
  return d;
}
std::vector<float> host_floats(const float* d, size_t n) {
  std::vector<float> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

// The register hog's result on the host, in the kernel's order of operations.
float register_hog_reference(const std::vector<float>& x, int t, int rounds) {
  float r[96];
  for (int i = 0; i < 96; ++i) r[i] = x[size_t((t + i) % 256)];
  for (int k = 0; k < rounds; ++k)
    for (int i = 0; i < 96; ++i) r[i] = r[i] * 0.5f + r[(i + 1) % 96] * 0.25f;
  float s = 0.f;
  for (int i = 0; i < 96; ++i) s += r[i] * float(i + 1);
  return s;
}

struct Child {
  int status = 0;
  std::string output;
};
Child run_launch(const std::string& name) {
  char self[4096] = {};
  REQUIRE(readlink("/proc/self/exe", self, sizeof self - 1) > 0);
  const std::string cmd = "'" + std::string(self) + "' --launch " + name + " 2>&1";
  Child c;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) c.output.append(buf, n);
  const int st = pclose(p);
  c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return c;
}
bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// The children: one launch each, the error printed, exit 1 when refused.
int launch(const std::string& name) {
  float* out = nullptr;
  if (cudaMalloc(&out, 4096 * sizeof(float)) != cudaSuccess) return 2;
  std::string e;
  if (name == "register_hog_1024") e = emu_limits::register_hog(nullptr, out, out, 1, 1024, 1);
  else if (name == "bounded_160") e = emu_limits::bounded(nullptr, out, 160);
  else if (name == "static_plus_dynamic_56k") e = emu_limits::static_plus_dynamic(nullptr, out, 56 * 1024);
  else if (name == "dynamic_100k") e = emu_limits::dynamic_only(nullptr, out, 100 * 1024);
  else return 3;
  if (e.empty() && cudaDeviceSynchronize() != cudaSuccess) e = "the kernel failed";
  std::printf("launch %s: %s\n", name.c_str(), e.empty() ? "ran" : e.c_str());
  return e.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--launch") == 0) return launch(argv[2]);
  return doctest::Context(argc, argv).run();
}

TEST_CASE("emu limits: the device answers as its architecture") {
  const dflash::kernels::GpuArch& a = arch();
  int v = 0;
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess);
  CHECK(v == (a.sm == 120 ? 99 * 1024 : 227 * 1024));
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxRegistersPerBlock, 0) == cudaSuccess);
  CHECK(v == 65536);
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxThreadsPerMultiProcessor, 0) == cudaSuccess);
  CHECK(v == (a.sm == 120 ? 1536 : 2048));
  cudaDeviceProp p{};
  REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
  CHECK(p.major * 10 + p.minor == a.sm);
  CHECK(p.sharedMemPerBlockOptin == a.smem_per_block_optin);
  MESSAGE("emulated " << p.name << ", " << p.multiProcessorCount << " SMs");
}

TEST_CASE("emu limits: a kernel over the register file is refused with the real error; a block that fits runs") {
  const dflash::kernels::GpuArch& a = arch();
  const cudaFuncAttributes at = emu_limits::register_hog_attributes();
  // nvcc's count for this architecture (its record), not a guess: 96 live floats need more than 96 registers
  CHECK(at.numRegs > 96);
  CHECK(at.numRegs <= 255);
  const int per_warp = (at.numRegs * 32 + 255) / 256 * 256;
  CHECK(at.maxThreadsPerBlock == a.regs_per_block / per_warp * 32);
  CHECK(at.maxThreadsPerBlock < 1024);
  MESSAGE(std::string(a.name) << ": register_hog_kernel " << at.numRegs << " registers, at most " << at.maxThreadsPerBlock
                 << " threads a block");

  const Child c = run_launch("register_hog_1024");
  INFO(c.output);
  CHECK(c.status == 1);
  CHECK(has(c.output, "too many resources requested for launch"));  // the runtime's error string
  CHECK(has(c.output, "cudaErrorLaunchOutOfResources"));
  CHECK(has(c.output, "register_hog_kernel"));
  CHECK(has(c.output, "limit_kernels.cu:"));                          // the launch site
  CHECK(has(c.output, "1024 threads × " + std::to_string(at.numRegs) + " registers"));  // the shape
  CHECK(has(c.output, "65536 a block"));                              // the limit

  // the largest block that fits runs and computes what the host computes
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[size_t(i)] = float((i * 37) % 19) - 9.f;
  float* dx = device_floats(256);
  REQUIRE(cudaMemcpy(dx, x.data(), 256 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  const int threads = at.maxThreadsPerBlock;
  float* out = device_floats(size_t(threads));
  CHECK(emu_limits::register_hog(nullptr, out, dx, 1, threads, 3).empty());
  const std::vector<float> got = host_floats(out, size_t(threads));
  for (int t = 0; t < threads; t += 37) CHECK(got[size_t(t)] == doctest::Approx(register_hog_reference(x, t, 3)));
  CHECK(!emu_limits::register_hog(nullptr, out, dx, 1, threads + 32, 3).empty());
  CHECK(cudaFree(dx) == cudaSuccess);
  CHECK(cudaFree(out) == cudaSuccess);
}

TEST_CASE("emu limits: __launch_bounds__ caps the block") {
  const cudaFuncAttributes at = emu_limits::bounded_attributes();
  CHECK(at.maxThreadsPerBlock == 128);
  float* out = device_floats(256);
  CHECK(emu_limits::bounded(nullptr, out, 128).empty());
  CHECK(host_floats(out, 128)[127] == 127.f);
  const Child c = run_launch("bounded_160");
  INFO(c.output);
  CHECK(c.status == 1);
  CHECK(has(c.output, "too many resources requested for launch"));
  CHECK(has(c.output, "__launch_bounds__(128)"));
  CHECK(cudaFree(out) == cudaSuccess);
}

TEST_CASE("emu limits: static and dynamic shared memory together against the architecture's block limit") {
  const dflash::kernels::GpuArch& a = arch();
  const cudaFuncAttributes at = emu_limits::static_plus_dynamic_attributes();
  CHECK(at.sharedSizeBytes == 48 * 1024);  // ptxas's figure for the kernel's __shared__ array
  float* out = device_floats(64);
  // 48 KiB static + 56 KiB dynamic = 104 KiB: within sm_90's 227 KiB, above sm_120's 99 KiB
  const Child c = run_launch("static_plus_dynamic_56k");
  INFO(c.output);
  const Child d = run_launch("dynamic_100k");  // 100 KiB of dynamic shared memory alone
  INFO(d.output);
  if (a.sm == 120) {
    CHECK(c.status == 1);
    CHECK(has(c.output, "invalid argument"));
    CHECK(has(c.output, "static_plus_dynamic"));
    CHECK(d.status == 1);
    CHECK(has(d.output, "102400 bytes of dynamic shared memory asked; this device allows 101376"));
  } else {
    CHECK(c.status == 0);
    CHECK(d.status == 0);
    CHECK(emu_limits::static_plus_dynamic(nullptr, out, 56 * 1024).empty());
    const std::vector<float> got = host_floats(out, 64);
    CHECK(got[5] == 5.f + 1.f + 2.f);
  }
  // 48 KiB static + 51 KiB dynamic = 99 KiB fits everywhere
  CHECK(emu_limits::static_plus_dynamic(nullptr, out, 51 * 1024).empty());
  CHECK(host_floats(out, 64)[63] == 63.f + 1.f + 2.f);
  CHECK(cudaFree(out) == cudaSuccess);
}
