#include "lib/train/watchdog.h"

#include <chrono>

#include <fmt/format.h>

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

std::string tag_name(int tag) {
  switch (tag) {
    case kTagHeader: return "packet header";
    case kTagTokens: return "packet tokens";
    case kTagMask: return "packet loss mask";
    case kTagTaps: return "packet taps";
    case kTagFinal: return "packet final hidden";
    case kTagStop: return "stop request";
    case kTagLast: return "last step";
    default: return fmt::format("tag {}", tag);
  }
}

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

void Watchdog::watch() {
  // checks a few times per timeout (at least once a second), so a stall is reported within ~1.25 timeouts
  const auto period = std::chrono::duration<double>(std::min(1.0, timeout_ / 4));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!quit_) {
    wake_.wait_for(lock, period);
    if (quit_ || armed_at_ < 0) continue;
    const double waited = now_seconds() - armed_at_;
    if (waited < timeout_) continue;
    const std::string what = what_;
    lock.unlock();
    on_stall_(what, waited);
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

void WatchedTransport::broadcast_bytes(void* data, size_t bytes, int root) {
  auto g = watchdog_.arm([&] { return fmt::format("broadcast of {} bytes from rank {} of the {}", bytes, root, name_); });
  inner_.broadcast_bytes(data, bytes, root);
}

void WatchedTransport::send_bytes(const void* data, size_t bytes, int dest, int tag) {
  auto g = watchdog_.arm(
      [&] { return fmt::format("send of {} ({} bytes) to rank {} of the {}", tag_name(tag), bytes, dest, name_); });
  inner_.send_bytes(data, bytes, dest, tag);
}

void WatchedTransport::recv_bytes(void* data, size_t bytes, int src, int tag) {
  auto g = watchdog_.arm(
      [&] { return fmt::format("receive of {} ({} bytes) from rank {} of the {}", tag_name(tag), bytes, src, name_); });
  inner_.recv_bytes(data, bytes, src, tag);
}

comm::Request WatchedTransport::isend_bytes(const void* data, size_t bytes, int dest, int tag) {
  comm::Request r = inner_.isend_bytes(data, bytes, dest, tag);
  if (!watchdog_.on()) return r;
  return comm::Request(std::make_unique<WatchedRequest>(
      std::move(r), watchdog_,
      fmt::format("completion of a send of {} ({} bytes) to rank {} of the {}", tag_name(tag), bytes, dest, name_)));
}

comm::Request WatchedTransport::irecv_bytes(void* data, size_t bytes, int src, int tag) {
  comm::Request r = inner_.irecv_bytes(data, bytes, src, tag);
  if (!watchdog_.on()) return r;
  return comm::Request(std::make_unique<WatchedRequest>(
      std::move(r), watchdog_,
      fmt::format("receive of {} ({} bytes) from rank {} of the {}", tag_name(tag), bytes, src, name_)));
}

void WatchedTransport::barrier() {
  auto g = watchdog_.arm([&] { return fmt::format("barrier on the {}", name_); });
  inner_.barrier();
}

}  // namespace dflash::train
