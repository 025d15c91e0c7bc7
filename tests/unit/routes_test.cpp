// SPDX-License-Identifier: Apache-2.0
#include "mesh/relay/relay_proto.h"
#include "mesh/routing/routes.h"

#include "lab_topology.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>

namespace mesh {
namespace {

// A simulated mesh in the lab's addressing (lab_topology.h). HELLOs are delivered in
// rounds, every live link both ways, until no table changes.
using lab::Link;
using lab::linkAddr;
using lab::linkSubnet;

// Node ids are deliberately not in node order, so tie-breaks by id and by index differ.
NodeId nodeId(int node) { return 0x1000 + static_cast<NodeId>((node * 7) % 11); }

class Mesh {
 public:
  Mesh(int nodes, std::vector<Link> links, RouteSettings settings = {},
       std::vector<std::vector<StaticRoute>> statics = {})
      : links_(std::move(links)), down_(links_.size(), false) {
    statics.resize(nodes);
    for (int n = 0; n < nodes; ++n) tables_.emplace_back(nodeId(n), ports(n), settings, statics[n]);
  }

  std::vector<LocalNic> ports(int node) const { return lab::nodeNics(links_, node); }
  int portOf(int node, int linkId) const { return lab::nicOnLink(links_, node, linkId); }

  // One round: every node sends its HELLO on every live port (all computed before any is
  // delivered). Returns whether any table changed.
  bool round() {
    struct Delivery {
      int node;
      int port;
      NodeHello hello;
    };
    std::vector<Delivery> deliveries;
    for (size_t i = 0; i < links_.size(); ++i) {
      if (down_[i]) continue;
      const Link& l = links_[i];
      deliveries.push_back({l.b, portOf(l.b, l.id), tables_[l.a].helloFor(portOf(l.a, l.id))});
      deliveries.push_back({l.a, portOf(l.a, l.id), tables_[l.b].helloFor(portOf(l.b, l.id))});
    }
    bool changed = false;
    for (Delivery& d : deliveries) {
      if (overTheWire_) d.hello = throughTheWire(d.hello);
      std::vector<RelayRoute> before = tables_[d.node].routes();
      std::string why;
      EXPECT_TRUE(tables_[d.node].onHello(d.port, d.hello, now_, &why)) << why;
      changed = changed || !sameRoutes(before, tables_[d.node].routes());
    }
    now_ += 1000;
    return changed;
  }

  // Every HELLO is encoded and parsed by the relay codec on its way (relay_proto.h).
  void overTheWire() { overTheWire_ = true; }
  static NodeHello throughTheWire(const NodeHello& hello) {
    RelayMessage msg;
    msg.type = RelayType::Hello;
    msg.hello = hello;
    std::vector<uint8_t> bytes;
    std::string error;
    EXPECT_TRUE(encodeRelay(msg, &bytes, &error)) << error;
    RelayMessage parsed;
    EXPECT_TRUE(parseRelay(bytes.data(), bytes.size(), &parsed, &error)) << error;
    return parsed.hello;
  }

  int converge() {
    int rounds = 0;
    while (round()) {
      ++rounds;
      if (rounds > 64) {
        ADD_FAILURE() << "no convergence in 64 rounds";
        break;
      }
    }
    return rounds;
  }

  void cut(int linkId) {
    for (size_t i = 0; i < links_.size(); ++i) {
      if (links_[i].id != linkId) continue;
      down_[i] = true;
      tables_[links_[i].a].portDown(portOf(links_[i].a, linkId));
      tables_[links_[i].b].portDown(portOf(links_[i].b, linkId));
    }
  }

  static bool sameRoutes(const std::vector<RelayRoute>& x, const std::vector<RelayRoute>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (!(x[i].subnet == y[i].subnet) || x[i].hops != y[i].hops || x[i].source != y[i].source ||
          x[i].localPort != y[i].localPort || x[i].nextHop != y[i].nextHop ||
          x[i].nextHopAddr != y[i].nextHopAddr) {
        return false;
      }
    }
    return true;
  }

  RouteTable& table(int node) { return tables_[node]; }
  const std::vector<Link>& links() const { return links_; }
  std::vector<HandleAddress> handle(int node) const { return lab::nodeHandle(links_, node); }

 private:
  std::vector<Link> links_;
  std::vector<bool> down_;
  std::vector<RouteTable> tables_;
  uint64_t now_ = 0;
  bool overTheWire_ = false;
};

std::vector<Link> ring(int n) {
  std::vector<Link> links;
  for (int i = 0; i < n; ++i) links.push_back({i, std::min(i, (i + 1) % n), std::max(i, (i + 1) % n)});
  return links;
}

std::vector<Link> line(int n) {
  std::vector<Link> links;
  for (int i = 0; i + 1 < n; ++i) links.push_back({i, i, i + 1});
  return links;
}

// Breadth-first distances over the live links: the reference the tables must match.
std::vector<int> distances(int nodes, const std::vector<Link>& links, int from) {
  std::vector<int> d(nodes, 1 << 20);
  std::deque<int> queue = {from};
  d[from] = 0;
  while (!queue.empty()) {
    int n = queue.front();
    queue.pop_front();
    for (const Link& l : links) {
      int other = l.a == n ? l.b : (l.b == n ? l.a : -1);
      if (other >= 0 && d[other] > d[n] + 1) {
        d[other] = d[n] + 1;
        queue.push_back(other);
      }
    }
  }
  return d;
}

// Checks every node's table against the reference: subnet of link L at hops = distance to
// its nearer end (absent beyond maxHops); the next hop is the neighbour on a shortest path
// with the lowest node id, then the lowest port.
void expectShortestPaths(Mesh& mesh, int nodes, int maxHops) {
  const std::vector<Link>& links = mesh.links();
  std::vector<std::vector<int>> dist;
  for (int n = 0; n < nodes; ++n) dist.push_back(distances(nodes, links, n));
  for (int self = 0; self < nodes; ++self) {
    const std::vector<RelayRoute>& routes = mesh.table(self).routes();
    size_t expected = 0;
    for (const Link& target : links) {
      int hops = std::min(dist[self][target.a], dist[self][target.b]);
      auto it = std::find_if(routes.begin(), routes.end(),
                             [&](const RelayRoute& r) { return r.subnet == linkSubnet(target.id); });
      if (hops > maxHops) {
        EXPECT_TRUE(it == routes.end()) << "node " << self << " link " << target.id;
        continue;
      }
      ++expected;
      ASSERT_TRUE(it != routes.end()) << "node " << self << " has no route to link " << target.id;
      EXPECT_EQ(it->hops, hops) << "node " << self << " link " << target.id;
      if (hops == 0) {
        EXPECT_EQ(it->source, RouteSource::Attached);
        continue;
      }
      EXPECT_EQ(it->source, RouteSource::Learned);
      // The preferred neighbour: (node id, port) lowest among those one hop closer.
      std::pair<NodeId, int> want{~NodeId{0}, 1 << 20};
      uint32_t wantAddr = 0;
      for (const Link& l : links) {
        int other = l.a == self ? l.b : (l.b == self ? l.a : -1);
        if (other < 0 || std::min(dist[other][target.a], dist[other][target.b]) != hops - 1) continue;
        std::pair<NodeId, int> key{nodeId(other), mesh.portOf(self, l.id)};
        if (key < want) {
          want = key;
          wantAddr = linkAddr(l.id, other);
        }
      }
      EXPECT_EQ(it->nextHop, want.first) << "node " << self << " link " << target.id;
      EXPECT_EQ(it->localPort, want.second) << "node " << self << " link " << target.id;
      EXPECT_EQ(it->nextHopAddr, wantAddr) << "node " << self << " link " << target.id;
    }
    EXPECT_EQ(routes.size(), expected) << "node " << self;
  }
}

TEST(Routes, Ring4Ring5Ring6ConvergeToShortestPaths) {
  for (int n : {4, 5, 6}) {
    SCOPED_TRACE("ring " + std::to_string(n));
    RouteSettings s;
    s.maxHops = 8;
    Mesh mesh(n, ring(n), s);
    int rounds = mesh.converge();
    EXPECT_LE(rounds, n);
    expectShortestPaths(mesh, n, s.maxHops);
  }
}

TEST(Routes, HellosThroughTheRelayCodecGiveTheSameTables) {
  for (bool poison : {false, true}) {
    RouteSettings s;
    s.maxHops = 4;
    s.poisonReverse = poison;
    Mesh direct(6, ring(6), s);
    direct.converge();
    Mesh wired(6, ring(6), s);
    wired.overTheWire();
    wired.converge();
    for (int n = 0; n < 6; ++n) {
      EXPECT_TRUE(Mesh::sameRoutes(wired.table(n).routes(), direct.table(n).routes())) << n;
    }
  }
}

TEST(Routes, AHelloKeepsTheNearestRoutesWhenTheyDoNotAllFit) {
  // A neighbour on port 0 advertises more subnets than one HELLO carries, at hops 0..3;
  // what this node sends on port 1 keeps the nearest ones and still encodes.
  std::vector<Link> links = {{0, 0, 1}, {1, 0, 2}};
  RouteSettings s;
  s.maxHops = 5;
  RouteTable t(nodeId(0), lab::nodeNics(links, 0), s);
  NodeHello h;
  h.node = nodeId(1);
  h.addrs = {{linkAddr(0, 1), 24}};
  for (uint32_t i = 0; i < 250; ++i) {
    h.routes.push_back({{0xC6140000u | i << 8, 24}, static_cast<uint8_t>(3 - i % 4)});  // 198.20.i.0/24
  }
  std::string why;
  ASSERT_TRUE(t.onHello(0, h, 0, &why)) << why;
  ASSERT_EQ(t.routes().size(), 252u);
  NodeHello out = t.helloFor(1);
  ASSERT_EQ(out.routes.size(), kHelloMaxRoutes);
  int farthest = 0;
  size_t atFour = 0;
  for (const RouteAdvert& a : out.routes) {
    farthest = std::max<int>(farthest, a.hops);
    if (a.hops == 4) ++atFour;
  }
  EXPECT_EQ(farthest, 4);
  EXPECT_EQ(atFour, kHelloMaxRoutes - 2 - 3 * 62u - 1) << "2 attached, 62 or 63 at each of hops 1..3";
  EXPECT_EQ(Mesh::throughTheWire(out).routes.size(), kHelloMaxRoutes);
}

TEST(Routes, Line4ReachesBothEndsAndMaxHopsCapsTheTable) {
  for (int maxHops : {1, 2, 3}) {
    SCOPED_TRACE("maxHops " + std::to_string(maxHops));
    RouteSettings s;
    s.maxHops = maxHops;
    Mesh mesh(4, line(4), s);
    mesh.converge();
    expectShortestPaths(mesh, 4, maxHops);
  }
}

TEST(Routes, IrregularPartialMeshWithParallelLinks) {
  // 0=1 (two cables), 1-2, 2-3, 3-4, 1-4, 0-5; 5 hangs off 0.
  std::vector<Link> links = {{0, 0, 1}, {1, 0, 1}, {2, 1, 2}, {3, 2, 3}, {4, 3, 4}, {5, 1, 4}, {6, 0, 5}};
  RouteSettings s;
  s.maxHops = 6;
  Mesh mesh(6, links, s);
  mesh.converge();
  expectShortestPaths(mesh, 6, s.maxHops);
  // Node 5 reaches node 3 through 0, 1 and then 2 or 4: three relays either way.
  NextHopResult r = mesh.table(5).nextHops(mesh.handle(3));
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.hops[0].route.hops, 3);
  EXPECT_EQ(r.hops[0].route.nextHop, nodeId(0));
  // Node 2 reaches 0-1 subnets through 1; the two parallel cables give two distinct
  // subnets, both via node 1 on one port: one way.
  NextHopResult toZero = mesh.table(2).nextHops(mesh.handle(0));
  ASSERT_TRUE(toZero.ok()) << toZero.error;
  EXPECT_EQ(toZero.hops[0].route.nextHop, nodeId(1));
  EXPECT_EQ(toZero.hops[0].peerAddr, linkAddr(0, 0)) << "equal ways: the lowest peer address";
}

TEST(Routes, RingDiagonalHasTwoWaysPreferredByNodeId) {
  Mesh mesh(4, ring(4));
  mesh.converge();
  // Node 0's neighbours are 1 (id 0x1007) and 3 (id 0x100a): both reach node 2 in one hop.
  NextHopResult r = mesh.table(0).nextHops(mesh.handle(2));
  ASSERT_EQ(r.hops.size(), 2u) << r.error;
  EXPECT_EQ(r.hops[0].route.hops, 1);
  EXPECT_EQ(r.hops[0].route.nextHop, nodeId(1));
  EXPECT_EQ(r.hops[0].peerAddr, linkAddr(1, 2));
  EXPECT_EQ(r.hops[1].route.nextHop, nodeId(3));
  EXPECT_EQ(r.hops[1].peerAddr, linkAddr(2, 2));
  // A neighbour is directly cabled: hops 0 comes first.
  NextHopResult direct = mesh.table(0).nextHops(mesh.handle(1));
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(direct.hops[0].route.hops, 0);
  EXPECT_EQ(direct.hops[0].route.source, RouteSource::Attached);
}

// NCCL's ring in cable order 0 -> 1 -> 2 -> 3 -> 0 loads node 0's port towards 1; node 0's
// relayed connects then leave on the other cable, in the direction the ring leaves idle.
TEST(Routes, RelayedConnectsPreferThePortWithFewerSendsAmongEquallyShortWays) {
  Mesh mesh(4, ring(4));
  mesh.converge();
  std::vector<NextHop> hops = mesh.table(0).nextHops(mesh.handle(2)).hops;
  ASSERT_EQ(hops.size(), 2u);
  const int toOne = hops[0].route.localPort, toThree = hops[1].route.localPort;
  ASSERT_EQ(hops[0].route.nextHop, nodeId(1));
  std::map<int, int> sends;
  auto load = [&sends](int port) { return sends[port]; };

  std::vector<NextHop> idle = hops;
  preferIdlePorts(&idle, load);
  EXPECT_EQ(idle[0].route.nextHop, nodeId(1)) << "no sends anywhere: the table's order";

  sends[toOne] = 2;  // the ring's sends to node 1
  std::vector<NextHop> loaded = hops;
  preferIdlePorts(&loaded, load);
  EXPECT_EQ(loaded[0].route.nextHop, nodeId(3));
  EXPECT_EQ(loaded[1].route.nextHop, nodeId(1));

  sends[toThree] = 2;  // equal again: the table's order
  std::vector<NextHop> equal = hops;
  preferIdlePorts(&equal, load);
  EXPECT_EQ(equal[0].route.nextHop, nodeId(1));
}

TEST(Routes, FewerRelaysStillWinOverAnIdlePort) {
  auto way = [](int port, int hops) {
    NextHop h;
    h.route.localPort = port;
    h.route.hops = hops;
    h.route.nextHopAddr = 0xc6120000u + static_cast<uint32_t>(port);
    return h;
  };
  std::vector<NextHop> hops{way(0, 1), way(1, 3), way(2, 1)};
  std::map<int, int> sends{{0, 5}, {1, 0}, {2, 1}};
  preferIdlePorts(&hops, [&sends](int port) { return sends[port]; });
  ASSERT_EQ(hops.size(), 3u);
  EXPECT_EQ(hops[0].route.localPort, 2) << "one relay, fewer sends";
  EXPECT_EQ(hops[1].route.localPort, 0) << "one relay, busier";
  EXPECT_EQ(hops[2].route.localPort, 1) << "three relays: last, however idle";
}

TEST(Routes, ThePlannedNeighbourGoesFirstOrIsAddedFromItsLinks) {
  auto hop = [](int port, NodeId node, uint32_t addr) {
    NextHop h;
    h.peerAddr = 0xC6120203u;
    h.route.hops = 1;
    h.route.source = RouteSource::Learned;
    h.route.localPort = port;
    h.route.nextHop = node;
    h.route.nextHopAddr = addr;
    return h;
  };
  std::vector<NextHop> hops{hop(0, 0x11, 0xC6120002u), hop(1, 0x22, 0xC6120102u), hop(2, 0x33, 0xC6120402u)};
  std::vector<NextHop> same = hops;
  preferPlannedHop(&same, 0, 0xC6120203u, {});
  EXPECT_EQ(same.size(), 3u);
  EXPECT_FALSE(same[0].planned);
  preferPlannedHop(&hops, 0x22, 0xC6120203u, {});
  ASSERT_EQ(hops.size(), 3u);
  EXPECT_EQ(hops[0].route.nextHop, 0x22u);
  EXPECT_TRUE(hops[0].planned);
  EXPECT_EQ(hops[1].route.nextHop, 0x11u);  // the others keep their order
  EXPECT_EQ(hops[2].route.nextHop, 0x33u);
  EXPECT_FALSE(hops[1].planned);
  // The distance vector chose other neighbours: the planned one is asked through its links.
  std::vector<NextHop> other{hop(0, 0x11, 0xC6120002u)};
  preferPlannedHop(&other, 0x44, 0xC6120203u,
                   {{0, 0x11, 0xC6120002u}, {3, 0x44, 0xC6120502u}, {4, 0x44, 0xC6120602u}});
  ASSERT_EQ(other.size(), 3u);
  EXPECT_EQ(other[0].route.nextHopAddr, 0xC6120502u);
  EXPECT_EQ(other[0].route.localPort, 3);
  EXPECT_EQ(other[1].route.nextHopAddr, 0xC6120602u);
  EXPECT_TRUE(other[0].planned && other[1].planned);
  EXPECT_EQ(other[0].peerAddr, 0xC6120203u);
  EXPECT_EQ(other[2].route.nextHop, 0x11u);
}

TEST(Routes, TableDoesNotDependOnTheOrderHellosArrive) {
  Mesh reference(5, ring(5));
  reference.converge();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 10; ++trial) {
    Mesh mesh(5, ring(5));
    // Deliver single HELLOs in random order until quiet, instead of rounds.
    std::vector<Link> links = ring(5);
    for (int step = 0; step < 400; ++step) {
      const Link& l = links[rng() % links.size()];
      bool forward = rng() % 2 == 0;
      int from = forward ? l.a : l.b;
      int to = forward ? l.b : l.a;
      std::string why;
      ASSERT_TRUE(mesh.table(to).onHello(mesh.portOf(to, l.id),
                                         mesh.table(from).helloFor(mesh.portOf(from, l.id)), 0, &why));
    }
    mesh.converge();
    for (int n = 0; n < 5; ++n) {
      EXPECT_TRUE(Mesh::sameRoutes(mesh.table(n).routes(), reference.table(n).routes())) << trial << "/" << n;
    }
  }
}

TEST(Routes, ConvergesAfterALinkGoesAwayToWhatAFreshMeshComputes) {
  for (int n : {4, 5, 6}) {
    SCOPED_TRACE("ring " + std::to_string(n));
    for (bool poison : {false, true}) {
      RouteSettings s;
      s.maxHops = 4;
      s.poisonReverse = poison;
      Mesh mesh(n, ring(n), s);
      mesh.converge();
      mesh.cut(n - 1);  // the wrap edge: the ring becomes line n (same ids and addresses)
      int rounds = mesh.converge();
      EXPECT_LE(rounds, s.maxHops + n) << "bounded by max hops, no count to infinity";
      std::vector<Link> remaining = ring(n);
      remaining.pop_back();
      Mesh fresh(n, remaining, s);
      fresh.converge();
      for (int node = 0; node < n; ++node) {
        EXPECT_TRUE(Mesh::sameRoutes(mesh.table(node).routes(), fresh.table(node).routes()))
            << "node " << node << (poison ? " poisoned reverse" : " split horizon");
      }
    }
  }
}

TEST(Routes, SplitHorizonOmitsAndPoisonedReverseWithdrawsRoutesBackToTheirNextHop) {
  for (bool poison : {false, true}) {
    RouteSettings s;
    s.poisonReverse = poison;
    Mesh mesh(3, line(3), s);
    mesh.converge();
    // Node 0 learned link 1 (between 1 and 2) from node 1 on its port 0.
    NodeHello back = mesh.table(0).helloFor(0);
    EXPECT_EQ(back.node, nodeId(0));
    ASSERT_EQ(back.addrs.size(), 1u);
    auto it = std::find_if(back.routes.begin(), back.routes.end(),
                           [](const RouteAdvert& a) { return a.subnet == linkSubnet(1); });
    if (poison) {
      ASSERT_TRUE(it != back.routes.end());
      EXPECT_EQ(it->hops, kRouteHopsUnreachable);
    } else {
      EXPECT_TRUE(it == back.routes.end());
    }
    ASSERT_FALSE(back.routes.empty());
    EXPECT_EQ(back.routes[0], (RouteAdvert{linkSubnet(0), 0}));
  }
}

TEST(Routes, NeighboursAndTheirRoutesExpireUnlessHeardAgain) {
  RouteSettings s;
  s.holdMs = 3000;
  std::vector<LocalNic> ports = Mesh(2, line(2)).ports(0);
  RouteTable t(nodeId(0), ports, s);
  NodeHello h;
  h.node = nodeId(1);
  h.addrs = {{linkAddr(0, 1), 24}, {0xC6120902u, 24}};
  h.routes = {{linkSubnet(0), 0}, {linkSubnet(9), 0}};
  std::string why;
  ASSERT_TRUE(t.onHello(0, h, 1000, &why)) << why;
  ASSERT_EQ(t.routes().size(), 2u);
  EXPECT_FALSE(t.expire(4000));
  ASSERT_TRUE(t.onHello(0, h, 3500, &why));
  EXPECT_FALSE(t.expire(6500));
  EXPECT_EQ(t.routes().size(), 2u);
  EXPECT_TRUE(t.expire(6501));
  EXPECT_EQ(t.neighbourCount(), 0u);
  ASSERT_EQ(t.routes().size(), 1u);
  EXPECT_EQ(t.routes()[0].source, RouteSource::Attached);
  // A HELLO that drops a route withdraws it at once.
  ASSERT_TRUE(t.onHello(0, h, 7000, &why));
  h.routes.pop_back();
  ASSERT_TRUE(t.onHello(0, h, 7100, &why));
  EXPECT_EQ(t.routes().size(), 1u);
}

TEST(Routes, ANeighbourComesFromAHelloOnTheLinkNeverFromAnAddressAlone) {
  std::vector<LocalNic> ports = Mesh(2, line(2)).ports(0);  // 198.18.0.1/24 on port 0
  RouteTable t(nodeId(0), ports, {});
  // No HELLO yet: a peer on the next /24 over is not reachable, however close it looks.
  NextHopResult none = t.nextHops({{0xC6120102u, 24, 0}});
  EXPECT_FALSE(none.ok());
  EXPECT_NE(none.error.find("no route to the peer (198.18.1.2/24) within 2 relay hop(s); 0 neighbour(s)"),
            std::string::npos)
      << none.error;
  NodeHello h;
  h.node = nodeId(1);
  h.addrs = {{0xC6120502u, 24}};  // not on the port's subnet
  h.routes = {{linkSubnet(1), 0}};
  std::string why;
  EXPECT_FALSE(t.onHello(0, h, 0, &why));
  EXPECT_NE(why.find("none of its addresses (198.18.5.2/24) shares a subnet with rxe_l0:1 198.18.0.1/24"),
            std::string::npos)
      << why;
  h.addrs = {{0xC6120102u, 16}};  // its /16 holds our address, our /24 not its: one end only
  EXPECT_FALSE(t.onHello(0, h, 0, &why));
  h.addrs = {{0xC6120002u, 24}};
  h.node = nodeId(0);
  EXPECT_FALSE(t.onHello(0, h, 0, &why));
  EXPECT_NE(why.find("our own node id"), std::string::npos) << why;
  h.node = 0;
  EXPECT_FALSE(t.onHello(0, h, 0, &why));
  h.node = nodeId(1);
  EXPECT_FALSE(t.onHello(3, h, 0, &why));
  EXPECT_NE(why.find("no such local port"), std::string::npos) << why;
  EXPECT_TRUE(t.onHello(0, h, 0, &why)) << why;
  EXPECT_TRUE(t.nextHops({{0xC6120102u, 24, 0}}).ok());
}

// Any sender on a link can make up node ids: each new one was a neighbour entry (a HELLO's
// worth of memory, a recompute over all of them, a burst of HELLOs on every port) with no
// limit. A port holds kRouteMaxNeighboursPerPort; past that a new node is refused, the ones
// held are still refreshed, other ports are untouched, and room returns as they expire.
TEST(Routes, APortHoldsABoundedNumberOfNeighbours) {
  std::vector<LocalNic> ports = Mesh(3, line(3)).ports(1);  // node 1: ports 0 and 1
  ASSERT_EQ(ports.size(), 2u);
  RouteSettings s;
  RouteTable t(nodeId(1), ports, s);
  auto helloOn = [&](int port, NodeId node) {
    NodeHello h;
    h.node = node;
    uint32_t base = ports[port].addrs[0].ip.addr & 0xFFFFFF00u;
    h.addrs = {{base | 0x80u, 24}};
    return h;
  };
  std::string why;
  for (size_t i = 0; i < kRouteMaxNeighboursPerPort; ++i) {
    ASSERT_TRUE(t.onHello(0, helloOn(0, 0xA0000 + i), 0, &why)) << i << ": " << why;
  }
  EXPECT_EQ(t.neighbourCount(), kRouteMaxNeighboursPerPort);
  EXPECT_FALSE(t.onHello(0, helloOn(0, 0xB0000), 0, &why));
  EXPECT_NE(why.find("already holds 32 neighbours"), std::string::npos) << why;
  EXPECT_EQ(t.neighbourCount(), kRouteMaxNeighboursPerPort);
  EXPECT_TRUE(t.onHello(0, helloOn(0, 0xA0000), 10, &why)) << "a held neighbour is refreshed: " << why;
  EXPECT_TRUE(t.onHello(1, helloOn(1, nodeId(2)), 10, &why)) << "another port is not affected: " << why;
  EXPECT_TRUE(t.expire(10 + s.holdMs + 1));  // all but the refreshed ones go
  EXPECT_TRUE(t.onHello(0, helloOn(0, 0xB0000), 20, &why)) << why;
}

TEST(Routes, StaticRoutesOverrideTheSamePrefixAndMergeWithOthers) {
  // Line 0-1-2-3; node 0 has a static route for link 2 (which it also learns, 2 hops away)
  // and one for 198.20.0.0/16, which nobody advertises.
  std::vector<std::vector<StaticRoute>> statics(4);
  statics[0] = {{linkSubnet(2), linkAddr(0, 1)}, {{0xC6140000u, 16}, linkAddr(0, 1)}};
  RouteSettings s;
  s.maxHops = 3;
  Mesh mesh(4, line(4), s, statics);
  mesh.converge();
  RouteTable& t = mesh.table(0);
  EXPECT_TRUE(t.staticProblems().empty());
  const std::vector<RelayRoute>& routes = t.routes();
  ASSERT_EQ(routes.size(), 4u);
  EXPECT_EQ(routes[0].source, RouteSource::Attached);
  EXPECT_EQ(routes[1].source, RouteSource::Learned);  // link 1: learned at 1 hop
  EXPECT_EQ(routes[2].source, RouteSource::Static);   // link 2: learned at 2 hops, overridden
  EXPECT_EQ(routes[2].hops, 1);
  EXPECT_EQ(routes[2].nextHop, nodeId(1)) << "the static next hop is a neighbour we heard";
  EXPECT_EQ(routes[3].subnet, (Ipv4Prefix{0xC6140000u, 16}));
  // Static routes stay local: node 0 does not advertise them.
  for (const RouteAdvert& a : t.helloFor(0).routes) EXPECT_FALSE(a.subnet == (Ipv4Prefix{0xC6140000u, 16}));
  // A learned /24 beats a static /16 that covers it.
  std::vector<std::vector<StaticRoute>> wide(4);
  wide[0] = {{{0xC6120000u, 16}, linkAddr(0, 1)}};
  Mesh merged(4, line(4), s, wide);
  merged.converge();
  NextHopResult r = merged.table(0).nextHops({{linkAddr(2, 3), 24, 1}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.hops[0].route.source, RouteSource::Learned);
  EXPECT_EQ(r.hops[0].route.hops, 2);
  NextHopResult unseen = merged.table(0).nextHops({{0xC6122A02u, 24, 0}});  // 198.18.42.2
  ASSERT_TRUE(unseen.ok());
  EXPECT_EQ(unseen.hops[0].route.source, RouteSource::Static);
}

TEST(Routes, StaticRoutesWorkWithoutHellosAndRefuseWhatCannotBeUsed) {
  std::vector<LocalNic> ports = Mesh(2, line(2)).ports(0);  // 198.18.0.1/24
  std::vector<StaticRoute> statics = {{linkSubnet(1), linkAddr(0, 1)},
                                      {linkSubnet(0), linkAddr(0, 1)},
                                      {linkSubnet(3), 0xC6120701u},
                                      {linkSubnet(4), linkAddr(0, 0)}};
  RouteTable t(nodeId(0), ports, {}, statics);
  ASSERT_EQ(t.staticProblems().size(), 3u);
  EXPECT_EQ(t.staticProblems()[0],
            "NCCL_MESH_ROUTES 198.18.0.0/24=198.18.0.2: the destination is one of this node's own "
            "links; ignored");
  EXPECT_EQ(t.staticProblems()[1],
            "NCCL_MESH_ROUTES 198.18.3.0/24=198.18.7.1: the next hop is on none of this node's "
            "links (rxe_l0:1 198.18.0.1/24); ignored");
  EXPECT_EQ(t.staticProblems()[2],
            "NCCL_MESH_ROUTES 198.18.4.0/24=198.18.0.1: the next hop is this node's own address; ignored");
  NextHopResult r = t.nextHops({{linkAddr(1, 2), 24, 0}});
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.hops[0].route.nextHopAddr, linkAddr(0, 1));
  EXPECT_EQ(r.hops[0].route.nextHop, 0u) << "not heard from: no node id";
  EXPECT_EQ(r.hops[0].route.localPort, 0);
  std::vector<std::string> lines = t.describe();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "198.18.0.0/24 attached hops 0 on rxe_l0:1");
  EXPECT_EQ(lines[1], "198.18.1.0/24 static hops 1 on rxe_l0:1 via 198.18.0.2");
}

TEST(Routes, DescribeNamesTheNextHopNode) {
  Mesh mesh(3, line(3));
  mesh.converge();
  std::vector<std::string> lines = mesh.table(0).describe();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], "198.18.1.0/24 learned hops 1 on rxe_l0:1 via 198.18.0.2 (node 0000000000001007)");
}

// --- NCCL_MESH_ROUTES -------------------------------------------------------------------

TEST(StaticRoutesSyntax, ParsesEntriesWithEitherSeparatorAndSpaces) {
  std::vector<StaticRoute> routes;
  std::string error;
  ASSERT_TRUE(parseStaticRoutes(" 198.18.2.0/24 = 198.18.0.2 ;198.18.3.0/24=198.18.1.2,0.0.0.0/0=198.18.1.2",
                                &routes, &error))
      << error;
  ASSERT_EQ(routes.size(), 3u);
  EXPECT_EQ(routes[0], (StaticRoute{{0xC6120200u, 24}, 0xC6120002u}));
  EXPECT_EQ(routes[2].dest.prefixLen, 0);
  EXPECT_EQ(formatStaticRoutes(routes), "198.18.2.0/24=198.18.0.2,198.18.3.0/24=198.18.1.2,0.0.0.0/0=198.18.1.2");
  std::vector<StaticRoute> again;
  ASSERT_TRUE(parseStaticRoutes(formatStaticRoutes(routes), &again, &error));
  EXPECT_EQ(again, routes);
  ASSERT_TRUE(parseStaticRoutes("   ", &again, &error));
  EXPECT_TRUE(again.empty());
}

TEST(StaticRoutesSyntax, BadValuesAreRefusedWithTheEntryAndTheFix) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"198.18.2.0/24", "entry 1 '198.18.2.0/24': no '='; write DEST/LEN=NEXTHOP, e.g. 198.18.2.0/24=198.18.0.2"},
      {"198.18.2.0=198.18.0.2", "the destination '198.18.2.0' needs a prefix length, e.g. 198.18.2.0/24"},
      {"198.18.2.0/33=198.18.0.2", "'198.18.2.0/33' is not an IPv4 prefix"},
      {"198.18.2.5/24=198.18.0.2", "has host bits set; did you mean 198.18.2.0/24?"},
      {"198.18.2.0/24=198.18.0.2/24", "the next hop '198.18.0.2/24' must be a plain address"},
      {"198.18.2.0/24=198.18.0", "the next hop '198.18.0' is not an IPv4 address"},
      {"198.18.2.0/24=", "the next hop '' is not an IPv4 address"},
      {"198.18.2.0/24=198.18.0.2,,198.18.3.0/24=198.18.0.2", "entry 2 is empty"},
      {"198.18.2.0/24=198.18.0.2,", "entry 2 is empty"},
      {"198.18.2.0/24=198.18.0.2;198.18.2.0/24=198.18.1.2", "the destination 198.18.2.0/24 appears twice (entries 1 and 2); keep one"},
      {"via 198.18.0.2", "no '='"},
  };
  for (const auto& [text, want] : cases) {
    std::vector<StaticRoute> routes = {{{0xC6120000u, 24}, 1}};
    std::string error;
    EXPECT_FALSE(parseStaticRoutes(text, &routes, &error)) << text;
    EXPECT_NE(error.find(want), std::string::npos) << text << " -> " << error;
    EXPECT_EQ(routes.size(), 1u) << "left unchanged: " << text;
  }
  std::string many;
  for (int i = 0; i < 65; ++i) many += (i ? "," : "") + std::string("198.18.") + std::to_string(i) + ".0/24=198.19.0.1";
  std::vector<StaticRoute> routes;
  std::string error;
  EXPECT_FALSE(parseStaticRoutes(many, &routes, &error));
  EXPECT_EQ(error, "65 entries; at most 64");
}

}  // namespace
}  // namespace mesh
