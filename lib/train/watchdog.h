#pragma once
// A watchdog on blocking waits: a rank stuck in one wait (a message that never comes because the sender is
// stopped with SIGSTOP, a collective a hung rank never joins, a dead link) would stall the job forever with
// nothing logged. Every blocking wait of the trainer goes through WatchedTransport, which arms the watchdog with
// a description of the wait; a background thread that finds one wait armed longer than the timeout calls
// on_stall (the trainer logs rank + operation, then aborts the MPI world).
//
// The bound follows the run (follow_steps): before the first step it is the configured timeout (start-up loads the
// target); after it, max(floor, multiple x the slowest step seen, evals and checkpoint saves included), never above
// the configured timeout. The same thread writes a heartbeat file about once a second (beat_to: when it was alive,
// what the rank waits on): a rank whose heartbeat stops is stopped (SIGSTOP, killed, its node gone), not waiting,
// which is how a stall report names the rank that stopped instead of only the ranks waiting on it (heartbeat.h).
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

  // The bound follows the steps: after the first step_done(), max(floor, multiple x slowest interval between two
  // step_done() calls), capped by timeout(). multiple <= 0: the fixed timeout(). Call before the first wait.
  void follow_steps(double floor_seconds, double multiple);
  // One step (or one pass of the target's loop) ended: the time since the previous call is a step's duration.
  void step_done();
  // The next `steps` step_done() intervals are long by nature (an eval, a checkpoint save, the ranks waiting on
  // one): they are held to timeout() and not counted as steps.
  void relax(int steps);
  // The bound a wait is held to now, and how it was derived ("1800 s (run.watchdog_seconds, before the first
  // step)", "300 s (the floor; 20 x the slowest step 0.4 s is less)").
  double bound() const;
  std::string bound_reason() const;
  // Write the heartbeat to `path` about once a second (created by the watch thread; "" = none).
  void beat_to(std::string path);

 private:
  void start(std::string what);
  void stop();
  void watch();
  double bound_locked() const;
  void write_heartbeat(const std::string& what, double waited) const;

  double timeout_;
  std::function<void(const std::string&, double)> on_stall_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::string what_;
  double armed_at_ = -1;  // steady-clock seconds when the current wait began; < 0 = none
  double floor_ = 0, multiple_ = 0;  // follow_steps
  double last_step_at_ = -1, slowest_step_ = 0;
  int relaxed_ = 0;
  std::string heartbeat_;
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
  bool sums_bf16_on_device() const override { return inner_.sums_bf16_on_device(); }
  void allreduce_sum_bf16_device(uint16_t* data, size_t n) override;
  void group_start() override { inner_.group_start(); }
  void group_end() override { inner_.group_end(); }

 private:
  comm::Transport& inner_;
  Watchdog& watchdog_;
  std::string name_;
};

}  // namespace dflash::train
