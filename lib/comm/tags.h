#pragma once
// Every point-to-point message tag of the project, in one table: who sends what to whom, on which communicator.
// Messages of different kinds between the same two ranks must not share a tag (MPI matches on source and tag
// only), so every sender and receiver names its tag from here, and the watchdog's reports name them (tag_name).
#include <string>

namespace dflash::comm {

enum Tag : int {
  // World communicator. The packet stream (lib/train/packet.h): a target group → each drafter rank it feeds.
  kTagHeader = 7101,  // PacketHeader
  kTagTokens,         // int32 [S] token ids
  kTagMask,           // uint8 [S] loss mask
  kTagTaps,           // fp32 [S, n_taps·H] target features (NCCL on GPUs)
  kTagFinal,          // fp32 [S, H] target final hidden (KL only)
  // The stop protocol (lib/train/packet.h): drafter → target TP rank 0, then the answer back.
  kTagStop,           // int64: the first step the drafter will not train
  kTagLast,           // int64: the last step the target produced

  // World communicator. The speculative eval (lib/eval/spec_eval.h): drafter dp 0 ↔ target TP rank 0.
  kTagSpecWeights = 7201,  // fp32 drafter weights, drafter → target TP rank 0
  kTagSpecResultSize,      // int64 byte count of the result, target → drafter
  kTagSpecResult,          // the result (JSON text), target → drafter

  // The drafters' dp communicator. The step dump (lib/state/step_dump.cpp): each drafter rank → dp rank 0, its
  // micro-batch's inputs.
  kTagDumpHeader = 7301,
  kTagDumpTokens,
  kTagDumpMask,
  kTagDumpAnchors,
  kTagDumpTaps,
  kTagDumpFinal,
};

// "packet taps", "stop request", ...; "tag N" for a tag not in the table.
std::string tag_name(int tag);

}  // namespace dflash::comm
