#pragma once
// Feature packets: what a target group streams to one drafter rank for one sequence (docs/architecture.md).
//
// Every TP rank of the group holds the full activations after the target forward, so each sends a slice of the
// rows (shard_range(S, 1, tp_size, tp_rank)) of the taps and the final hidden: all links work at once. TP rank 0
// also sends the header, the tokens and the loss mask.
// Two planes (lib/comm/data_plane.h): the header, the tokens, the loss mask (small, host) and the stop protocol
// travel on the control plane (MPI world); the taps and the final hidden on the data plane (the world's data
// transport: MPI or NCCL), one tag per field. Both keep the messages of one pair of ranks in the order they were
// issued, and both sides issue them in packet order, so packets arrive in the order they were sent. On the MPI
// data plane the drafter posts the receives of the next `depth` packets at once; NCCL cannot withdraw a posted
// receive (a stop would leave it dangling), so there a packet's data receives are posted once its header has
// arrived (the target has issued the sends); poll() posts them while the drafter computes, so the next packet's
// transfer overlaps the current packet's compute.
// Where the tensors live: on a target rank (packet_memory), on its GPU when the data plane takes device pointers
// (NCCL: target GPU → drafter GPU, no host copy), else in host memory. On a drafter rank, on its GPU whenever it
// computes there: over NCCL received in place; over MPI received into page-locked host staging and uploaded on a
// copy stream of the receiver's own as soon as the data are in, so the upload overlaps the current packet's compute.
// Both ends keep a packet's arrays for the next one (a packet of a 27B target is ~1 GB: no allocation per packet).
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "lib/comm/transport.h"
#include "lib/core/buffer.h"
#include "lib/core/copy_stream.h"

namespace dflash::train {

struct PacketHeader {
  int64_t seq_index = -1;  // dataset index of the sequence
  int64_t step = 0;        // optimizer step it is for
  int32_t micro = 0;       // micro-batch within the step
  int32_t seq_len = 0;     // S
  int32_t tap_width = 0;   // n_taps * H
  int32_t hidden = 0;      // H
  int32_t kind = 0;        // PacketKind: a training sequence or a held-out eval one (sent after the step's)
};

// What a packet is for. Eval packets follow the packets of the step they are named for and count as packets of
// that step in the stop protocol below (a stop drops them like the step's own).
enum PacketKind : int32_t { kTrainPacket = 0, kEvalPacket = 1 };

// One fp32 array of a packet in host or device memory. reshape() keeps the allocation when it is big enough, so a
// packet's arrays are reused from packet to packet.
class PacketTensor {
 public:
  void reshape(MemoryKind kind, size_t count);
  // Allocates room for `capacity` floats now (in `kind`) unless there is room already: later reshapes up to it
  // allocate nothing.
  void reserve(MemoryKind kind, size_t capacity);
  float* data() { return count_ ? buffer_.as<float>() : nullptr; }
  const float* data() const { return count_ ? buffer_.as<float>() : nullptr; }
  size_t size() const { return count_; }
  MemoryKind memory() const { return kind_; }
  std::vector<float> to_host() const;            // a host copy (blocking)
  void assign(const float* host, size_t count);  // (=) count host floats, in this tensor's memory (blocking)

 private:
  Buffer buffer_;
  size_t count_ = 0;
  MemoryKind kind_ = MemoryKind::host;
};

// Where a target rank keeps its packets' taps and final hidden: device memory when its compute runs on a GPU (cuda)
// and the data plane takes device pointers (NCCL), else host memory. (A drafter on a GPU receives into device
// memory on either plane: PacketReceiver stages the MPI plane.)
MemoryKind packet_memory(bool cuda, const comm::Transport& data);

// Move-only (its tensors own memory).
struct FeaturePacket {
  PacketHeader header;
  std::vector<int32_t> tokens;     // [S]
  std::vector<uint8_t> loss_mask;  // [S]
  PacketTensor taps;               // [S, n_taps*H]  target hidden states at the tap layers
  PacketTensor final_hidden;       // [S, H]         target final normed hidden (for the KL term)
  // Shapes the arrays for h, the tensors in `tensors` memory (allocations kept when big enough).
  void allocate(const PacketHeader& h, MemoryKind tensors = MemoryKind::host);
};

// The packets' message tags (kTagHeader ... kTagLast): lib/comm/tags.h.

// Ending a stream (normally or early, e.g. on SIGTERM) without leaving a send or a receive unmatched:
//   1. every drafter sends kTagStop (int64: the first step it will not train) to TP rank 0 of its group;
//   2. the target group checks for a stop before each step (TP rank 0 probes, then tells its TP group), stops
//      producing, receives one kTagStop per drafter it feeds and answers each with kTagLast (int64: the last step
//      it sent packets for), then waits for its sends;
//   3. each drafter keeps receiving while it waits for kTagLast (so a target blocked on back-pressure can go on),
//      receives and drops the packets up to that step, and cancels the receives it had posted beyond it.

// Target side. Sends are asynchronous; at most `max_in_flight` packets per sender are pending (back-pressure):
// send() first waits for the oldest when the window is full.
class PacketSender {
 public:
  // control: the MPI world; data: the world's data-plane transport (may be the same object); tensors: where the
  // packets' taps and final hidden live (packet_memory).
  PacketSender(comm::Transport& control, comm::Transport& data, int max_in_flight,
               MemoryKind tensors = MemoryKind::host)
      : world_(control), data_(data), max_in_flight_(max_in_flight), tensors_(tensors) {}
  ~PacketSender() { flush(); }

  // A packet to fill for header h, allocated in the sender's memory: the arrays of a packet whose sends have
  // completed when there is one.
  FeaturePacket blank(const PacketHeader& h);
  // Sends this TP rank's share of `packet` to world rank `dest`. Returns the seconds spent blocked by the window.
  double send(FeaturePacket&& packet, int dest, int tp_rank, int tp_size);
  void flush();  // waits for every pending send

  // Target side of ending the stream: collective over the TP group `tp`. True when a drafter asked to stop.
  bool stop_requested(comm::Transport& tp);
  // After the last step produced (last_step, or start-1 when none): TP rank 0 receives every drafter's kTagStop
  // and answers with kTagLast; then every TP rank waits for its sends. `drafters`: world ranks fed by the group.
  void finish(comm::Transport& tp, int64_t last_step, const std::vector<int>& drafters);

 private:
  struct InFlight {
    FeaturePacket packet;  // owned until its sends complete
    std::vector<comm::Request> requests;
  };
  comm::Transport& world_;  // control plane
  comm::Transport& data_;
  int max_in_flight_;
  MemoryKind tensors_;
  std::deque<InFlight> in_flight_;
  std::vector<FeaturePacket> spare_;  // sent packets whose arrays blank() reuses
};

// What a drafter expects next: known in advance from the data schedule, so receives are posted early.
struct PacketPlan {
  int64_t seq_index = -1, step = 0;
  int32_t micro = 0, seq_len = 0;
  int32_t kind = kTrainPacket;
};

// Drafter side: receives the packets of one target group (its TP ranks' world ranks in `sources`), keeping the
// receives of the next `depth` packets posted while the current one is computed on.
class PacketReceiver {
 public:
  using PlanSource = std::function<std::optional<PacketPlan>()>;  // the next expected packet, or none at the end
  // control: the MPI world; data: the world's data-plane transport (may be the same object); tensors: where the
  // packets' taps and final hidden are handed out: host, or device (the calling thread's current GPU; staged through
  // page-locked host memory and a copy stream when `data` takes host pointers only, which needs CUDA).
  // max_seq_len > 0 (data.max_seq_len): every packet array and staging buffer is allocated for that many
  // positions on first use, so that the stream allocates nothing per step; 0: they grow with the sequences seen.
  PacketReceiver(comm::Transport& control, comm::Transport& data, std::vector<int> sources, int tap_width,
                 int hidden, int depth, PlanSource plans, MemoryKind tensors = MemoryKind::host, int max_seq_len = 0);
  // Unwinding from an error (a stream-order mismatch), waiting for the pending receives could wait forever: the
  // target may be blocked on back-pressure behind a packet whose data this side never posted. Then the receives
  // that can be withdrawn are (headers; MPI data), so the error reaches the handler that aborts the job.
  ~PacketReceiver();
  PacketReceiver(const PacketReceiver&) = delete;
  PacketReceiver& operator=(const PacketReceiver&) = delete;

  // The next packet, checked against its plan (a mismatch is a stream-order error naming both). wait_seconds
  // (+=) the time spent waiting for it. The packet stays valid until the next call of next() or finish(), which
  // reuse its arrays: finish the work on it (its device reads included) first.
  const FeaturePacket& next(double* wait_seconds);
  // Moves the stream along without blocking: tests the pending transfers (MPI progresses a large message only
  // inside MPI calls) and posts the data receives of packets whose header arrived (NCCL). For the drafter to call
  // while it computes.
  void poll();

  // Ends the stream early or at its end (protocol above): `stop_step` is the first step this drafter does not
  // train; `target_rank0` the world rank of its group's TP rank 0. Returns the packets dropped.
  int finish(int64_t stop_step, int target_rank0);

 private:
  // Members in this order so that destruction waits for the transfers (requests, the upload's fence) before it
  // frees the memory they use (staging, packet).
  struct Pending {
    PacketPlan plan;
    PacketHeader header;
    FeaturePacket packet;
    Buffer staging;                        // staged receives (device tensors over a host-only plane): the data land
                                           // here [taps | final hidden], page-locked, then are uploaded on copy_
    comm::Request header_request;          // control plane
    bool header_checked = false;
    bool data_posted = false;
    std::vector<comm::Request> control;    // tokens and loss mask (control plane)
    std::vector<comm::Request> requests;   // taps and final hidden (data plane)
    bool upload_queued = false;
    CopyStream::Fence uploaded;
  };
  bool staged() const { return copy_ != nullptr; }
  void queue_upload(Pending& p);  // staged: the arrived data to the packet's device tensors
  void top_up();
  void post_data(Pending& p);
  void post_ready_data();  // data receives of the leading packets whose header has arrived
  bool arrived(Pending& p);  // header and data complete (posts the data when the header is in)
  void check_header(Pending& p);

  comm::Transport& world_;  // control plane
  comm::Transport& data_;
  std::vector<int> sources_;
  int tap_width_, hidden_, depth_;
  int max_seq_len_;  // 0: arrays sized per packet
  PlanSource plans_;
  MemoryKind tensors_;
  bool plans_done_ = false;
  std::deque<Pending> pending_;
  FeaturePacket current_;              // what next() returned last
  std::vector<FeaturePacket> spare_;   // arrays of consumed packets, reused by the next posted ones
  std::unique_ptr<CopyStream> copy_;   // staged receives only
  std::vector<Buffer> spare_staging_;  // page-locked staging of uploaded packets, reused
};

}  // namespace dflash::train
