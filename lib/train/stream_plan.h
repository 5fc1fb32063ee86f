#pragma once
// The stream plan: every packet a target group sends and a drafter rank receives, in order, declared once and
// iterated by both sides (the target worker to produce them, the drafter worker's PacketReceiver to post its
// receives early).
//   step s, for drafter rank d: the training packets of micro-batches 0..M-1 (io::SequenceSchedule), then the
//   extra packets each registered ExtraPackets source adds after step s (the held-out eval's, lib/eval), in
//   registration order. Extras count as packets of step s: the stop protocol (packet.h) drops them with it.
// The target side interleaves its drafters within a micro-batch (micro 0 to every drafter, then micro 1, ...),
// then sends every drafter its extras; each drafter sees only its own packets, in the order above.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "lib/config/config.h"
#include "lib/io/dataset.h"
#include "lib/train/packet.h"
#include "lib/train/run_plan.h"

namespace dflash::train {

// One source of packets beyond the training ones, of one PacketKind (not kTrainPacket).
class ExtraPackets {
 public:
  virtual ~ExtraPackets() = default;
  virtual int32_t kind() const = 0;
  // The packets drafter rank d receives after step `step` (0-based), in order; empty when none are due.
  virtual std::vector<PacketPlan> after_step(int64_t step, int d) const = 0;
  // The sequence one of those packets carries (target side).
  virtual io::Sequence read(const PacketPlan& p) const = 0;
};

class StreamPlan {
 public:
  StreamPlan(const TrainConfig& cfg, const RunPlan& plan, const io::Dataset& data);
  // Registers a source of extra packets (its kind must be new).
  void add(std::unique_ptr<ExtraPackets> extra);

  int micro_batches() const { return micro_batches_; }
  int64_t total_steps() const { return total_steps_; }
  // The training packet of (step, micro) for drafter rank d.
  PacketPlan train_packet(int64_t step, int micro, int d) const;
  // Every extra packet drafter rank d receives after step `step`, sources in registration order.
  std::vector<PacketPlan> extras(int64_t step, int d) const;
  // Target side: the sequence a planned packet carries (the training data, or the extra source of its kind).
  io::Sequence read(const PacketPlan& p) const;

 private:
  const TrainConfig& cfg_;
  const io::Dataset& data_;
  io::SequenceSchedule schedule_;
  int micro_batches_;
  int64_t total_steps_;
  std::vector<std::unique_ptr<ExtraPackets>> extras_;
};

// Drafter side: walks drafter rank d's packets from step start_step on (the PacketReceiver's plan source).
class StreamCursor {
 public:
  StreamCursor(const StreamPlan& plan, int d, int64_t start_step) : plan_(&plan), d_(d), step_(start_step) {}
  std::optional<PacketPlan> next();  // none after the last step's packets

 private:
  const StreamPlan* plan_;
  int d_;
  int64_t step_;
  int micro_ = 0;
  std::vector<PacketPlan> extras_;  // of the step planned last, not yet handed out
  size_t extra_ = 0;
};

}  // namespace dflash::train
