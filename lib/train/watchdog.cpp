#include "lib/train/watchdog.h"

#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lib/comm/tags.h"
#include "lib/train/packet.h"

namespace dflash::train {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A request whose wait() is watched; test() and cancel() do not block.
class WatchedRequest final : public comm::Request::Impl {
 public:
  WatchedRequest(comm::Request inner, Watchdog& w, std::string what)
      : inner_(std::move(inner)), watchdog_(w), what_(std::move(what)) {}
  void wait() override {
    auto guard = watchdog_.arm([&] { return what_; });
    inner_.wait();
  }
  bool test() override { return inner_.test(); }
  void cancel() override { inner_.cancel(); }

 private:
  comm::Request inner_;
  Watchdog& watchdog_;
  std::string what_;
};

}  // namespace

Watchdog::Watchdog(double timeout_seconds, std::function<void(const std::string&, double)> on_stall)
    : timeout_(timeout_seconds), on_stall_(std::move(on_stall)) {
  if (on()) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

Watchdog::Guard::~Guard() {
  if (w_) w_->stop();
}

void Watchdog::start(std::string what) {
  std::lock_guard<std::mutex> lock(mutex_);
  what_ = std::move(what);
  armed_at_ = now_seconds();
}

void Watchdog::stop() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_at_ = -1;
}

void Watchdog::follow_steps(double floor_seconds, double multiple) {
  std::lock_guard<std::mutex> lock(mutex_);
  floor_ = floor_seconds, multiple_ = multiple;
}

void Watchdog::step_done() {
  if (!on()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const double now = now_seconds();
  if (relaxed_ > 0)
    --relaxed_;
  else if (last_step_at_ >= 0)
    slowest_step_ = std::max(slowest_step_, now - last_step_at_);
  last_step_at_ = now;
}

void Watchdog::relax(int steps) {
  std::lock_guard<std::mutex> lock(mutex_);
  relaxed_ = std::max(relaxed_, steps);
}

double Watchdog::bound_locked() const {
  if (multiple_ <= 0 || slowest_step_ <= 0 || relaxed_ > 0) return timeout_;
  return std::min(timeout_, std::max(floor_, multiple_ * slowest_step_));
}

double Watchdog::bound() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bound_locked();
}

std::string Watchdog::bound_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const double b = bound_locked();
  if (multiple_ <= 0) return fmt::format("{:.0f} s (run.watchdog_seconds)", b);
  if (slowest_step_ <= 0) return fmt::format("{:.0f} s (run.watchdog_seconds, before the first steps)", b);
  if (relaxed_ > 0) return fmt::format("{:.0f} s (run.watchdog_seconds, around an eval or a checkpoint save)", b);
  if (b == timeout_)
    return fmt::format("{:.0f} s (run.watchdog_seconds; {:g} x the slowest step {:.1f} s is more)", b, multiple_,
                       slowest_step_);
  if (b == floor_)
    return fmt::format("{:.0f} s (run.watchdog_floor_seconds; {:g} x the slowest step {:.1f} s is less)", b,
                       multiple_, slowest_step_);
  return fmt::format("{:.0f} s ({:g} x the slowest step so far, {:.1f} s: run.watchdog_step_multiple)", b, multiple_,
                     slowest_step_);
}

void Watchdog::beat_to(std::string path) {
  if (!on()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  heartbeat_ = std::move(path);
  const std::string what = armed_at_ < 0 ? std::string() : what_;
  const double waited = armed_at_ < 0 ? 0.0 : now_seconds() - armed_at_;
  lock.unlock();
  write_heartbeat(what, waited);  // the first one now: a rank stopped before the watch thread's first tick has one
}

void Watchdog::write_heartbeat(const std::string& what, double waited) const {
  // best effort, no fsync: a lost heartbeat only makes a stall report less precise
  timeval tv{};
  gettimeofday(&tv, nullptr);
  nlohmann::json j;
  j["pid"] = int(getpid());
  j["alive"] = double(tv.tv_sec) + 1e-6 * double(tv.tv_usec);
  j["waiting"] = what.empty() ? nlohmann::json(nullptr) : nlohmann::json(what);
  j["waited"] = waited;
  const std::string tmp = heartbeat_ + ".tmp", text = j.dump() + "\n";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) == 0 && ok) std::rename(tmp.c_str(), heartbeat_.c_str());
  }
}

void Watchdog::watch() {
  // checks a few times per bound (at least once a second), so a stall is reported within ~1.25 bounds; the
  // heartbeat goes out on the same tick
  const auto period = std::chrono::duration<double>(std::min(1.0, timeout_ / 4));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!quit_) {
    wake_.wait_for(lock, period);
    if (quit_) continue;
    const double waited = armed_at_ < 0 ? 0.0 : now_seconds() - armed_at_;
    if (!heartbeat_.empty()) {
      const std::string what = armed_at_ < 0 ? std::string() : what_;
      lock.unlock();
      write_heartbeat(what, waited);
      lock.lock();
      if (quit_) continue;
    }
    if (armed_at_ < 0 || now_seconds() - armed_at_ < bound_locked()) continue;
    const double waited_now = now_seconds() - armed_at_;
    const std::string what = what_;
    lock.unlock();
    on_stall_(what, waited_now);
    return;  // on_stall normally ends the process; if it returns, report once
  }
}

void WatchedTransport::allreduce_sum(float* data, size_t n) {
  auto g = watchdog_.arm([&] { return fmt::format("all-reduce of {} floats on the {}", n, name_); });
  inner_.allreduce_sum(data, n);
}

void WatchedTransport::allreduce_sum(double* data, size_t n) {
  auto g = watchdog_.arm([&] { return fmt::format("all-reduce of {} doubles on the {}", n, name_); });
  inner_.allreduce_sum(data, n);
}

void WatchedTransport::allreduce_sum_bf16_device(uint16_t* data, size_t n) {
  auto g = watchdog_.arm([&] { return fmt::format("all-reduce of {} bf16 values on the {}", n, name_); });
  inner_.allreduce_sum_bf16_device(data, n);
}

void WatchedTransport::broadcast_bytes(void* data, size_t bytes, int root) {
  auto g = watchdog_.arm([&] { return fmt::format("broadcast of {} bytes from rank {} of the {}", bytes, root, name_); });
  inner_.broadcast_bytes(data, bytes, root);
}

void WatchedTransport::send_bytes(const void* data, size_t bytes, int dest, int tag) {
  auto g = watchdog_.arm(
      [&] { return fmt::format("send of {} ({} bytes) to rank {} of the {}", comm::tag_name(tag), bytes, dest, name_); });
  inner_.send_bytes(data, bytes, dest, tag);
}

void WatchedTransport::recv_bytes(void* data, size_t bytes, int src, int tag) {
  auto g = watchdog_.arm(
      [&] { return fmt::format("receive of {} ({} bytes) from rank {} of the {}", comm::tag_name(tag), bytes, src, name_); });
  inner_.recv_bytes(data, bytes, src, tag);
}

comm::Request WatchedTransport::isend_bytes(const void* data, size_t bytes, int dest, int tag) {
  comm::Request r = inner_.isend_bytes(data, bytes, dest, tag);
  if (!watchdog_.on()) return r;
  return comm::Request(std::make_unique<WatchedRequest>(
      std::move(r), watchdog_,
      fmt::format("completion of a send of {} ({} bytes) to rank {} of the {}", comm::tag_name(tag), bytes, dest, name_)));
}

comm::Request WatchedTransport::irecv_bytes(void* data, size_t bytes, int src, int tag) {
  comm::Request r = inner_.irecv_bytes(data, bytes, src, tag);
  if (!watchdog_.on()) return r;
  return comm::Request(std::make_unique<WatchedRequest>(
      std::move(r), watchdog_,
      fmt::format("receive of {} ({} bytes) from rank {} of the {}", comm::tag_name(tag), bytes, src, name_)));
}

void WatchedTransport::barrier() {
  auto g = watchdog_.arm([&] { return fmt::format("barrier on the {}", name_); });
  inner_.barrier();
}

}  // namespace dflash::train
