#include "lib/train/packet.h"

#include <unistd.h>

#include <algorithm>
#include <exception>

#include "lib/comm/shard.h"
#include "lib/comm/tags.h"
#include "lib/core/error.h"
#include "lib/core/timer.h"

namespace dflash::train {

void PacketTensor::reshape(MemoryKind kind, size_t count) {
  if (kind != kind_ || buffer_.bytes() < count * sizeof(float)) {
    buffer_ = Buffer();  // the old allocation goes first: two packets' worth may not fit on the GPU
    buffer_ = Buffer(kind, count * sizeof(float));
  }
  kind_ = kind;
  count_ = count;
}

void PacketTensor::reserve(MemoryKind kind, size_t capacity) {
  if (kind == kind_ && buffer_.bytes() >= capacity * sizeof(float)) return;
  buffer_ = Buffer();
  buffer_ = Buffer(kind, capacity * sizeof(float));
  kind_ = kind;
  count_ = 0;
}

std::vector<float> PacketTensor::to_host() const {
  std::vector<float> host(count_);
  copy_bytes(host.data(), MemoryKind::host, data(), kind_, count_ * sizeof(float));
  return host;
}

void PacketTensor::assign(const float* host, size_t count) {
  reshape(kind_, count);
  copy_bytes(data(), kind_, host, MemoryKind::host, count * sizeof(float));
}

MemoryKind packet_memory(bool cuda, const comm::Transport& data) {
  return cuda && data.takes_device_pointers() ? MemoryKind::device : MemoryKind::host;
}

void FeaturePacket::allocate(const PacketHeader& h, MemoryKind tensors) {
  header = h;
  tokens.resize(size_t(h.seq_len));
  loss_mask.resize(size_t(h.seq_len));
  taps.reshape(tensors, size_t(h.seq_len) * h.tap_width);
  final_hidden.reshape(tensors, size_t(h.seq_len) * h.hidden);
}

FeaturePacket PacketSender::blank(const PacketHeader& h) {
  FeaturePacket p;
  if (!spare_.empty()) {
    p = std::move(spare_.back());
    spare_.pop_back();
  }
  p.allocate(h, tensors_);
  return p;
}

double PacketSender::send(FeaturePacket&& p, int dest, int tp_rank, int tp_size) {
  double blocked = 0;
  if (int(in_flight_.size()) >= max_in_flight_) {
    Timer t;
    for (auto& r : in_flight_.front().requests) r.wait();
    spare_.push_back(std::move(in_flight_.front().packet));
    in_flight_.pop_front();
    blocked = t.seconds();
  }
  in_flight_.push_back({std::move(p), {}});
  InFlight& f = in_flight_.back();
  const PacketHeader& h = f.packet.header;
  // the header first: on NCCL the drafter posts the data receives once it has it. Tokens and mask are small host
  // arrays: control plane
  if (tp_rank == 0) {
    f.requests.push_back(world_.isend_bytes(&f.packet.header, sizeof(PacketHeader), dest, comm::kTagHeader));
    f.requests.push_back(world_.isend(f.packet.tokens.data(), f.packet.tokens.size(), dest, comm::kTagTokens));
    f.requests.push_back(world_.isend(f.packet.loss_mask.data(), f.packet.loss_mask.size(), dest, comm::kTagMask));
  }
  const comm::Range rows = comm::shard_range(h.seq_len, 1, tp_size, tp_rank);
  data_.group_start();
  if (rows.size() > 0) {
    f.requests.push_back(data_.isend(f.packet.taps.data() + rows.begin * h.tap_width,
                                     size_t(rows.size()) * h.tap_width, dest, comm::kTagTaps));
    f.requests.push_back(data_.isend(f.packet.final_hidden.data() + rows.begin * h.hidden,
                                     size_t(rows.size()) * h.hidden, dest, comm::kTagFinal));
  }
  data_.group_end();
  return blocked;
}

void PacketSender::flush() {
  for (auto& f : in_flight_)
    for (auto& r : f.requests) r.wait();
  in_flight_.clear();
}

bool PacketSender::stop_requested(comm::Transport& tp) {
  uint8_t stop = tp.rank() == 0 && world_.probe(-1, comm::kTagStop) ? 1 : 0;
  tp.broadcast(&stop, 1, 0);
  return stop != 0;
}

void PacketSender::finish(comm::Transport& tp, int64_t last_step, const std::vector<int>& drafters) {
  if (tp.rank() == 0) {
    for (int d : drafters) {
      int64_t their_stop = 0;
      world_.recv(&their_stop, 1, d, comm::kTagStop);
    }
    for (int d : drafters) world_.send(&last_step, 1, d, comm::kTagLast);
  }
  flush();
}

PacketReceiver::PacketReceiver(comm::Transport& control, comm::Transport& data, std::vector<int> sources,
                               int tap_width, int hidden, int depth, PlanSource plans, MemoryKind tensors,
                               int max_seq_len)
    : world_(control), data_(data), sources_(std::move(sources)), tap_width_(tap_width), hidden_(hidden),
      depth_(depth < 1 ? 1 : depth), max_seq_len_(max_seq_len > 0 ? max_seq_len : 0), plans_(std::move(plans)),
      tensors_(tensors) {
  DFLASH_CHECK(!sources_.empty(), "packet receiver: no target ranks to receive from");
  if (tensors_ == MemoryKind::device && !data_.takes_device_pointers()) copy_ = std::make_unique<CopyStream>();
  top_up();
}

PacketReceiver::~PacketReceiver() {
  if (std::uncaught_exceptions() == 0) return;  // normal end: pending receives complete (Request waits)
  for (auto& p : pending_) {
    try {
      p.header_request.cancel();
      for (auto& r : p.control) r.cancel();
      if (data_.cancellable_receives())
        for (auto& r : p.requests) r.cancel();
    } catch (...) {
      // already failing: the first error is the one reported
    }
  }
}

void PacketReceiver::top_up() {
  while (!plans_done_ && int(pending_.size()) < depth_) {
    std::optional<PacketPlan> plan = plans_();
    if (!plan) {
      plans_done_ = true;
      break;
    }
    pending_.emplace_back();
    Pending& p = pending_.back();
    p.plan = *plan;
    PacketHeader h;
    h.seq_index = plan->seq_index;
    h.step = plan->step;
    h.micro = plan->micro;
    h.seq_len = plan->seq_len;
    h.tap_width = tap_width_;
    h.hidden = hidden_;
    h.kind = plan->kind;
    if (!spare_.empty()) {
      p.packet = std::move(spare_.back());
      spare_.pop_back();
    }
    if (max_seq_len_ > 0 && plan->seq_len <= max_seq_len_) {  // room for the longest packet, once
      p.packet.taps.reserve(tensors_, size_t(max_seq_len_) * tap_width_);
      p.packet.final_hidden.reserve(tensors_, size_t(max_seq_len_) * hidden_);
    }
    p.packet.allocate(h, tensors_);
    p.header_request = world_.irecv_bytes(&p.header, sizeof(PacketHeader), sources_[0], comm::kTagHeader);
    p.control.push_back(world_.irecv(p.packet.tokens.data(), p.packet.tokens.size(), sources_[0], comm::kTagTokens));
    p.control.push_back(world_.irecv(p.packet.loss_mask.data(), p.packet.loss_mask.size(), sources_[0], comm::kTagMask));
    if (data_.cancellable_receives()) post_data(p);
  }
  post_ready_data();
}

void PacketReceiver::post_data(Pending& p) {
  const PacketHeader& h = p.packet.header;  // the plan's shapes (a header that disagrees is refused before)
  const int tp = int(sources_.size());
  float* taps = p.packet.taps.data();
  float* final_hidden = p.packet.final_hidden.data();
  if (staged()) {  // into page-locked host memory: [taps | final hidden]
    const size_t floats = std::max(p.packet.taps.size() + p.packet.final_hidden.size(),
                                   size_t(max_seq_len_) * (tap_width_ + hidden_));
    while (!spare_staging_.empty() && spare_staging_.back().bytes() < floats * sizeof(float)) spare_staging_.pop_back();
    if (!spare_staging_.empty()) {
      p.staging = std::move(spare_staging_.back());
      spare_staging_.pop_back();
    } else {
      p.staging = Buffer::pinned_host(floats * sizeof(float));
    }
    taps = p.staging.as<float>();
    final_hidden = taps + p.packet.taps.size();
  }
  data_.group_start();
  for (int t = 0; t < tp; ++t) {
    const comm::Range rows = comm::shard_range(h.seq_len, 1, tp, t);
    if (rows.size() == 0) continue;
    p.requests.push_back(data_.irecv(taps + rows.begin * tap_width_, size_t(rows.size()) * tap_width_, sources_[t],
                                     comm::kTagTaps));
    p.requests.push_back(data_.irecv(final_hidden + rows.begin * hidden_, size_t(rows.size()) * hidden_, sources_[t],
                                     comm::kTagFinal));
  }
  data_.group_end();
  p.data_posted = true;
}

void PacketReceiver::check_header(Pending& p) {
  if (p.header_checked) return;
  const PacketHeader& got = p.header;
  DFLASH_CHECK(got.seq_index == p.plan.seq_index && got.step == p.plan.step && got.micro == p.plan.micro &&
                   got.seq_len == p.plan.seq_len && got.tap_width == tap_width_ && got.hidden == hidden_ &&
                   got.kind == p.plan.kind,
               "feature stream out of order: expected {}sequence {} (step {}, micro-batch {}, {} tokens, width {}/{}) "
               "from target rank {}, got {}sequence {} (step {}, micro-batch {}, {} tokens, width {}/{}); the target "
               "and drafter ranks disagree on the data schedule or the model",
               p.plan.kind == kEvalPacket ? "held-out eval " : "", p.plan.seq_index, p.plan.step, p.plan.micro,
               p.plan.seq_len, tap_width_, hidden_, sources_[0], got.kind == kEvalPacket ? "held-out eval " : "",
               got.seq_index, got.step, got.micro, got.seq_len, got.tap_width, got.hidden);
  p.header_checked = true;
}

// In order only: a packet's data is posted after every earlier packet's (the pair order both sides keep).
void PacketReceiver::post_ready_data() {
  for (Pending& p : pending_) {
    if (p.data_posted) continue;
    if (!p.header_request.test()) return;
    check_header(p);
    post_data(p);
  }
}

bool PacketReceiver::arrived(Pending& p) {
  if (!p.data_posted) post_ready_data();
  if (!p.data_posted) return false;
  bool done = p.header_request.test();
  for (auto& r : p.control) done = r.test() && done;
  for (auto& r : p.requests) done = r.test() && done;
  if (!done || !staged()) return done;
  if (!p.upload_queued) queue_upload(p);
  return p.uploaded.reached();
}

void PacketReceiver::queue_upload(Pending& p) {
  const float* taps = p.staging.as<float>();
  copy_->copy(p.packet.taps.data(), taps, p.packet.taps.size() * sizeof(float));
  copy_->copy(p.packet.final_hidden.data(), taps + p.packet.taps.size(), p.packet.final_hidden.size() * sizeof(float));
  p.uploaded = copy_->fence();
  p.upload_queued = true;
}

void PacketReceiver::poll() {
  for (Pending& p : pending_)
    if (!arrived(p)) return;  // in order: a later packet's data is not posted before an earlier one's
}

const FeaturePacket& PacketReceiver::next(double* wait_seconds) {
  DFLASH_CHECK(!pending_.empty(), "packet receiver: no more packets are expected");
  Timer t;
  // wait in place: the header is received into the deque element itself, which must not move before then
  Pending& front = pending_.front();
  front.header_request.wait();
  check_header(front);  // before any data lands in buffers sized by the plan
  if (!front.data_posted) post_data(front);
  for (auto& r : front.control) r.wait();
  for (auto& r : front.requests) r.wait();
  if (staged()) {
    if (!front.upload_queued) queue_upload(front);
    front.uploaded.wait();
    spare_staging_.push_back(std::move(front.staging));
  }
  // the packet handed out last is done with (the contract of next()): its arrays serve a packet to come
  spare_.push_back(std::move(current_));
  current_ = std::move(front.packet);
  pending_.pop_front();
  if (wait_seconds) *wait_seconds += t.seconds();
  top_up();  // post the following receives before the caller starts computing
  return current_;
}

int PacketReceiver::finish(int64_t stop_step, int target_rank0) {
  world_.send(&stop_step, 1, target_rank0, comm::kTagStop);
  int64_t last_step = -1;
  comm::Request last = world_.irecv(&last_step, 1, target_rank0, comm::kTagLast);
  int dropped = 0;
  // keep the front packet's receives moving: the target may be blocked on back-pressure until they complete
  while (!last.test()) {
    if (!pending_.empty() && arrived(pending_.front())) {
      next(nullptr);
      ++dropped;
      continue;
    }
    usleep(200);  // the cores are shared with the target ranks that are finishing their sends
  }
  while (!pending_.empty() && pending_.front().plan.step <= last_step) {
    next(nullptr);
    ++dropped;
  }
  // posted for steps the target never produced: headers (MPI) and, on MPI, the data; on NCCL no data receive is
  // posted before its header arrived, and every header that arrived was for a step ≤ last_step
  for (auto& p : pending_) {
    p.header_request.cancel();
    for (auto& r : p.control) r.cancel();
    for (auto& r : p.requests) r.cancel();
  }
  pending_.clear();
  plans_done_ = true;
  return dropped;
}

}  // namespace dflash::train
