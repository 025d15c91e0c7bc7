// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --probe / --serve, the pure parts (unit-tested): which cables join this node
// to the peer (a local port and a peer port that share a subnet, decided by the plugin's own
// subnet routing), the messages the prober and the responder exchange over the management
// network, and the words of the verdict.
//
// Session (each line one control-channel message, see tool_net.h):
//   prober    -> responder  "probe-hello 1 <version text>"
//   responder -> prober     "probe-ports 1" + "\nhost NAME" + "\nversion TEXT" + one
//                           "\nport LABEL HEXHANDLE" per
//                           port (the responder listens on each port alone: device mode
//                           'port', so a handle holds exactly that port's addresses)
//   per cable:
//   prober    -> responder  "probe-test DEV TIMEOUT_MS" (DEV: the responder's port index)
//   prober                  connects from its port to DEV's handle, RDMA-writes a pattern
//   prober    -> responder  "probe-cancel DEV" when its side failed first
//   responder -> prober     "probe-result DEV ok BYTES WRONG" | "probe-result DEV fail TEXT"
//   prober    -> responder  "probe-bye"
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "mesh/routing/subnet_routing.h"
#include "mesh/wire/handle_codec.h"

namespace mesh {

constexpr int kProbeDefaultPort = 18601;
constexpr size_t kProbeBytes = 64 * 1024;  // one RDMA write of this size per cable
constexpr unsigned long long kProbeSeed = 0x70726f6265ull;

struct ProbePeerPort {
  std::string label;  // "rxe_p0:1/p0"
  uint8_t handle[kHandleSize] = {};
  std::vector<HandleAddress> addrs;  // decoded from the handle
};

struct ProbePorts {
  std::string host;
  std::string version;  // the responder's versionText()
  std::vector<ProbePeerPort> ports;
};
std::string encodeProbePorts(const std::string& host, const std::string& version,
                             const std::vector<std::string>& labels,
                             const std::vector<std::vector<uint8_t>>& handles);
bool decodeProbePorts(const std::string& text, ProbePorts* out, std::string* error);

// One cable: a local port and a peer port that share a subnet.
struct ProbeCable {
  int local = 0;  // index into the local NICs
  int peer = 0;   // index into the peer's ports
  Route route;
};
struct ProbePlan {
  std::vector<ProbeCable> cables;
  std::vector<int> localAlone;  // local ports with no partner at the peer
  std::vector<int> peerAlone;   // the peer's ports with no partner here
};
ProbePlan planProbe(const std::vector<LocalNic>& local, const std::vector<ProbePeerPort>& peer);

// "198.18.0.1/24 on rxe_p1:1/p1, 198.18.1.1/24 on rxe_p2:1/p2" (or "no usable port").
std::string describeLocalPorts(const std::vector<LocalNic>& local);
std::string describePeerPorts(const std::vector<ProbePeerPort>& peer);
// "rxe_p1:1/p1 198.18.0.1/24 <-> PEER rxe_p0:1/p0 198.18.0.2/24 (subnet 198.18.0.0/24)"
std::string describeCable(const ProbeCable& c, const std::vector<LocalNic>& local,
                          const std::vector<ProbePeerPort>& peer, const std::string& peerName);
// The verdict when no cable joins the two nodes, naming both sides' subnets.
std::string noCableVerdict(const std::vector<LocalNic>& local, const std::vector<ProbePeerPort>& peer,
                           const std::string& peerName);

}  // namespace mesh
