// SPDX-License-Identifier: Apache-2.0
// The relay's control plane (issue 15; docs/relay.md).
//
// RelayService (every plugin process with NCCL_MESH_RELAY=auto; the one that binds the relay
// port on the node's mesh addresses serves): one thread, "mesh-relay", that
//  - accepts RELAY-OPEN requests on NCCL_MESH_RELAY_PORT (TCP, mesh addresses only),
//  - builds the two halves of a relayed connection: connects to C's listener as an
//    ordinary sender (RelayFwdComm; C's accept is unchanged), then answers A with the
//    handle of a one-shot listener for the leg (RelayLegComm) and accepts A there,
//  - runs every RelayLink: polls both legs' completions and FIFOs, spinning while data
//    moves and backing off to 1 ms sleeps after 50 ms without work,
//  - tears a link down at the first error on either leg (both comms closed, both control
//    sockets closed: A and C see their peer gone and fail with ncclRemoteError).
// The staging rings of all links and pending opens are capped by NCCL_MESH_RELAY_MEM; an
// open beyond it is refused (NoMemory), never queued.
//
// RelayConnector (A's side of one connect with no shared subnet): driven from NCCL's
// connect() calls, never blocking: asks each candidate next hop in turn (preferred first,
// from the route table) over TCP, then connects to the leg handle of the first that says
// yes. Errors from every candidate are collected for its owner's one log line naming the
// path (TwinConnector for a connection of this process, the relay service for a hop it
// forwards).
//
// Lifetime: the service is created by Plugin::init and stopped (thread joined, links
// closed) by Plugin::shutdown. A node that served a relayed connection pins the library
// (RTLD_NODELETE) at that moment, so NCCL's dlclose at the end of the node's own
// communicators does not end other nodes' connections through it; the service then runs
// until the process exits.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "err.h"
#include "mesh/config/config.h"
#include "mesh/connect/handshake.h"
#include "mesh/datapath/comm.h"
#include "mesh/relay/relay_link.h"
#include "mesh/relay/relay_proto.h"
#include "mesh/routing/routes.h"
#include "mesh/wire/handle_codec.h"

namespace mesh {

struct RelaySettings {
  int port = 41517;
  int maxHops = 2;
  RelayGeometry geometry;
  size_t memCap = size_t{1} << 30;
  int timeoutMs = 30000;  // one OPEN, from the request to the leg accepted
  // Connections that have not yet sent a whole RELAY-OPEN; beyond it the oldest is closed
  // (as the handshake's listener does: a scanner cannot grow memory, a real request, sent
  // at once, is not locked out).
  size_t maxPending = 256;
};

RelaySettings relaySettingsFrom(const Config& config);

// Builds the relay's comm kinds instead of the plain ones.
class RelayTransport : public RdmaTransport {
 public:
  RelayTransport(const Discovery* disc, CommSettings settings, RelayGeometry geometry)
      : RdmaTransport(disc, settings), geometry_(geometry) {}

 protected:
  std::unique_ptr<Comm> makeComm(bool sender) const override;

 private:
  RelayGeometry geometry_;
};

struct RelayConnectSettings {
  int port = 41517;
  int maxHops = 2;        // the OPEN's hop budget: relays that may still forward
  int timeoutMs = 30000;  // per candidate next hop
  // When the whole connect fails, whatever is still pending (a relay asked last may not have
  // answered yet); the epoch: no such end (a relay's onward connect, bounded by its session).
  // Only TwinConnector sets it, to twice timeoutMs after the connect began (so the failure's
  // text says): one silent relay may cost a timeout, the next way gets the other.
  std::chrono::steady_clock::time_point endBy{};
  NodeId self = 0;
  NodeId origin = 0;            // a relay forwarding an OPEN: the node that asked first
  uint32_t originAddr = 0;      // ... and its address, for the last relay's HELLO to C
  std::vector<NodeId> visited;  // relays already on the path (loop guard)
  // How long the connect may wait for the route picture to settle (RouteService::settled)
  // before it picks a path; capped at half of timeoutMs.
  int settleMs = 5000;
};

// The neighbours that may relay to `peer` for the pair (origin, peer), preferred first (the
// route plan's, then the fallback rule's), leaving out those in `exclude`. With `mayWait`,
// none while the route picture has not settled (RouteService::settled): the caller asks again.
using RelayLookup = std::function<std::vector<NextHop>(const std::vector<HandleAddress>& peer, NodeId origin,
                                                       const std::vector<NodeId>& exclude, bool mayWait)>;

class RelayService {
 public:
  // `lookup`: next hops for an OPEN whose target is not cabled to this node (a path of
  // several relays: this relay asks the next one as A asked us). `atExit`: registered with
  // atexit() at the first relayed link (the owner's shutdown, see pinLibrary()).
  RelayService(const Discovery* disc, Reactor* reactor, CommSettings comm, HandshakeSettings hs, RelaySettings s,
               NodeId self, RelayLookup lookup, void (*atExit)() = nullptr);
  ~RelayService();
  ncclResult_t start();
  void stop();  // idempotent; joins the thread, closes every link and pending open
  // Process exit, from the library destructor: the verbs provider may already be finalized
  // (it was loaded after us, so its destructors ran first). Joins the thread and leaves
  // every verbs object to the kernel; A and C see the sockets close.
  void abandon();

  size_t liveLinks() const { return liveLinks_.load(std::memory_order_relaxed); }
  size_t ringBytesInUse() const { return memUsed_.load(std::memory_order_relaxed); }
  bool serving() const { return serving_.load(std::memory_order_relaxed); }

 private:
  struct Session;
  void run();
  void bindListeners(std::vector<int>* fds);
  void acceptSessions(int fd);
  bool stepSession(Session& s);  // false: the session is over
  // One round over the sessions, ending finished ones; true if any ended. `readingOnly`:
  // just those still reading their OPEN, each read whether or not poll() saw it readable.
  bool stepSessions(bool readingOnly);
  void makeRoom();  // at most maxPending - 1 sessions still reading their OPEN
  static bool testSilent();
  void replyError(Session& s, RelayStatus status, const std::string& reason);
  void endLink(std::unique_ptr<RelayLink> link, const std::string& why);
  bool stepLinks();  // one round over the links, ending failed ones; true if any moved
  void pinLibrary();

  const Discovery* disc_;
  Reactor* reactor_;
  RelaySettings settings_;
  NodeId self_;
  RelayLookup lookup_;
  void (*atExit_)() = nullptr;
  std::unique_ptr<RelayTransport> transport_;
  std::unique_ptr<Handshaker> hs_;
  std::vector<LocalNic> nics_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> liveLinks_{0};
  std::atomic<size_t> memUsed_{0};
  bool memCapWarned_ = false;  // relay thread only
  std::atomic<bool> serving_{false};
  std::atomic<bool> abandon_{false};
  // Relay thread only:
  std::vector<std::unique_ptr<Session>> sessions_;
  std::vector<std::unique_ptr<RelayLink>> links_;
  std::vector<int> listenFds_;  // bound by start(), then the thread's
  bool pinned_ = false;  // by start(), before the thread
  bool exitHandlerSet_ = false;
  uint64_t relayedTotal_ = 0;
  uint64_t evicted_ = 0;  // sessions closed by makeRoom()
};

// The address a relayed connection's counters name a node by (the live counters: a sender's
// `peer`, a receiver's and a relay's `from`, a relay's `peer`): the lowest address of its
// listen handle, which is also the lowest of the node's mesh addresses it connects from. Both
// ends and every relay then name one node alike, whichever cable a leg takes. 0: none.
uint32_t nodeAddress(const std::vector<HandleAddress>& handleAddrs);
uint32_t nodeAddress(const std::vector<LocalNic>& nics);

class RelayConnector {
 public:
  // `lookup` gives the candidate next hops, preferred first; while it has none (the route
  // service has not heard the neighbours yet: they may start later than we do), it is asked
  // again on every poll until the connect timeout. Its argument (`mayWait`) is true for the
  // first settleMs: it may then answer none while the route picture settles.
  using Lookup = std::function<std::vector<NextHop>(bool mayWait)>;
  RelayConnector(Handshaker* hs, std::vector<LocalNic> nics, Handle target, Lookup lookup, ConnOptions opts,
                 RelayConnectSettings s);
  ~RelayConnector();
  // nullptr while pending; the SendComm (towards the relay) when done; an error when no
  // candidate relayed. It logs neither: what the connection is (one of this process's own, a
  // leg of a two-relay one, a hop a relay forwards for another node) is its owner's to say
  // (TwinConnector, the relay service), from the accessors below.
  ncclResult_t poll(std::unique_ptr<PreparedConn>* out);
  // What the connection goes through, for the log: "198.18.0.2"; after a failure, the last
  // relay asked ("?" when there was none).
  std::string via() const;
  // Why that relay: "route plan" or "fallback rule" (the candidate's source).
  std::string rule() const;
  // The target's addresses, for the log: "198.18.0.9,198.18.1.9".
  std::string targetText() const;
  // Every path tried and why it failed, for the failure's log line: "; via A: why; via B: why"
  // ("" when none was).
  std::string tried() const;
  // The address of the relay the connection goes through (0 before one answered).
  uint32_t viaAddr() const;
  const Handle& target() const { return target_; }

 private:
  enum class State { Start, Connecting, Sending, Reading, Leg, Failed };
  void nextCandidate(const std::string& why);
  ncclResult_t stepCandidate();
  // `t`, or settings_.endBy when that comes first.
  std::chrono::steady_clock::time_point capped(std::chrono::steady_clock::time_point t) const;
  bool pastEnd(std::chrono::steady_clock::time_point now) const;  // settings_.endBy is set and here
  std::string endText() const;  // what settings_.endBy is, for tried()

  Handshaker* hs_;
  std::vector<LocalNic> nics_;
  Handle target_;
  Lookup lookup_;
  std::vector<NextHop> candidates_;
  std::chrono::steady_clock::time_point routeDeadline_;
  std::chrono::steady_clock::time_point settleUntil_;  // lookups may wait for the picture until then
  std::chrono::steady_clock::time_point retryAt_;
  ConnOptions opts_;
  RelayConnectSettings settings_;
  size_t index_ = 0;
  State state_ = State::Start;
  int fd_ = -1;
  std::vector<uint8_t> out_, in_;
  size_t sent_ = 0;
  uint64_t request_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::shared_ptr<Connector> leg_;
  std::vector<std::string> tried_;
  size_t memRefusals_ = 0;  // candidates of this round that answered NoMemory
};

}  // namespace mesh
