// SPDX-License-Identifier: Apache-2.0
// The names of the flow kinds and events (stats.h) as the reader's JSON and Prometheus text
// print them: label values, so they never change once published.
#include "mesh/stats/stats.h"

#include <string>

namespace mesh {
namespace stats {

std::string flowKindName(FlowKind k) {
  switch (k) {
    case FlowKind::Direct:
      return "direct";
    case FlowKind::Relayed:
      return "relayed";
    case FlowKind::Forwarded:
      return "forwarded";
  }
  return "unknown_" + std::to_string(static_cast<int>(k));  // a slot written by a newer plugin
}

const char* eventName(int e) {
  static const char* const kNames[] = {"connects",      "accepts",     "connect_fails", "closes",
                                       "comm_errors",   "relay_retries", "truncations", "slots_full"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == kEventCount, "one name per Event, in enum order");
  return e >= 0 && e < kEventCount ? kNames[e] : "unknown";
}

}  // namespace stats
}  // namespace mesh
