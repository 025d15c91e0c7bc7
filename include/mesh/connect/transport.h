// SPDX-License-Identifier: Apache-2.0
// The seam between the handshake (TCP, on the reactor thread) and the RDMA resources of a
// connection. The handshake engine only sees this interface, so its state machine runs in
// unit tests with a fake transport and no RDMA.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "err.h"
#include "mesh/routing/subnet_routing.h"
#include "mesh/wire/handshake_proto.h"

namespace mesh {

// The TCP control socket kept open for a connection's lifetime: when the peer process dies
// the kernel closes it and the reactor sets `closed`, so pending requests fail fast instead
// of waiting on RDMA retries. Written by the reactor, read by NCCL's thread (atomic).
struct ControlLink {
  std::atomic<bool> closed{false};
  // Why it closed (set before `closed`): 0 = the peer closed it (process exited or was
  // killed), else the socket error, e.g. ETIMEDOUT when keepalive got no answer.
  std::atomic<int> error{0};
  int fd = -1;  // reactor thread only
  // Reactor thread only: when the peer's last heartbeat (or any byte) arrived. Both ends'
  // reactors send one byte every NCCL_MESH_PEER_TIMEOUT_MS / 4: the kernel answers TCP
  // keepalive even for a stopped (SIGSTOP) or hung process, a heartbeat does not.
  std::chrono::steady_clock::time_point lastHeard;
};

// One side of a connection being built: QPs, CQs, control region. Concrete types are the
// data-path comms (SendComm/RecvComm) in production and fakes in tests.
class PreparedConn {
 public:
  virtual ~PreparedConn() = default;
  std::shared_ptr<ControlLink> control;  // set by the handshake before hand-off to NCCL
  std::string peer;                      // peer address, for messages
};

// Per-connection options NCCL can pass at connect time (v10+: traffic class).
struct ConnOptions {
  int trafficClass = -1;  // the communicator's class; -1: unset (see resolveTrafficClass)
  uint32_t originAddr = 0;  // a relay's connect: the relayed connection's sender (its HELLO says so)
  int twinLeg = 0;          // 1 or 2: this connect is a leg of a two-relay connection (its HELLO says so)
  bool acceptAtOnce = false;  // the listener accepts at once (a relay's leg): wait for its ACCEPT only
                              // the connect timeout, not NCCL_MESH_ACCEPT_WAIT_MS
};

class Transport {
 public:
  virtual ~Transport() = default;
  // The node's mesh ports as routing sees them (index = NIC index in handles).
  virtual std::vector<LocalNic> localNics() const = 0;
  // Creates one side's resources over `routes` (QPs in INIT) and describes them in
  // local->links/qps/qpsPerLink (type and token are set by the caller).
  virtual ncclResult_t prepare(bool sender, const std::vector<Route>& routes, const ConnOptions& opts,
                               std::unique_ptr<PreparedConn>* out, HsMessage* local) = 0;
  // Moves the QPs through RTR to RTS against the peer's description. `reply`: on the accepting
  // side, the ACCEPT that prepare() described, to which activate may add what only the HELLO
  // decides (ECE); nullptr on the connecting side.
  virtual ncclResult_t activate(PreparedConn* conn, const HsMessage& remote, HsMessage* reply) = 0;
};

}  // namespace mesh
