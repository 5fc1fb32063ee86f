#include "lib/train/heartbeat.h"

#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace dflash::train {

std::string heartbeat_path(const std::string& out_dir, int rank) {
  return fmt::format("{}/logs/heartbeat_{:02d}.json", out_dir, rank);
}

std::string diagnose_heartbeats(const std::string& out_dir, int world_size, double now, double stale_after,
                                const std::function<std::string(int)>& who) {
  std::vector<std::string> stopped, busy, waiting;
  for (int r = 0; r < world_size; ++r) {
    const std::string name = fmt::format("world rank {} ({})", r, who(r));
    std::ifstream f(heartbeat_path(out_dir, r));
    nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (!f.is_open() || j.is_discarded() || !j.is_object() || !j.contains("alive") || !j["alive"].is_number()) {
      stopped.push_back(fmt::format("{}: no readable heartbeat ({}): never started its watchdog, or stopped",
                                    name, heartbeat_path(out_dir, r)));
      continue;
    }
    const double age = now - j["alive"].get<double>();
    if (age > stale_after) {
      stopped.push_back(fmt::format("{}: STOPPED: no heartbeat for {:.0f} s (SIGSTOP, killed, or its node is gone)",
                                    name, age));
    } else if (!j.contains("waiting") || !j["waiting"].is_string()) {
      busy.push_back(fmt::format("{}: alive and not in a wait (computing, or stuck in a device call)", name));
    } else {
      waiting.push_back(fmt::format("{}: waits {:.0f} s for the {}", name, j.value("waited", 0.0),
                                    j["waiting"].get<std::string>()));
    }
  }
  std::string out;
  for (const auto* group : {&stopped, &busy, &waiting})
    for (const std::string& line : *group) out += "\n  " + line;
  if (stopped.empty() && busy.empty())
    out += "\n  every rank waits: a message that was never sent, or a deadlock (please report it with these lines)";
  return out;
}

}  // namespace dflash::train
