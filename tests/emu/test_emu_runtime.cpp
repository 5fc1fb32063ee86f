// The emulated GPU's own tests: correct kernels give exact results; each planted defect is caught with a clear
// message. Defects that kill the process (a fault) or poison it (a sticky error) run in a child: this binary
// re-run as `--defect NAME`, with the environment the case needs (a thread order), its output checked here.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lib/core/buffer.h"
#include "tests/emu/emu_kernels.h"

namespace {

template <typename T>
T* device_copy(const std::vector<T>& h) {
  T* d = nullptr;
  if (cudaMalloc(&d, h.size() * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}
template <typename T>
std::vector<T> host_copy(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}
std::vector<float> iota_floats(size_t n, int mod) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = float(i % size_t(mod));
  return x;
}

struct Child {
  int status = 0;  // the exit code, or 128 + signal
  std::string output;
};
// This binary as `--defect name`, with `env` ("VAR=value ...") prepended; stdout and stderr together.
Child run_defect(const std::string& name, const std::string& env = "") {
  char self[4096] = {};
  REQUIRE(readlink("/proc/self/exe", self, sizeof self - 1) > 0);
  const std::string cmd = "env " + env + " '" + self + "' --defect " + name + " 2>&1";
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
bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// ---- the defects, each run in its own process ----
int defect(const std::string& name) {
  if (name == "shared_one_past") {
    std::vector<float> x = iota_floats(32, 32);
    float* dx = device_copy(x);
    float* dy = nullptr;
    cudaMalloc(&dy, 32 * sizeof(float));
    emu_test::shared_shift(nullptr, dy, dx, 1);
    host_copy(dy, 32);
    std::puts("not caught");
    return 0;
  }
  if (name == "shuffle_mask") {
    std::vector<float> x = iota_floats(64, 5);
    float* dx = device_copy(x);
    float* dy = nullptr;
    cudaMalloc(&dy, 2 * sizeof(float));
    emu_test::warp_sum(nullptr, dy, dx, 2, true);
    const cudaError_t e = cudaDeviceSynchronize();
    std::printf("sync: %s\n", cudaGetErrorName(e));
    return e == cudaSuccess ? 0 : 3;
  }
  if (name == "divergent_barrier") {
    float* dy = nullptr;
    cudaMalloc(&dy, 32 * sizeof(float));
    emu_test::divergent_barrier(nullptr, dy);
    const cudaError_t e = cudaDeviceSynchronize();
    std::printf("sync: %s\n", cudaGetErrorName(e));
    return e == cudaSuccess ? 0 : 3;
  }
  if (name == "host_deref") {
    float* d = nullptr;
    cudaMalloc(&d, 1024 * sizeof(float));
    cudaMemset(d, 0, 1024 * sizeof(float));
    cudaDeviceSynchronize();
    std::printf("read %f\n", double(*static_cast<volatile float*>(d + 10)));  // host code reading device memory
    return 0;
  }
  if (name == "past_allocation") {
    float* d = nullptr;
    cudaMalloc(&d, 100 * sizeof(float));
    emu_test::past_allocation(nullptr, d, 100);
    cudaDeviceSynchronize();
    std::puts("not caught");
    return 0;
  }
  if (name == "legacy_copy_nonblocking" || name == "legacy_copy_blocking") {
    // cudaMemcpy from pageable memory returns once the source is staged; a kernel on a non-blocking stream is not
    // ordered after it (a blocking stream is, through the legacy stream's implicit barrier).
    const bool non_blocking = name == "legacy_copy_nonblocking";
    std::vector<float> x = iota_floats(256, 9);
    float *dx = nullptr, *dy = nullptr;
    cudaMalloc(&dx, 256 * sizeof(float));
    cudaMalloc(&dy, 256 * sizeof(float));
    cudaStream_t s = nullptr;
    cudaStreamCreateWithFlags(&s, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault);
    cudaMemcpy(dx, x.data(), 256 * sizeof(float), cudaMemcpyHostToDevice);
    emu_test::add_one(s, dy, dx, 256);
    cudaStreamSynchronize(s);
    std::vector<float> y(256);
    cudaMemcpyAsync(y.data(), dy, 256 * sizeof(float), cudaMemcpyDeviceToHost, s);  // pageable: synchronous
    int wrong = 0;
    for (int i = 0; i < 256; ++i) wrong += y[i] != x[i] + 1.0f;
    std::printf("wrong %d of 256\n", wrong);
    return 0;
  }
  if (name == "racy_neighbour") {
    float* dy = nullptr;
    cudaMalloc(&dy, 32 * sizeof(float));
    emu_test::racy_neighbour(nullptr, dy, 32);
    const auto y = host_copy(dy, 32);
    std::printf("values");
    for (float v : y) std::printf(" %g", double(v));
    std::printf("\n");
    return 0;
  }
  std::printf("unknown defect %s\n", name.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--defect") == 0) return defect(argv[2]);
  return doctest::Context(argc, argv).run();
}

TEST_CASE("emu runtime: a grid-stride kernel, a block tree sum and a warp shuffle sum give the exact results") {
  const std::vector<float> x = iota_floats(1000, 17);
  float* dx = device_copy(x);
  float* dy = nullptr;
  REQUIRE(cudaMalloc(&dy, x.size() * sizeof(float)) == cudaSuccess);
  emu_test::add_one(nullptr, dy, dx, 1000);
  const auto y = host_copy(dy, 1000);
  for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == x[i] + 1.0f);

  const std::vector<float> blocks = iota_floats(3 * 256, 7);
  float* db = device_copy(blocks);
  float* dsum = nullptr;
  REQUIRE(cudaMalloc(&dsum, 3 * sizeof(float)) == cudaSuccess);
  emu_test::block_sum(nullptr, dsum, db, 3, false);
  const auto s = host_copy(dsum, 3);
  for (int b = 0; b < 3; ++b) {
    float want = 0;
    for (int i = 0; i < 256; ++i) want += blocks[size_t(b) * 256 + size_t(i)];
    CHECK(s[size_t(b)] == want);
  }
  emu_test::warp_sum(nullptr, dsum, db, 3, false);
  const auto w = host_copy(dsum, 3);
  for (int b = 0; b < 3; ++b) {
    float want = 0;
    for (int i = 0; i < 32; ++i) want += blocks[size_t(b) * 32 + size_t(i)];
    CHECK(w[size_t(b)] == want);
  }
  CHECK(cudaFree(dx) == cudaSuccess);
  CHECK(cudaFree(dy) == cudaSuccess);
  CHECK(cudaFree(db) == cudaSuccess);
  CHECK(cudaFree(dsum) == cudaSuccess);
}

TEST_CASE("emu defect: a missing __syncthreads reads shared memory before it is written (NaN)") {
  const std::vector<float> blocks = iota_floats(256, 7);
  float* db = device_copy(blocks);
  float* dsum = nullptr;
  REQUIRE(cudaMalloc(&dsum, sizeof(float)) == cudaSuccess);
  emu_test::block_sum(nullptr, dsum, db, 1, true);  // forward order: thread 0 reads s[128] before thread 128 ran
  CHECK(std::isnan(host_copy(dsum, 1)[0]));
  emu_test::block_sum(nullptr, dsum, db, 1, false);
  CHECK(host_copy(dsum, 1)[0] == 762.0f);  // Σ i % 7 over 0..255
}

TEST_CASE("emu defect: the host reads pinned memory before the stream that writes it was synchronised") {
  // DFLASH_EMU_LAG_MS is large for this test (CMakeLists.txt): queued work runs only when the host waits.
  const std::vector<float> x = iota_floats(64, 11);
  float* dx = device_copy(x);
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 64 * sizeof(float)) == cudaSuccess);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(pinned, dx, 64 * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
  CHECK(std::isnan(pinned[5]));  // not yet copied: the allocation's NaN fill
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaStreamQuery(s) == cudaSuccess);
  CHECK(pinned[5] == 5.0f);
  CHECK(pinned[63] == float(63 % 11));
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

TEST_CASE("emu defect: a kernel on a non-blocking stream is not ordered after a legacy-stream cudaMemcpy") {
  const Child nb = run_defect("legacy_copy_nonblocking", "DFLASH_EMU_ORDER=reverse DFLASH_EMU_LAG_MS=60000");
  INFO(nb.output);
  CHECK(nb.status == 0);
  CHECK(has(nb.output, "wrong 256 of 256"));  // the kernel ran before the copy: it read the NaN fill
  const Child b = run_defect("legacy_copy_blocking", "DFLASH_EMU_ORDER=reverse DFLASH_EMU_LAG_MS=60000");
  INFO(b.output);
  CHECK(has(b.output, "wrong 0 of 256"));  // a blocking stream waits for the legacy stream
}

TEST_CASE("emu defect: a shared-memory index one past the launch's dynamic shared memory faults with its kernel and thread") {
  const Child c = run_defect("shared_one_past");
  INFO(c.output);
  CHECK(c.status != 0);
  CHECK(has(c.output, "shared memory access 0 bytes past the end of the launch's 128 bytes of dynamic shared memory"));
  CHECK(has(c.output, "shared_shift_kernel"));
  CHECK(has(c.output, "thread (31,0,0)"));
  CHECK(!has(c.output, "not caught"));
}

TEST_CASE("emu defect: a shuffle whose mask names lanes that have exited") {
  const Child c = run_defect("shuffle_mask");
  INFO(c.output);
  CHECK(c.status == 3);
  CHECK(has(c.output, "__shfl_xor_sync"));
  CHECK(has(c.output, "names lane 16 in its mask, which does not arrive: thread (16,0,0) has exited"));
  CHECK(has(c.output, "warp_sum_kernel"));
  CHECK(has(c.output, "sync: cudaErrorLaunchFailure"));
}

TEST_CASE("emu defect: a __syncthreads that half the block never reaches") {
  const Child c = run_defect("divergent_barrier");
  INFO(c.output);
  CHECK(c.status == 3);
  CHECK(has(c.output, "a barrier not reached by every thread of the block (divergence)"));
  CHECK(has(c.output, "thread (16,0,0) has exited"));
  CHECK(has(c.output, "sync: cudaErrorLaunchFailure"));
}

TEST_CASE("emu defect: host code dereferencing a device pointer faults, naming the allocation") {
  const Child c = run_defect("host_deref");
  INFO(c.output);
  CHECK(c.status != 0);
  CHECK(has(c.output, "host code dereferenced device memory"));
  CHECK(has(c.output, "offset 40 of a 4096-byte cudaMalloc allocation"));
  CHECK(!has(c.output, "read "));
}

TEST_CASE("emu defect: device code writing past its allocation faults") {
  const Child c = run_defect("past_allocation");
  INFO(c.output);
  CHECK(c.status != 0);
  CHECK(has(c.output, "device work touched"));
  CHECK(has(c.output, "past the end of a 400-byte device allocation"));
  CHECK(has(c.output, "past_allocation_kernel"));
}

TEST_CASE("emu defect: a race between lanes gives different results under two thread orders") {
  const Child f = run_defect("racy_neighbour", "DFLASH_EMU_ORDER=forward");
  const Child r = run_defect("racy_neighbour", "DFLASH_EMU_ORDER=reverse");
  INFO(f.output << r.output);
  CHECK(has(f.output, "values"));
  CHECK(has(r.output, "values"));
  CHECK(f.output != r.output);
}

TEST_CASE("emu launch: the limits of a launch are refused as a GPU refuses them") {
  CHECK(emu_test::launch_threads(nullptr, 1024) == cudaSuccess);
  CHECK(emu_test::launch_threads(nullptr, 1025) != cudaSuccess);
  CHECK(emu_test::launch_dynamic_smem(nullptr, 48 * 1024, false) == cudaSuccess);
  CHECK(emu_test::launch_dynamic_smem(nullptr, 64 * 1024, false) != cudaSuccess);  // above the 48 KiB default
  CHECK(emu_test::launch_dynamic_smem(nullptr, 64 * 1024, true) == cudaSuccess);   // raised by the attribute
  CHECK(emu_test::launch_dynamic_smem(nullptr, 228 * 1024, true) == cudaErrorInvalidValue);  // above sm_90's 227 KiB
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("emu copies: every direction is checked against where its pointers live") {
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, 64) == cudaSuccess);
  float h[16] = {};
  CHECK(cudaMemcpy(d, h, 64, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemcpy(h, d, 64, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);    // dst is host memory
  CHECK(cudaMemcpy(d, h, 64, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);    // src is host memory
  CHECK(cudaMemcpy(d, d, 64, cudaMemcpyHostToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(h, d, 128, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);   // past the allocation
  CHECK(cudaMemcpy(h, d, 64, cudaMemcpyDefault) == cudaSuccess);                    // inferred
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);  // the last error of the refused calls, then cleared
  CHECK(cudaGetLastError() == cudaSuccess);
  cudaPointerAttributes a{};
  CHECK(cudaPointerGetAttributes(&a, d + 3) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeDevice);
  CHECK(cudaPointerGetAttributes(&a, h) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeUnregistered);
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(d) == cudaErrorInvalidValue);  // twice
}

TEST_CASE("emu streams: an event orders a kernel on one stream after a copy on another") {
  const std::vector<float> x = iota_floats(512, 13);
  float *dx = nullptr, *dy = nullptr;
  REQUIRE(cudaMalloc(&dx, 512 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&dy, 512 * sizeof(float)) == cudaSuccess);
  cudaStream_t a = nullptr, b = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  cudaEvent_t e = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 512 * sizeof(float)) == cudaSuccess);
  std::memcpy(pinned, x.data(), 512 * sizeof(float));
  REQUIRE(cudaMemcpyAsync(dx, pinned, 512 * sizeof(float), cudaMemcpyHostToDevice, a) == cudaSuccess);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  emu_test::add_one(b, dy, dx, 512);
  CHECK(cudaEventQuery(e) == cudaErrorNotReady);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaSuccess);
  const auto y = host_copy(dy, 512);
  int wrong = 0;
  for (int i = 0; i < 512; ++i) wrong += y[size_t(i)] != x[size_t(i)] + 1.0f;
  CHECK(wrong == 0);
  CHECK(cudaEventDestroy(e) == cudaSuccess);
  CHECK(cudaStreamDestroy(a) == cudaSuccess);
  CHECK(cudaStreamDestroy(b) == cudaSuccess);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
}

TEST_CASE("emu streams: copy_bytes from device memory reads what a kernel on a non-blocking stream wrote") {
  // DFLASH_EMU_LAG_MS is large for this test: queued work runs only when the host waits for something
  const std::vector<float> x = iota_floats(64, 13);
  float* dx = device_copy(x);
  float* dy = nullptr;
  REQUIRE(cudaMalloc(&dy, 64 * sizeof(float)) == cudaSuccess);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  emu_test::add_one(s, dy, dx, 64);  // queued on a stream the legacy stream's cudaMemcpy does not wait for
  std::vector<float> y(64);
  dflash::copy_bytes(y.data(), dflash::MemoryKind::host, dy, dflash::MemoryKind::device, 64 * sizeof(float));
  for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == x[i] + 1.0f);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaFree(dx) == cudaSuccess);
  CHECK(cudaFree(dy) == cudaSuccess);
}
