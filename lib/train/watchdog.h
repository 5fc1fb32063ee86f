#pragma once
// A watchdog on blocking waits: a rank stuck in one wait (a message that never comes because the sender is
// stopped with SIGSTOP, a collective a hung rank never joins, a dead link) would stall the job forever with
// nothing logged. Every blocking wait of the trainer goes through WatchedTransport, which arms the watchdog with
// a description of the wait; a background thread that finds one wait armed longer than the timeout calls
// on_stall (the trainer logs rank + operation, then aborts the MPI world).
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "lib/comm/transport.h"

namespace dflash::train {

class Watchdog {
 public:
  // timeout_seconds <= 0: off (arming costs nothing, no thread). on_stall(what, seconds waited) runs once, on the
  // watchdog's thread; it is expected not to return (abort).
  Watchdog(double timeout_seconds, std::function<void(const std::string& what, double waited)> on_stall);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // One blocking wait of the calling thread, armed for the guard's life. Waits do not nest.
  class Guard {
   public:
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    friend class Watchdog;
    explicit Guard(Watchdog* w) : w_(w) {}
    Watchdog* w_;
  };
  // `describe` builds the wait's description only when the watchdog is on.
  template <typename Describe>
  [[nodiscard]] Guard arm(Describe&& describe) {
    if (!on()) return Guard(nullptr);
    start(describe());
    return Guard(this);
  }
  bool on() const { return timeout_ > 0; }
  double timeout() const { return timeout_; }

 private:
  void start(std::string what);
  void stop();
  void watch();

  double timeout_;
  std::function<void(const std::string&, double)> on_stall_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::string what_;
  double armed_at_ = -1;  // steady-clock seconds when the current wait began; < 0 = none
  bool quit_ = false;
  std::thread thread_;
};

// A Transport whose every blocking call (collectives, blocking send/receive, Request::wait) is watched. `name`
// says which communicator it is ("world", "target TP group 0", "drafter DP group").
class WatchedTransport final : public comm::Transport {
 public:
  WatchedTransport(comm::Transport& inner, Watchdog& watchdog, std::string name)
      : inner_(inner), watchdog_(watchdog), name_(std::move(name)) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void allreduce_sum(float* data, size_t n) override;
  void allreduce_sum(double* data, size_t n) override;
  void broadcast_bytes(void* data, size_t bytes, int root) override;
  void send_bytes(const void* data, size_t bytes, int dest, int tag) override;
  void recv_bytes(void* data, size_t bytes, int src, int tag) override;
  comm::Request isend_bytes(const void* data, size_t bytes, int dest, int tag) override;
  comm::Request irecv_bytes(void* data, size_t bytes, int src, int tag) override;
  void barrier() override;
  bool probe(int src, int tag) override { return inner_.probe(src, tag); }  // does not block
  bool cancellable_receives() const override { return inner_.cancellable_receives(); }
  bool takes_device_pointers() const override { return inner_.takes_device_pointers(); }
  void group_start() override { inner_.group_start(); }
  void group_end() override { inner_.group_end(); }

 private:
  comm::Transport& inner_;
  Watchdog& watchdog_;
  std::string name_;
};

// "header" | "tokens" | ... for the trainer's message tags (lib/train/packet.h), else the number.
std::string tag_name(int tag);

}  // namespace dflash::train
