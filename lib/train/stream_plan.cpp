#include "lib/train/stream_plan.h"

#include "lib/core/error.h"

namespace dflash::train {

StreamPlan::StreamPlan(const TrainConfig& cfg, const RunPlan& plan, const io::Dataset& data)
    : cfg_(cfg), data_(data),
      schedule_(plan.num_sequences, cfg.layout.drafter_dp, cfg.optim.micro_batches, uint64_t(cfg.run.seed),
                cfg.data.shuffle, cfg.data.path),
      micro_batches_(cfg.optim.micro_batches), total_steps_(plan.total_steps) {}

void StreamPlan::add(std::unique_ptr<ExtraPackets> extra) {
  DFLASH_CHECK(extra && extra->kind() != kTrainPacket, "internal: an extra packet source needs its own kind");
  for (const auto& e : extras_)
    DFLASH_CHECK(e->kind() != extra->kind(), "internal: two extra packet sources of kind {}", extra->kind());
  extras_.push_back(std::move(extra));
}

PacketPlan StreamPlan::train_packet(int64_t step, int micro, int d) const {
  PacketPlan p;
  p.step = step;
  p.micro = micro;
  p.seq_index = schedule_.sequence(step, micro, d);
  p.seq_len = streamed_length(cfg_, data_, p.seq_index);
  return p;
}

std::vector<PacketPlan> StreamPlan::extras(int64_t step, int d) const {
  std::vector<PacketPlan> out;
  for (const auto& e : extras_)
    for (const PacketPlan& p : e->after_step(step, d)) out.push_back(p);
  return out;
}

io::Sequence StreamPlan::read(const PacketPlan& p) const {
  if (p.kind == kTrainPacket) return data_.read(p.seq_index, cfg_.data.max_seq_len);
  for (const auto& e : extras_)
    if (e->kind() == p.kind) return e->read(p);
  DFLASH_CHECK(false, "internal: no packet source of kind {}", p.kind);
  return {};
}

std::optional<PacketPlan> StreamCursor::next() {
  if (extra_ < extras_.size()) return extras_[extra_++];
  if (step_ >= plan_->total_steps()) return std::nullopt;
  const PacketPlan p = plan_->train_packet(step_, micro_, d_);
  if (++micro_ == plan_->micro_batches()) {  // the step's extras follow its last micro-batch
    extras_ = plan_->extras(step_, d_);
    extra_ = 0;
    micro_ = 0;
    ++step_;
  }
  return p;
}

}  // namespace dflash::train
