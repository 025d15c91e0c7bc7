// SPDX-License-Identifier: Apache-2.0
// The live route-discovery service of the relay (issue 15): sends this node's HELLO
// (mesh/relay/relay_proto.h) on every mesh port every helloMs, feeds the HELLOs its neighbours
// send into a RouteTable (mesh/routing/routes.h), expires silent neighbours, and answers
// nextHops()/describe() from any thread. Owns: the UDP sockets, the route table, this node's
// view of the whole cabling and the route plan computed from it (issue 31,
// mesh/routing/topology_view.h) and the timer that drives them; nothing else (it neither
// forwards data nor opens relayed paths).
//
// The route plan: the HELLOs also flood every node's adjacency and plan digests. The plan is
// recomputed whenever the picture changes, and planNextHop() answers from it only while
// every node's view agrees with ours; otherwise relayed connects use the fallback rule
// (routes.h: fewer relays, node id, idle port). Logged at INFO: one line per new plan, one
// when views agree ("route plan in use"), and one when they have disagreed for two HELLO
// periods ("views disagree", naming the node and the digests); short disagreements while
// nodes start or a cable changes are not logged, only bridged by the fallback.
//
// Test-only: MESH_TEST_DROP_HELLOS_FROM=ADDR[,ADDR...] (read by routeServiceSettings): this
// process sends no HELLO from those local addresses, as if every one were lost on the way
// out (the fabric's view-disagreement test). Not a setting; never set it on a real job.
//
// Wire: UDP, one datagram per HELLO, port udpPort (NCCL_MESH_RELAY_PORT: the relay's TCP
// port number, on UDP).
//  - One receive socket on INADDR_ANY:udpPort with SO_REUSEADDR. NCCL runs one plugin
//    process per GPU and every one of them must hear every HELLO, so all of them bind the
//    same port; broadcast datagrams are delivered to every such socket (a unicast one only
//    to one of them, which is why HELLOs are never unicast on a real link).
//  - Per mesh address, one send socket bound to that address (so the datagram leaves on
//    that address's port and names it as its source) with SO_BROADCAST, sending to the
//    subnet's directed broadcast address for prefixes <= 30 and to 255.255.255.255 for /31
//    (no broadcast address: Linux sends a limited broadcast out of the device that holds
//    the socket's bound source address); nothing for /32 (no neighbour can share it).
//  - A datagram's receiving port is the local port whose subnet (longest prefix) contains
//    its source address; RouteTable::onHello then checks that the HELLO lists an address
//    on that link. Our own HELLOs (looped back, or sent by another process of this node,
//    which derives the same NodeId) are refused by the table and ignored silently.
//
// Threads: every public method may be called from any thread (stop() on the reactor
// thread closes inline instead of waiting for the reactor); start() and stop() must not
// race each other, nor stop() race Reactor::stop(). Sockets, the timer and the logging
// state belong to the reactor thread; the route table and the counters are shared,
// guarded by a mutex (Core::mutex).
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "err.h"
#include "mesh/config/config.h"
#include "mesh/connect/reactor.h"
#include "mesh/routing/route_plan.h"
#include "mesh/routing/routes.h"
#include "mesh/routing/subnet_routing.h"
#include "mesh/routing/topology_view.h"

namespace mesh {

// Stable across restarts and identical in every process of one node (so the processes'
// HELLOs count as the node's own): FNV-1a 64 over the sorted, de-duplicated (address,
// prefix) pairs of every port. Never 0 (0 is "no node").
NodeId nodeIdFromPorts(const std::vector<LocalNic>& ports);

// The test-only switch above: the addresses in MESH_TEST_DROP_HELLOS_FROM (comma-separated;
// what does not parse is skipped).
std::vector<uint32_t> parseDropHellosFrom(const char* text);

// Where the HELLOs sent from one local address go. The default (helloDestinations) is
// the broadcast rule above; unit tests, which cannot broadcast on loopback, replace it.
using HelloDestinations =
    std::function<std::vector<sockaddr_in>(const LocalNic& port, const LocalAddress& addr, int udpPort)>;
std::vector<sockaddr_in> helloDestinations(const LocalNic& port, const LocalAddress& addr, int udpPort);

struct RouteServiceSettings {
  int udpPort = 41517;          // Config::relayPort; 0 = any free port (tests), see udpPort()
  int helloMs = 1000;           // period of HELLOs on each port (and of the expiry check)
  RouteSettings routes;         // maxHops from Config::relayMaxHops, holdMs = 4 * helloMs
  std::vector<StaticRoute> statics;
  // Called on the reactor thread before every send, with the service's bound port.
  HelloDestinations destinations = helloDestinations;
  std::vector<uint32_t> dropHellosFrom;  // test-only: local addresses that send no HELLO
};

// The settings a plugin process uses: NCCL_MESH_RELAY_PORT, _MAX_HOPS, NCCL_MESH_ROUTES,
// HELLOs every second, a neighbour gone after 4 silent periods.
RouteServiceSettings routeServiceSettings(const Config& config);

// What the service did, for tests and the admin tool. Monotonic counters.
struct RouteServiceCounters {
  uint64_t hellosSent = 0;      // datagrams sendto() accepted
  uint64_t hellosAccepted = 0;  // HELLOs the table took (neighbours' periodic ones included)
  uint64_t refused = 0;         // HELLOs the table refused, our own excepted
  uint64_t malformed = 0;       // datagrams from a mesh link that do not parse as a HELLO
  uint64_t foreign = 0;         // datagrams from an address on none of our links
};

class RouteService {
 public:
  RouteService(Reactor* reactor, std::vector<LocalNic> ports, RouteServiceSettings s);
  ~RouteService();  // stop()
  RouteService(const RouteService&) = delete;
  RouteService& operator=(const RouteService&) = delete;

  // Any thread; the reactor must be running. Opens the sockets (here, so that a port
  // already taken is reported to the caller), then hands them to the reactor, which sends
  // a HELLO on every port at once and then every helloMs. A second call does nothing.
  ncclResult_t start();
  // Idempotent. Closes the sockets on the reactor and waits (bounded) for that; the timer
  // stops at its next tick. Safe when the reactor has already stopped.
  void stop();

  NodeId self() const { return self_; }
  // The UDP port HELLOs are received on (the bound one when udpPort was 0); 0 before start.
  int udpPort() const;
  NextHopResult nextHops(const std::vector<HandleAddress>& peer) const;
  std::vector<std::string> describe() const;
  // The route plan: the neighbour through which this node forwards the relayed pair
  // (origin, the node holding one of `target`'s addresses) by the plan, origin 0 meaning
  // this node; this node's own plan for (self, target) when it is not on the pair's path.
  // 0 while views disagree, or when the plan has no path for it: the caller then uses the
  // fallback rule.
  NodeId planNextHop(NodeId origin, const std::vector<HandleAddress>& target) const;
  RoutePlan plan() const;
  PlanAgreement agreement() const;
  PlanAgreement closure() const;  // TopologyView::closure() as of the last change
  // Whether a relayed connect may pick its path now: views agree and the picture is closed,
  // or the picture (plan, agreement, closure) has stayed as it is for two HELLO periods (a
  // cable whose far end runs no plugin process leaves it open for good). A path picked from
  // a picture without a node still starting detours round it for the connection's life, so
  // relayed connects wait for this, bounded (RelayConnectSettings::settleMs).
  bool settled() const;
  std::vector<TopologyRecord> records() const;
  size_t neighbourCount() const;
  std::vector<NeighbourLink> neighbours() const;
  RouteServiceCounters counters() const;

  struct Core;  // the state the reactor's handlers share (defined in route_service.cpp)

 private:
  Reactor* reactor_;
  NodeId self_;
  // Shared with the handlers and the timer on the reactor, so that one still queued when
  // this object goes finds its state alive (it then sees `stopped` and does nothing).
  std::shared_ptr<Core> core_;
};

}  // namespace mesh
