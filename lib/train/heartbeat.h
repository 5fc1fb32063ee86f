#pragma once
// Per-rank heartbeats (written by each rank's watchdog thread about once a second, lib/train/watchdog.h) and the
// diagnosis a stall report prints from them. A rank whose heartbeat stopped is stopped (SIGSTOP, killed, its node
// gone): its own watchdog cannot report, so the peers that read its file name it. A rank that beats but waits on
// nothing is computing (or stuck in a device call); the rest wait, and say on what.
#include <functional>
#include <string>

namespace dflash::train {

// <out_dir>/logs/heartbeat_RR.json for world rank r (the folder of the rank logs).
std::string heartbeat_path(const std::string& out_dir, int rank);

// One line per rank that is stopped or not in a wait, then the waiting ranks, e.g.
//   "world rank 6 (drafter 1): STOPPED: no heartbeat for 9 s (SIGSTOP, killed, or its node is gone)"
// now: this machine's clock (seconds since the epoch); stale_after: a heartbeat older than this is a stopped rank
// (heartbeats are written about once a second; clocks of other nodes may differ by a little); who(r): the rank's
// role for the message. A missing or unreadable file is said as such.
std::string diagnose_heartbeats(const std::string& out_dir, int world_size, double now, double stale_after,
                                const std::function<std::string(int)>& who);

}  // namespace dflash::train
