// SPDX-License-Identifier: Apache-2.0
// A node's view of the cabling (topology_view.h): records flood in rounds of simulated
// HELLOs until every node holds every record and the same plan; a HELLO lost one way, a
// stale record, a stopped node and an overflowing one each show as a disagreement.
#include "mesh/routing/topology_view.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

namespace mesh {
namespace {

constexpr uint64_t kHoldMs = 4000;

NodeId id(int node) { return 0x9000 + static_cast<NodeId>((node * 5) % 11); }  // not in cable order

Ipv4Prefix addr(int link, int end) {
  return Ipv4Prefix{(198u << 24) | (18u << 16) | (static_cast<uint32_t>(link) << 8) | static_cast<uint32_t>(end + 1), 24};
}

// Nodes on cables; each round every node sends its HELLO's topology to each neighbour that
// hears it (drop: (from, to) pairs whose HELLOs are lost), and then updates its own record
// from who it heard.
class Cluster {
 public:
  Cluster(int nodes, std::vector<std::pair<int, int>> cables, int maxHops = 2) : cables_(std::move(cables)) {
    for (int n = 0; n < nodes; ++n) views_.push_back(std::make_unique<TopologyView>(id(n), maxHops, kHoldMs));
    heard_.resize(static_cast<size_t>(nodes));
  }

  TopologyView& view(int n) { return *views_[static_cast<size_t>(n)]; }

  void drop(int from, int to) { dropped_.insert({from, to}); }
  void stop(int n) { stopped_.insert(n); }
  void start(int n) { stopped_.erase(n); }

  // One round at now_; returns whether any view's content changed.
  bool round() {
    bool changed = false;
    for (size_t n = 0; n < views_.size(); ++n) {
      std::vector<Ipv4Prefix> addrs;
      for (size_t l = 0; l < cables_.size(); ++l) {
        if (cables_[l].first == static_cast<int>(n)) addrs.push_back(addr(static_cast<int>(l), 0));
        if (cables_[l].second == static_cast<int>(n)) addrs.push_back(addr(static_cast<int>(l), 1));
      }
      std::vector<NodeId> heard(heard_[n].begin(), heard_[n].end());
      changed = views_[n]->setOwn(addrs, heard) || changed;
    }
    std::vector<std::tuple<int, int, HelloTopology>> sent;
    ++seq_;  // one number per sender and round, as the route service numbers one burst
    for (const auto& [a, b] : cables_) {
      for (auto [from, to] : {std::make_pair(a, b), std::make_pair(b, a)}) {
        if (stopped_.count(from) || dropped_.count({from, to})) continue;
        sent.emplace_back(from, to, view(from).advertise(seq_));
      }
    }
    for (auto& [from, to, t] : sent) {
      heard_[static_cast<size_t>(to)].insert(id(from));
      changed = view(to).onHello(id(from), t, now_) || changed;
    }
    for (auto& v : views_) changed = v->expire(now_) || changed;
    now_ += 1000;
    return changed;
  }

  int converge(int limit = 20) {
    int rounds = 0;
    while (round() && ++rounds < limit) {
    }
    round();  // the digests of the last change travel once more
    round();
    return rounds;
  }

  // A node that stopped is no longer heard: its neighbours forget it after kHoldMs.
  void forgetSilent(int n) {
    for (auto& h : heard_) h.erase(id(n));
  }

  uint64_t now() const { return now_; }

 private:
  std::vector<std::pair<int, int>> cables_;
  std::vector<std::unique_ptr<TopologyView>> views_;
  std::vector<std::set<NodeId>> heard_;
  std::set<std::pair<int, int>> dropped_;
  std::set<int> stopped_;
  uint64_t now_ = 1000;
  uint64_t seq_ = 0;
};

std::vector<std::pair<int, int>> ring(int n) {
  std::vector<std::pair<int, int>> c;
  for (int i = 0; i < n; ++i) c.push_back({i, (i + 1) % n});
  return c;
}

TEST(TopologyView, ARingOfFourConvergesToOnePlanEverywhere) {
  Cluster c(4, ring(4));
  EXPECT_LT(c.converge(), 20);
  for (int n = 0; n < 4; ++n) {
    SCOPED_TRACE("node " + std::to_string(n));
    EXPECT_EQ(c.view(n).plan().nodes.size(), 4u);
    EXPECT_EQ(c.view(n).plan().tableDigest, c.view(0).plan().tableDigest);
    EXPECT_EQ(c.view(n).plan().paths.size(), 4u);
    PlanAgreement a = c.view(n).agreement();
    EXPECT_TRUE(a.agree) << a.why;
    EXPECT_EQ(c.view(n).records().size(), 4u);
  }
}

TEST(TopologyView, AConvergedRingIsClosed) {
  Cluster c(4, ring(4));
  c.converge();
  for (int n = 0; n < 4; ++n) {
    PlanAgreement closed = c.view(n).closure();
    EXPECT_TRUE(closed.agree) << closed.why;
    EXPECT_EQ(closed.node, 0u);
  }
}

// The start-up bug of lab_e2e_relay_ring5: the other four nodes agree on a line while node 1
// is still starting, and that plan sends 0 -> 2 through 4 and 3. The picture is open (nodes 0
// and 2 have a cable to nobody heard), which is what makes a relayed connect wait; once node
// 1 is heard it closes and 0 -> 2 goes through node 1.
TEST(TopologyView, ARingWithANodeNotYetHeardAgreesButIsOpen) {
  Cluster c(5, ring(5));
  c.stop(1);
  c.converge();
  for (int n : {0, 2, 3, 4}) {
    SCOPED_TRACE("node " + std::to_string(n));
    EXPECT_EQ(c.view(n).plan().nodes.size(), 4u);
    PlanAgreement a = c.view(n).agreement();
    EXPECT_TRUE(a.agree) << a.why;
    PlanAgreement closed = c.view(n).closure();
    EXPECT_FALSE(closed.agree);
    EXPECT_TRUE(closed.node == id(0) || closed.node == id(2)) << closed.why;
    EXPECT_NE(closed.why.find("leads to no node heard"), std::string::npos) << closed.why;
  }
  const RoutePlan& before = c.view(0).plan();
  EXPECT_EQ(before.nextHop(id(0), id(0), id(2)), id(4));  // the detour a connect made now would keep
  c.start(1);
  c.converge();
  for (int n = 0; n < 5; ++n) {
    SCOPED_TRACE("node " + std::to_string(n));
    EXPECT_TRUE(c.view(n).agreement().agree) << c.view(n).agreement().why;
    EXPECT_TRUE(c.view(n).closure().agree) << c.view(n).closure().why;
  }
  EXPECT_EQ(c.view(0).plan().nextHop(id(0), id(0), id(2)), id(1));
}

TEST(TopologyView, AnEightRingLearnsNodesFourCablesAway) {
  Cluster c(8, ring(8), 3);
  c.converge();
  for (int n = 0; n < 8; ++n) {
    EXPECT_EQ(c.view(n).plan().nodes.size(), 8u);
    EXPECT_EQ(c.view(n).plan().tableDigest, c.view(0).plan().tableDigest);
    EXPECT_TRUE(c.view(n).agreement().agree) << c.view(n).agreement().why;
  }
  EXPECT_EQ(c.view(0).plan().maxRelayed(), 7);
  EXPECT_EQ(c.view(0).plan().minRelayed(), 7);
}

TEST(TopologyView, HellosLostOneWayAreADisagreementNamingBothNodes) {
  Cluster c(4, ring(4));
  c.drop(0, 1);  // node 1 never hears node 0 on their cable; node 0's record still floods round
  c.converge();
  for (int n = 0; n < 4; ++n) {
    SCOPED_TRACE("node " + std::to_string(n));
    EXPECT_EQ(c.view(n).plan().tableDigest, c.view(0).plan().tableDigest);  // the same picture...
    PlanAgreement a = c.view(n).agreement();
    EXPECT_FALSE(a.agree);  // ...with a cable heard from one end only
    EXPECT_EQ(a.why, "node " + hex64(id(0)) + " hears node " + hex64(id(1)) + " but node " + hex64(id(1)) +
                         " does not hear node " + hex64(id(0)) + " (HELLOs lost one way, or a cable just cut)");
    EXPECT_EQ(a.node, id(1));
  }
}

TEST(TopologyView, DifferentDigestsAreADisagreementUntilTheyAgreeAgain) {
  Cluster c(4, ring(4));
  c.converge();
  // Node 2 announces another table (as with another NCCL_MESH_RELAY_MAX_HOPS), numbered
  // far ahead of its real records.
  TopologyRecord r;
  for (const TopologyRecord& x : c.view(0).records()) {
    if (x.origin == id(2)) r = x;
  }
  ASSERT_EQ(r.origin, id(2));
  r.seq = 1u << 30;
  r.tableDigest ^= 1;
  EXPECT_TRUE(c.view(0).onHello(id(1), HelloTopology{false, {r}}, c.now()));
  PlanAgreement a = c.view(0).agreement();
  EXPECT_FALSE(a.agree);
  EXPECT_EQ(a.node, id(2));
  EXPECT_EQ(a.why, "node " + hex64(id(2)) + " advertises topology " + hex64(r.topologyDigest) + " table " +
                       hex64(r.tableDigest) + ", this node has topology " + hex64(c.view(0).plan().topologyDigest) +
                       " table " + hex64(c.view(0).plan().tableDigest));
  // An older record changes nothing, even with the right digests.
  TopologyRecord older = r;
  older.seq = 5;
  older.tableDigest ^= 1;
  EXPECT_FALSE(c.view(0).onHello(id(1), HelloTopology{false, {older}}, c.now()));
  EXPECT_FALSE(c.view(0).agreement().agree);
  // Node 2's real records are numbered below the odd one (this test's clock is a counter):
  // they are refused while it is held and while its tombstone lasts (holdMs + 3 x holdMs).
  for (int i = 0; i < 24; ++i) c.round();
  EXPECT_TRUE(c.view(0).agreement().agree) << c.view(0).agreement().why;
}

TEST(TopologyView, RecordsAboutThisNodeAreIgnored) {
  Cluster c(3, ring(3));
  c.converge();
  TopologyRecord lie;
  lie.origin = id(0);
  lie.seq = ~0ull;
  lie.addrs = {addr(9, 0)};
  uint64_t before = c.view(0).plan().topologyDigest;
  EXPECT_FALSE(c.view(0).onHello(id(1), HelloTopology{false, {lie}}, c.now()));
  EXPECT_EQ(c.view(0).plan().topologyDigest, before);
}

TEST(TopologyView, AStoppedNodeIsForgottenAfterTheHoldTime) {
  Cluster c(4, ring(4));
  c.converge();
  c.stop(3);
  c.forgetSilent(3);
  // Its last record keeps circulating between the others, but never a newer one: gone after
  // holdMs (plus a round per cable it travelled), then the digests agree a round later.
  for (int i = 0; i < 8; ++i) c.round();
  for (int n = 0; n < 3; ++n) {
    SCOPED_TRACE("node " + std::to_string(n));
    EXPECT_EQ(c.view(n).plan().nodes.size(), 3u);
    EXPECT_EQ(c.view(n).plan().tableDigest, c.view(0).plan().tableDigest);
    EXPECT_TRUE(c.view(n).agreement().agree) << c.view(n).agreement().why;
    ASSERT_NE(c.view(n).plan().find(id(0), id(2)), nullptr);  // the line 2-1-0 that is left
    EXPECT_EQ(c.view(n).plan().find(id(0), id(2))->relays, (std::vector<NodeId>{id(1)}));
  }
}

TEST(TopologyView, AnOverflowingSenderTurnsThePlanOffUntilItStops) {
  Cluster c(3, ring(3));
  c.converge();
  EXPECT_TRUE(c.view(0).onHello(id(1), HelloTopology{true, {}}, c.now()));
  PlanAgreement a = c.view(0).agreement();
  EXPECT_FALSE(a.agree);
  EXPECT_EQ(a.node, id(1));
  EXPECT_EQ(a.why, "node " + hex64(id(1)) + "'s view does not fit one HELLO; the plan covers small clusters only");
  EXPECT_TRUE(c.view(0).expire(c.now() + kHoldMs + 1));
  c.converge();
  EXPECT_TRUE(c.view(0).agreement().agree) << c.view(0).agreement().why;

  c.view(2).setOwnOverflow(true);
  EXPECT_TRUE(c.view(2).advertise(1).overflow);
  EXPECT_TRUE(c.view(2).advertise(1).records.empty());
  EXPECT_FALSE(c.view(2).agreement().agree);
}

// Ring node k of n (ids 0xA000 + k): its cables k (end 0) and k - 1 (end 1), hearing k +- 1.
NodeId ringId(int k, int n) { return 0xA000 + static_cast<NodeId>((k + n) % n); }
TopologyRecord ringRecord(int k, int n, uint64_t seq) {
  TopologyRecord r;
  r.origin = ringId(k, n);
  r.seq = seq;
  r.addrs = {addr(k, 0), addr((k + n - 1) % n, 1)};
  r.neighbours = {ringId(k - 1, n), ringId(k + 1, n)};
  std::sort(r.neighbours.begin(), r.neighbours.end());
  return r;
}

// A ring of 16 is planned and advertised whole; a 17th node makes the view more than one
// HELLO carries: it goes out as overflow (the codec refuses 17 records, and a HELLO it
// refused was never sent: the node fell silent on every link) and it is not planned (a plan
// that cannot be used; a big view took seconds on the reactor thread).
TEST(TopologyView, AViewOfMoreNodesThanOneHelloCarriesIsOverflowAndNotPlanned) {
  for (int n : {16, 17}) {
    SCOPED_TRACE(n);
    TopologyView v(ringId(0, n), 15, kHoldMs);
    TopologyRecord own = ringRecord(0, n, 0);
    v.setOwn(own.addrs, own.neighbours);
    HelloTopology others;
    for (int k = 1; k < n; ++k) others.records.push_back(ringRecord(k, n, 1));
    v.onHello(ringId(1, n), others, 1000);
    EXPECT_EQ(v.plan().nodes.size(), static_cast<size_t>(n));
    HelloTopology t = v.advertise(2);
    if (n == 16) {
      EXPECT_TRUE(v.countsFit());
      EXPECT_FALSE(t.overflow);
      EXPECT_EQ(t.records.size(), 16u);
      EXPECT_FALSE(v.plan().paths.empty());  // a ring's far pairs are relayed
      continue;
    }
    EXPECT_FALSE(v.countsFit());
    EXPECT_TRUE(t.overflow);
    EXPECT_TRUE(t.records.empty());
    EXPECT_TRUE(v.plan().paths.empty());
    PlanAgreement a = v.agreement();
    EXPECT_FALSE(a.agree);
    EXPECT_EQ(a.node, v.self());
    EXPECT_NE(a.why.find("17 nodes, 2 heard by this node) is more than one HELLO carries (16 nodes"),
              std::string::npos) << a.why;
  }
}

// A dense 16-node picture (K8,8: every node of one half cabled to every node of the other)
// takes the planner 0.1-0.4 s. A sender on the link that changed one record with every
// datagram made the reactor thread plan for every datagram, holding the lock NCCL's
// threads read routes under. A change inside the gap after a plan waits; expire() plans it.
TEST(TopologyView, PlansComeAtMostOncePerGapAndAPutOffOneIsMadeLater) {
  auto node = [](int n) { return static_cast<NodeId>(0xC000 + n); };
  auto cable = [](int a, int b, int end) {  // a in 0..7, b in 8..15: cable 8a+b-8, /30 each
    uint32_t base = (198u << 24) | (18u << 16) | (static_cast<uint32_t>(8 * a + b - 8) << 2);
    return Ipv4Prefix{base + 1 + static_cast<uint32_t>(end), 30};
  };
  auto record = [&](int n, uint64_t seq, int leaveOut) {
    TopologyRecord r;
    r.origin = node(n);
    r.seq = seq;
    for (int m = (n < 8 ? 8 : 0); m < (n < 8 ? 16 : 8); ++m) {
      if (m == leaveOut) continue;
      r.addrs.push_back(n < 8 ? cable(n, m, 0) : cable(m, n, 1));
      r.neighbours.push_back(node(m));
    }
    return r;
  };
  TopologyView v(node(0), 2, /*holdMs=*/3600 * 1000);  // nothing expires however slow the planner
  TopologyRecord own = record(0, 0, -1);
  v.setOwn(own.addrs, own.neighbours);
  HelloTopology all;
  for (int n = 1; n < 16; ++n) all.records.push_back(record(n, 1, -1));
  v.onHello(node(8), all, 1000);
  ASSERT_EQ(v.plan().nodes.size(), 16u);
  uint64_t gap = v.planGapMs();
  ASSERT_GT(gap, 0u) << "the K8,8 plan took under a millisecond: nothing to put off here";
  std::vector<PlanNode> before = v.plan().nodes;

  // Node 9 loses its cable to node 7, at once after the plan: the change waits.
  HelloTopology change;
  change.records.push_back(record(9, 2, 7));
  EXPECT_TRUE(v.onHello(node(8), change, 1000)) << "the records changed (neighbours hear of it at once)";
  EXPECT_TRUE(v.planPending());
  EXPECT_EQ(v.plan().nodes, before) << "planned again inside the gap";
  EXPECT_FALSE(v.expire(1000 + gap - 1));
  EXPECT_TRUE(v.planPending());
  EXPECT_TRUE(v.expire(1000 + gap)) << "the gap has passed: the put-off plan is made";
  EXPECT_FALSE(v.planPending());
  EXPECT_NE(v.plan().nodes, before);
}

// A node that hears more nodes than one record may list (16 on one switch) sends its view as
// overflow rather than a record the codec refuses.
TEST(TopologyView, HearingMoreNodesThanARecordListsIsOverflow) {
  TopologyView v(0xB000, 2, kHoldMs);
  std::vector<NodeId> heard;
  for (NodeId i = 1; i <= kTopologyMaxNeighbours + 1; ++i) heard.push_back(0xB000 + i);
  v.setOwn({addr(0, 0)}, heard);
  EXPECT_FALSE(v.countsFit());
  EXPECT_TRUE(v.advertise(1).overflow);
  EXPECT_FALSE(v.agreement().agree);
  heard.pop_back();
  v.setOwn({addr(0, 0)}, heard);
  EXPECT_TRUE(v.countsFit());
  EXPECT_FALSE(v.advertise(2).overflow);
}

// However many origins the HELLOs name (a sender inventing them), at most kTopologyMaxHeld
// records are kept, and as many overflow marks.
TEST(TopologyView, RecordsAndOverflowMarksHeldAreBounded) {
  TopologyView v(0xC000, 2, kHoldMs);
  v.setOwn({addr(0, 0)}, {});
  for (int batch = 0; batch < 20; ++batch) {
    HelloTopology t;
    for (int i = 0; i < 16; ++i) {
      TopologyRecord r;
      r.origin = 0xD0000 + static_cast<NodeId>(batch * 16 + i);
      r.seq = 1;
      r.addrs = {addr(batch, i)};
      t.records.push_back(r);
    }
    v.onHello(0xE0000 + static_cast<NodeId>(batch), t, 1000);
  }
  EXPECT_EQ(v.records().size(), kTopologyMaxHeld + 1);  // the held ones and this node's own
  size_t changed = 0;
  for (NodeId sender = 1; sender <= 2 * kTopologyMaxHeld; ++sender) {
    changed += v.onHello(sender, HelloTopology{true, {}}, 1000) ? 1 : 0;
  }
  EXPECT_EQ(changed, kTopologyMaxHeld);  // a mark not kept is no change to announce at once
  EXPECT_FALSE(v.agreement().agree);
  EXPECT_TRUE(v.expire(1000 + kHoldMs + 1));  // every mark and record goes, none is left behind
  EXPECT_EQ(v.records().size(), 1u);
}

TEST(TopologyView, AdvertisesItsOwnRecordFirstWithTheCurrentDigests) {
  Cluster c(4, ring(4));
  c.converge();
  HelloTopology t = c.view(1).advertise(77);
  ASSERT_EQ(t.records.size(), 4u);
  EXPECT_EQ(t.records[0].origin, id(1));
  EXPECT_EQ(t.records[0].seq, 77u);
  EXPECT_EQ(t.records[0].tableDigest, c.view(1).plan().tableDigest);
  EXPECT_EQ(t.records[0].neighbours, (std::vector<NodeId>{std::min(id(0), id(2)), std::max(id(0), id(2))}));
  for (size_t i = 2; i < t.records.size(); ++i) EXPECT_LT(t.records[i - 1].origin, t.records[i].origin);
}

}  // namespace
}  // namespace mesh
