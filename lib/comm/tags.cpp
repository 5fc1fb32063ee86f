#include "lib/comm/tags.h"

#include <fmt/format.h>

namespace dflash::comm {

std::string tag_name(int tag) {
  switch (tag) {
    case kTagHeader: return "packet header";
    case kTagTokens: return "packet tokens";
    case kTagMask: return "packet loss mask";
    case kTagTaps: return "packet taps";
    case kTagFinal: return "packet final hidden";
    case kTagStop: return "stop request";
    case kTagLast: return "last step";
    case kTagSpecWeights: return "speculative-eval weights";
    case kTagSpecResultSize: return "speculative-eval result size";
    case kTagSpecResult: return "speculative-eval result";
    case kTagDumpHeader: return "step-dump header";
    case kTagDumpTokens: return "step-dump tokens";
    case kTagDumpMask: return "step-dump loss mask";
    case kTagDumpAnchors: return "step-dump anchors";
    case kTagDumpTaps: return "step-dump taps";
    case kTagDumpFinal: return "step-dump final hidden";
    default: return fmt::format("tag {}", tag);
  }
}

}  // namespace dflash::comm
