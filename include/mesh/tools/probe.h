// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --probe PEER and --serve: an end-to-end check of every cable between this
// node and PEER, through the plugin's own connection machinery (routing, handshake, QPs,
// data path), each port alone (NCCL_MESH_DEVICES=port). The two sides meet over the
// management network (tool_net.h); the protocol and the verdict's words are in
// probe_plan.h. Both functions print their report on stdout and return the exit status.
#pragma once

#include <string>

namespace mesh {

// nccl-mesh-info's exit statuses for --probe.
constexpr int kProbeOk = 0;         // every cable to PEER carries RDMA
constexpr int kProbeNoPort = 1;     // this node has no usable port (or the plugin failed)
constexpr int kProbeNoCable = 2;    // no port here shares a subnet with a port of PEER
constexpr int kProbeCableFail = 3;  // a cable shares a subnet but RDMA over it failed
constexpr int kProbeNoPeer = 4;     // PEER's responder could not be reached or misbehaved

struct ProbeOptions {
  std::string peer;       // host or address on the management network, optionally :PORT
  double timeoutS = 10;   // per cable, and for reaching the responder
  bool verbose = false;   // the plugin's INFO lines on stderr
};
int runProbe(const ProbeOptions& o);

struct ServeOptions {
  std::string bind;       // empty: every interface
  int port = 18601;
  bool once = false;      // serve one prober, then exit
  double timeoutS = 0;    // with once: give up when no prober came (0: wait for ever)
  bool verbose = false;
};
int runServe(const ServeOptions& o);

}  // namespace mesh
