// SPDX-License-Identifier: Apache-2.0
// Route discovery for the relay (issue 15): which neighbour reaches which subnet, so that a
// connect to a peer with no shared cable can pick the neighbour that forwards for it.
// Pure code: no sockets, no clock, no logging. The time is passed in; HELLOs arrive as
// decoded values (the codec is mesh/relay/relay_proto.h); unit-tested on simulated topologies.
//
// Model
//  - A node owns its ports (LocalNic, the same list subnet routing uses) and a NodeId.
//  - A neighbour exists only because a HELLO from it arrived on one of our ports AND one of
//    the addresses it lists shares that port's subnet from both sides (as subnet routing's
//    pairMatches). An address that merely looks like our /24 never makes a neighbour.
//  - Metric: hops = the number of relay nodes between us and a node attached to the
//    subnet. Our own subnets are 0; a neighbour's own subnets 1; and so on. A route is kept
//    only while hops <= RouteSettings::maxHops; kRouteHopsUnreachable means withdrawn.
//  - Every HELLO carries the sender's whole distance vector (never a delta): a route missing
//    from the latest HELLO of a neighbour is withdrawn. The table is recomputed from the
//    latest HELLO of every live neighbour, so a lost link or neighbour leaves no stale state
//    beyond what the neighbours still claim; counting to infinity stops at maxHops.
//  - Split horizon: the vector sent on port p leaves out routes whose next hop is on p; with
//    poisonReverse they are sent as unreachable instead.
//  - Expiry: a neighbour not heard for holdMs is dropped with every route learned from it;
//    portDown() drops a port's neighbours at once.
//  - Static routes (NCCL_MESH_ROUTES) are local policy: an exact-prefix static route
//    overrides a learned one; other prefixes merge (a lookup takes the longest matching
//    prefix, so a learned /24 beats a static /16 for the addresses it covers). A subnet
//    attached to this node is never overridden. Static routes are not advertised.
//
// Tie-breaks (same inputs give the same table whatever the order they arrived in):
//  1. per subnet: fewer hops; then the lower next-hop NodeId; then the lower local port
//     index; then the lower next-hop address;
//  2. per peer (nextHops): longest matching prefix for each peer address; then fewer hops;
//     then the tie-break of 1; then the lower peer address; one entry per distinct
//     (local port, next-hop address), the preferred first;
//  3. at connect time (preferIdlePorts): among equally short ways, the local port with the
//     fewest of this process's send connections. This is the fallback rule: while every
//     node's view of the cabling agrees, the route plan (route_plan.h) names the neighbour
//     to ask first (preferPlannedHop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mesh/platform/ipv4.h"
#include "mesh/routing/subnet_routing.h"
#include "mesh/wire/handle_codec.h"

namespace mesh {

// A node's identity in HELLOs and tie-breaks; 0 is "no node". Stable across restarts is best
// (tie-breaks then pick the same relay every run): e.g. derived from the node's mesh addresses.
using NodeId = uint64_t;

constexpr int kRouteHopsUnreachable = 16;                 // "infinity" in a distance vector
constexpr int kRouteMaxHopsLimit = kRouteHopsUnreachable - 1;
constexpr size_t kHelloMaxAddresses = 32;   // addresses one HELLO lists
constexpr size_t kHelloMaxRoutes = 200;     // routes one HELLO carries (fits one 1500 B frame)
constexpr size_t kStaticRoutesMax = 64;     // entries in NCCL_MESH_ROUTES
// Neighbours one port holds at once: a HELLO from one more node is refused until one expires
// (the mesh is at most 16 nodes; senders on a link are not trusted to be few).
constexpr size_t kRouteMaxNeighboursPerPort = 32;

struct RouteAdvert {
  Ipv4Prefix subnet;  // network address: host bits zero
  uint8_t hops = 0;   // the advertiser's hops; kRouteHopsUnreachable = withdrawn
  bool operator==(const RouteAdvert& o) const { return subnet == o.subnet && hops == o.hops; }
};

// What one HELLO says, as decoded from the wire.
struct NodeHello {
  NodeId node = 0;
  std::vector<Ipv4Prefix> addrs;    // every mesh address of the sender, with its prefix
  std::vector<RouteAdvert> routes;  // the sender's vector for the link the HELLO crosses
};

// One entry of NCCL_MESH_ROUTES: reach dest through the neighbour at nextHop.
struct StaticRoute {
  Ipv4Prefix dest;       // network address: host bits zero
  uint32_t nextHop = 0;  // the neighbour's address on one of our links
  bool operator==(const StaticRoute& o) const { return dest == o.dest && nextHop == o.nextHop; }
};

// NCCL_MESH_ROUTES syntax: entries separated by ',' or ';', each DEST/LEN=NEXTHOP, spaces
// around tokens ignored, e.g. "198.18.2.0/24=198.18.0.2, 198.18.3.0/24=198.18.1.2".
// Empty text = no static routes. Rejects, with *error naming the entry and the fix (not the
// variable: callers name it): an
// empty entry, no '=', a destination without /LEN or with host bits set, a next hop with a
// prefix, a bad address, a destination given twice, more
// than kStaticRoutesMax entries. On failure *out is left unchanged.
bool parseStaticRoutes(const std::string& text, std::vector<StaticRoute>* out, std::string* error);
// The canonical text of routes (parseStaticRoutes reads it back to the same list).
std::string formatStaticRoutes(const std::vector<StaticRoute>& routes);

enum class RouteSource { Attached, Learned, Static };
const char* routeSourceName(RouteSource s);

struct RelayRoute {
  Ipv4Prefix subnet;
  int hops = 0;               // 0 attached; static routes count 1 (the distance beyond is unknown)
  RouteSource source = RouteSource::Attached;
  int localPort = -1;         // LocalNic::index of the port toward the subnet or next hop
  NodeId nextHop = 0;         // 0 when attached, or static with a next hop not heard from
  uint32_t nextHopAddr = 0;   // the next hop's address on that port's link; 0 when attached
};

struct RouteSettings {
  int maxHops = 2;             // 1..kRouteMaxHopsLimit
  uint64_t holdMs = 10000;     // a neighbour silent this long is gone
  bool poisonReverse = false;  // send split-horizon routes as unreachable instead of omitting
};

// A way to reach one peer: the route it takes and the peer address at the far end.
struct NextHop {
  uint32_t peerAddr = 0;
  RelayRoute route;
  bool planned = false;  // the route plan's choice (preferPlannedHop), not the fallback rule's
};

// A live neighbour, for logs ("neighbour node N on port P appeared/went").
struct NeighbourLink {
  int localPort = -1;     // LocalNic::index the HELLOs arrive on
  NodeId node = 0;
  uint32_t linkAddr = 0;  // its address on that port's link
  bool operator<(const NeighbourLink& o) const {
    return localPort != o.localPort ? localPort < o.localPort : node < o.node;
  }
};

struct NextHopResult {
  std::vector<NextHop> hops;  // preferred first; a hops==0 entry means directly cabled
  std::string error;          // set when hops is empty
  bool ok() const { return !hops.empty(); }
};

// Orders candidates (as nextHops returns them) for a relayed connect: fewer relays first;
// among those, the local port on which this process has the fewest send connections open
// (`sendsOnPort`); otherwise the order given. NCCL's ring, launched in cable order, sends on
// one cable direction of every node: this puts relayed traffic on the direction it leaves
// idle. Stable and deterministic for the same loads.
void preferIdlePorts(std::vector<NextHop>* hops, const std::function<int(int localPort)>& sendsOnPort);

// Puts the ways through neighbour `planned` (the route plan's next hop) first, marked
// planned, the others after them in the order given. When no candidate goes through it (the
// distance vector chose another neighbour for every address of the peer), one is made from
// each of `links` to that neighbour, reaching peerAddr, in the order of `links`.
// planned == 0: nothing changes.
void preferPlannedHop(std::vector<NextHop>* hops, NodeId planned, uint32_t peerAddr,
                      const std::vector<NeighbourLink>& links);

// One node's routing state. Not thread-safe: the owner (later the relay service's thread)
// serializes calls.
class RouteTable {
 public:
  RouteTable(NodeId self, std::vector<LocalNic> ports, RouteSettings settings,
             std::vector<StaticRoute> statics = {});

  // A HELLO arrived on localPort (a LocalNic::index) at nowMs. Returns false, with *why,
  // when it is refused: from ourselves or node 0, on an unknown port, or with no address
  // sharing the port's subnet, or from a new node when the port already holds
  // kRouteMaxNeighboursPerPort. Returns true when accepted (the table is then recomputed).
  bool onHello(int localPort, const NodeHello& hello, uint64_t nowMs, std::string* why);
  // The port went down: its neighbours and their routes go now, and its own subnets are no
  // longer attached (nor advertised) until portUp. HELLOs on a down port are refused.
  void portDown(int localPort);
  void portUp(int localPort);
  // Drops neighbours not heard since nowMs - holdMs. Returns whether any went.
  bool expire(uint64_t nowMs);

  // The HELLO to send on localPort: our addresses and our vector under split horizon,
  // nearest routes first when more than kHelloMaxRoutes would fit.
  NodeHello helloFor(int localPort) const;
  // Every route, by subnet (address, then prefix length).
  const std::vector<RelayRoute>& routes() const { return routes_; }
  // The ways to reach a peer whose listen handle lists `peer` (see the tie-breaks above).
  NextHopResult nextHops(const std::vector<HandleAddress>& peer) const;
  // Why static routes were ignored (next hop on no link of ours, destination is ours).
  const std::vector<std::string>& staticProblems() const { return staticProblems_; }
  // One line per route, for nccl-mesh-info --routes and logs.
  std::vector<std::string> describe() const;

  NodeId self() const { return self_; }
  size_t neighbourCount() const { return neighbours_.size(); }
  // Every live neighbour, by (local port, node).
  std::vector<NeighbourLink> neighbours() const;

 private:
  struct Neighbour {
    NodeHello hello;
    uint32_t linkAddr = 0;  // its address on our port's link
    uint64_t heardMs = 0;
  };
  struct ResolvedStatic {
    StaticRoute route;
    int localPort = -1;
  };
  void resolveStatics(const std::vector<StaticRoute>& statics);
  // Erases the neighbours `gone` picks; returns whether it erased any (no recompute).
  bool dropNeighbours(const std::function<bool(int port, const Neighbour& n)>& gone);
  void recompute();
  const LocalNic* port(int index) const;

  NodeId self_;
  std::vector<LocalNic> ports_;
  RouteSettings settings_;
  std::vector<ResolvedStatic> statics_;
  std::vector<std::string> staticProblems_;
  std::map<std::pair<int, NodeId>, Neighbour> neighbours_;  // by (local port, node)
  std::set<int> downPorts_;
  std::vector<RelayRoute> routes_;
};

}  // namespace mesh
