// SPDX-License-Identifier: Apache-2.0
// The relay's route plan (route_plan.h) on rings, lines and partial meshes: every cable
// direction's load is asserted as the rule promises, and the same cabling in any order
// gives the same table and digests.
#include "mesh/routing/route_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>

namespace mesh {
namespace {

// Node ids are deliberately not in ring order (position i gets id(i)), so a plan that
// followed positions instead of ids would show.
NodeId id(int position) { return 0x5000 + static_cast<NodeId>((position * 5) % 11); }

Ipv4Prefix addr(int link, int end) { return Ipv4Prefix{(198u << 24) | (18u << 16) | (static_cast<uint32_t>(link) << 8) | static_cast<uint32_t>(end + 1), 24}; }

// A cabling by positions: cables (a, b), ids from `ids` (position -> id).
std::vector<PlanNode> cabling(int nodes, const std::vector<std::pair<int, int>>& cables, const std::vector<NodeId>& ids) {
  std::vector<PlanNode> out(static_cast<size_t>(nodes));
  for (int i = 0; i < nodes; ++i) out[static_cast<size_t>(i)].id = ids[static_cast<size_t>(i)];
  for (size_t l = 0; l < cables.size(); ++l) {
    auto [a, b] = cables[l];
    out[static_cast<size_t>(a)].neighbours.push_back(ids[static_cast<size_t>(b)]);
    out[static_cast<size_t>(b)].neighbours.push_back(ids[static_cast<size_t>(a)]);
    out[static_cast<size_t>(a)].addrs.push_back(addr(static_cast<int>(l), 0));
    out[static_cast<size_t>(b)].addrs.push_back(addr(static_cast<int>(l), 1));
  }
  return out;
}

std::vector<NodeId> defaultIds(int nodes) {
  std::vector<NodeId> ids;
  for (int i = 0; i < nodes; ++i) ids.push_back(id(i));
  return ids;
}

std::vector<std::pair<int, int>> ringCables(int nodes) {
  std::vector<std::pair<int, int>> c;
  for (int i = 0; i < nodes; ++i) c.push_back({i, (i + 1) % nodes});
  return c;
}

std::vector<std::pair<int, int>> lineCables(int nodes) {
  std::vector<std::pair<int, int>> c;
  for (int i = 0; i + 1 < nodes; ++i) c.push_back({i, i + 1});
  return c;
}

std::vector<PlanNode> ring(int nodes, std::vector<NodeId> ids = {}) {
  return cabling(nodes, ringCables(nodes), ids.empty() ? defaultIds(nodes) : ids);
}

std::vector<PlanNode> line(int nodes) { return cabling(nodes, lineCables(nodes), defaultIds(nodes)); }

// Relayed pairs per directed edge, keyed by positions.
std::map<std::pair<int, int>, int> relayedByPosition(const RoutePlan& plan, const std::vector<NodeId>& ids) {
  auto pos = [&ids](NodeId n) { return static_cast<int>(std::find(ids.begin(), ids.end(), n) - ids.begin()); };
  std::map<std::pair<int, int>, int> out;
  for (const EdgeLoad& l : plan.loads) {
    EXPECT_EQ(l.direct, 1);
    out[{pos(l.from), pos(l.to)}] = l.relayed;
  }
  return out;
}

// Pairs each node relays.
std::map<NodeId, int> relaysPerNode(const RoutePlan& plan) {
  std::map<NodeId, int> out;
  for (const PlannedPath& p : plan.paths) {
    for (NodeId r : p.relays) ++out[r];
  }
  return out;
}

// Whether every path is a walk over cables from src to dst.
void expectPathsAreWalks(const RoutePlan& plan) {
  std::set<std::pair<NodeId, NodeId>> edges;
  for (const EdgeLoad& l : plan.loads) edges.insert({l.from, l.to});
  for (const PlannedPath& p : plan.paths) {
    std::vector<NodeId> walk{p.src};
    walk.insert(walk.end(), p.relays.begin(), p.relays.end());
    walk.push_back(p.dst);
    for (size_t i = 0; i + 1 < walk.size(); ++i) {
      EXPECT_TRUE(edges.count({walk[i], walk[i + 1]})) << hex64(p.src) << " -> " << hex64(p.dst);
    }
  }
}

// The loads the relayed pairs put on the cables, from the paths alone.
void expectLoadsMatchPaths(const RoutePlan& plan) {
  std::map<std::pair<NodeId, NodeId>, int> counted;
  for (const PlannedPath& p : plan.paths) {
    std::vector<NodeId> walk{p.src};
    walk.insert(walk.end(), p.relays.begin(), p.relays.end());
    walk.push_back(p.dst);
    for (size_t i = 0; i + 1 < walk.size(); ++i) ++counted[{walk[i], walk[i + 1]}];
  }
  for (const EdgeLoad& l : plan.loads) EXPECT_EQ(l.relayed, (counted[{l.from, l.to}]));
}

TEST(RoutePlan, Ring4AllToAllPutsOneRelayedPairOnEachOfTheEightDirectionsWhateverTheIds) {
  std::vector<NodeId> ids = defaultIds(4);
  std::sort(ids.begin(), ids.end());
  do {  // every labelling of the ring: the greedy pass alone fails on some (see route_plan.h)
    RoutePlan plan = planRoutes(ring(4, ids), 2);
    ASSERT_EQ(plan.paths.size(), 4u);
    ASSERT_EQ(plan.loads.size(), 8u);
    for (const EdgeLoad& l : plan.loads) {
      EXPECT_EQ(l.direct, 1);
      EXPECT_EQ(l.relayed, 1) << hex64(l.from) << " -> " << hex64(l.to);
    }
    for (const PlannedPath& p : plan.paths) EXPECT_EQ(p.relays.size(), 1u);
    std::map<NodeId, int> relays = relaysPerNode(plan);
    for (NodeId n : ids) EXPECT_EQ(relays[n], 1) << hex64(n);
    EXPECT_TRUE(plan.unreachable.empty());
    expectPathsAreWalks(plan);
  } while (std::next_permutation(ids.begin(), ids.end()));
}

TEST(RoutePlan, RingsOfThreeToEightCarryWhatTheRulePromises) {
  // nodes -> (relayed pairs per direction: least, most; how many directions carry the most)
  struct Want {
    int nodes, maxHops;
    size_t paths;
    int least, most, atMost;
  };
  for (Want w : {Want{3, 2, 0, 0, 0, 6}, Want{4, 2, 4, 1, 1, 8}, Want{5, 2, 10, 2, 2, 10}, Want{6, 2, 18, 3, 4, 6},
                 Want{7, 2, 28, 5, 5, 14}, Want{8, 3, 40, 7, 7, 16}}) {
    SCOPED_TRACE("ring of " + std::to_string(w.nodes));
    RoutePlan plan = planRoutes(ring(w.nodes), w.maxHops);
    EXPECT_EQ(plan.paths.size(), w.paths);
    EXPECT_TRUE(plan.unreachable.empty());
    ASSERT_EQ(plan.loads.size(), static_cast<size_t>(2 * w.nodes));
    EXPECT_EQ(plan.minRelayed(), w.least);
    EXPECT_EQ(plan.maxRelayed(), w.most);
    int atMost = 0;
    for (const EdgeLoad& l : plan.loads) atMost += l.relayed == w.most ? 1 : 0;
    EXPECT_EQ(atMost, w.atMost);
    // Every path is a shortest one: never more relays than half the ring.
    for (const PlannedPath& p : plan.paths) EXPECT_LE(p.relays.size(), static_cast<size_t>(w.nodes / 2 - 1));
    expectPathsAreWalks(plan);
    expectLoadsMatchPaths(plan);
    // Every relay node carries the same number of relayed pairs on a ring.
    std::map<NodeId, int> relays = relaysPerNode(plan);
    if (w.paths > 0) {
      auto [lo, hi] = std::minmax_element(relays.begin(), relays.end(),
                                          [](const auto& a, const auto& b) { return a.second < b.second; });
      EXPECT_EQ(lo->second, hi->second);
      EXPECT_EQ(relays.size(), static_cast<size_t>(w.nodes));
    }
  }
}

TEST(RoutePlan, EvenRingsBalanceUnderEveryLabelling) {
  for (int n : {6, 8}) {
    std::vector<NodeId> ids = defaultIds(n);
    std::sort(ids.begin(), ids.end());
    std::mt19937 rng(7);
    for (int trial = 0; trial < (n == 6 ? 120 : 60); ++trial) {
      std::shuffle(ids.begin(), ids.end(), rng);
      RoutePlan plan = planRoutes(ring(n, ids), n / 2 - 1);
      SCOPED_TRACE("ring of " + std::to_string(n) + ", trial " + std::to_string(trial));
      EXPECT_EQ(plan.minRelayed(), n == 6 ? 3 : 7);
      EXPECT_EQ(plan.maxRelayed(), n == 6 ? 4 : 7);
      EXPECT_LT(plan.searchSteps, kPlanSearchBudget);
    }
  }
}

TEST(RoutePlan, LinesRelayEverythingOverTheMiddle) {
  RoutePlan plan = planRoutes(line(4), 2);
  std::vector<NodeId> ids = defaultIds(4);
  // 0 -> 2 and 0 -> 3 cross 0 -> 1; 0 -> 2, 0 -> 3 and 1 -> 3 cross 1 -> 2; the same backwards.
  std::map<std::pair<int, int>, int> want{{{0, 1}, 2}, {{1, 2}, 3}, {{2, 3}, 2},
                                          {{1, 0}, 2}, {{2, 1}, 3}, {{3, 2}, 2}};
  EXPECT_EQ(relayedByPosition(plan, ids), want);
  ASSERT_NE(plan.find(ids[0], ids[3]), nullptr);
  EXPECT_EQ(plan.find(ids[0], ids[3])->relays, (std::vector<NodeId>{ids[1], ids[2]}));
  EXPECT_EQ(plan.find(ids[3], ids[0])->relays, (std::vector<NodeId>{ids[2], ids[1]}));
  EXPECT_EQ(plan.find(ids[0], ids[1]), nullptr);  // cabled: not planned
  EXPECT_EQ(plan.paths.size(), 6u);
  EXPECT_TRUE(plan.unreachable.empty());

  RoutePlan five = planRoutes(line(5), 3);
  EXPECT_EQ(five.paths.size(), 12u);
  EXPECT_EQ(five.maxRelayed(), 5);  // 1 -> 2: from 0 or 1 to 2, 3 or 4, less the cabled 1 -> 2
}

TEST(RoutePlan, EveryRelayOnAPathForwardsToTheNextNodeOfTheOriginalPair) {
  std::vector<NodeId> ids = defaultIds(6);
  RoutePlan plan = planRoutes(ring(6), 2);
  for (const PlannedPath& p : plan.paths) {
    std::vector<NodeId> walk{p.src};
    walk.insert(walk.end(), p.relays.begin(), p.relays.end());
    walk.push_back(p.dst);
    for (size_t i = 0; i + 1 < walk.size(); ++i) EXPECT_EQ(plan.nextHop(walk[i], p.src, p.dst), walk[i + 1]);
  }
  // A node off the pair's path (the origin used the fallback rule) takes its own path.
  const PlannedPath* far = plan.find(ids[0], ids[3]);
  ASSERT_NE(far, nullptr);
  NodeId off = far->relays[0] == ids[1] ? ids[5] : ids[1];
  EXPECT_EQ(plan.nextHop(off, ids[0], ids[3]), plan.find(off, ids[3])->relays.front());
  EXPECT_EQ(plan.nextHop(ids[0], ids[0], ids[1]), 0u);  // cabled: no relay
  EXPECT_EQ(plan.nextHop(ids[0], ids[0], 0x1234), 0u);   // unknown node
}

TEST(RoutePlan, MaxHopsIsRespectedAndTheRestIsUnreachable) {
  RoutePlan plan = planRoutes(ring(8), 2);
  std::vector<NodeId> ids = defaultIds(8);
  EXPECT_EQ(plan.paths.size(), 32u);        // distance 2 and 3
  EXPECT_EQ(plan.unreachable.size(), 8u);   // the opposite nodes, both ways: 3 relays needed
  for (const PlannedPath& p : plan.paths) EXPECT_LE(p.relays.size(), 2u);
  for (int i = 0; i < 8; ++i) {
    std::pair<NodeId, NodeId> far{ids[static_cast<size_t>(i)], ids[static_cast<size_t>((i + 4) % 8)]};
    EXPECT_NE(std::find(plan.unreachable.begin(), plan.unreachable.end(), far), plan.unreachable.end());
  }
  RoutePlan oneHop = planRoutes(line(4), 1);
  EXPECT_EQ(oneHop.paths.size(), 4u);
  EXPECT_EQ(oneHop.unreachable, (std::vector<std::pair<NodeId, NodeId>>{
                                    std::minmax(ids[0], ids[3]), {std::max(ids[0], ids[3]), std::min(ids[0], ids[3])}}));
}

TEST(RoutePlan, DisconnectedNodesAreUnreachableNotPlanned) {
  // Two cables, 0-1 and 2-3: no way between the halves.
  std::vector<PlanNode> nodes = cabling(4, {{0, 1}, {2, 3}}, defaultIds(4));
  RoutePlan plan = planRoutes(nodes, 3);
  EXPECT_TRUE(plan.paths.empty());
  EXPECT_EQ(plan.unreachable.size(), 8u);
  EXPECT_EQ(plan.loads.size(), 4u);
}

TEST(RoutePlan, FullMeshOfFourMissingOneCableSplitsTheTwoWaysOverBothRelays) {
  // 0-1, 0-3, 1-2, 2-3, 1-3 cabled; 0-2 not.
  std::vector<NodeId> ids = defaultIds(4);
  RoutePlan plan = planRoutes(cabling(4, {{0, 1}, {0, 3}, {1, 2}, {2, 3}, {1, 3}}, ids), 2);
  ASSERT_EQ(plan.paths.size(), 2u);
  const PlannedPath* there = plan.find(ids[0], ids[2]);
  const PlannedPath* back = plan.find(ids[2], ids[0]);
  ASSERT_TRUE(there && back);
  ASSERT_EQ(there->relays.size(), 1u);
  ASSERT_EQ(back->relays.size(), 1u);
  EXPECT_NE(there->relays[0], back->relays[0]);  // one relayed pair per relay node
  std::map<std::pair<int, int>, int> relayed = relayedByPosition(plan, ids);
  int total = 0;
  for (const auto& [edge, n] : relayed) {
    EXPECT_LE(n, 1);
    total += n;
  }
  EXPECT_EQ(total, 4);
  EXPECT_EQ(relayed[std::make_pair(1, 3)] + relayed[std::make_pair(3, 1)], 0);  // the 1-3 cable relays nothing
}

TEST(RoutePlan, ACableHeardFromOneEndOnlyIsNotPlannedOver) {
  // A 4-ring whose cable 3-0 was cut: node 0 still lists 3 (not expired yet), 3 no longer
  // lists 0. The plan is the line's 0-1-2-3.
  std::vector<NodeId> ids = defaultIds(4);
  std::vector<PlanNode> cut = ring(4);
  auto& three = cut[3].neighbours;
  three.erase(std::remove(three.begin(), three.end(), ids[0]), three.end());
  RoutePlan plan = planRoutes(cut, 2);
  RoutePlan asLine = planRoutes(line(4), 2);
  ASSERT_EQ(plan.paths.size(), asLine.paths.size());
  for (size_t i = 0; i < plan.paths.size(); ++i) {
    EXPECT_EQ(plan.paths[i].src, asLine.paths[i].src);
    EXPECT_EQ(plan.paths[i].relays, asLine.paths[i].relays);
  }
  EXPECT_NE(plan.topologyDigest, asLine.topologyDigest);  // the pictures differ (node 0 still lists 3)
  EXPECT_EQ(plan.find(ids[0], ids[3])->relays, (std::vector<NodeId>{ids[1], ids[2]}));
}

TEST(RoutePlan, TheSameCablingInAnyOrderGivesTheSameTableAndDigests) {
  std::vector<PlanNode> base = cabling(6, {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 0}, {0, 3}}, defaultIds(6));
  RoutePlan want = planRoutes(base, 2);
  std::mt19937 rng(31);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<PlanNode> shuffled = base;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    for (PlanNode& n : shuffled) {
      std::shuffle(n.neighbours.begin(), n.neighbours.end(), rng);
      std::shuffle(n.addrs.begin(), n.addrs.end(), rng);
      if (trial % 3 == 0 && !n.neighbours.empty()) n.neighbours.push_back(n.neighbours.front());  // listed twice
    }
    RoutePlan got = planRoutes(shuffled, 2);
    EXPECT_EQ(got.topologyDigest, want.topologyDigest);
    EXPECT_EQ(got.tableDigest, want.tableDigest);
    EXPECT_EQ(got.describe(), want.describe());
  }
}

TEST(RoutePlan, DigestsTellDifferentPicturesAndSettingsApart) {
  RoutePlan a = planRoutes(ring(6), 2);
  std::vector<PlanNode> moved = ring(6);
  moved[2].addrs[0].addr += 100;  // one address differs: same paths, another picture
  RoutePlan b = planRoutes(moved, 2);
  EXPECT_NE(a.topologyDigest, b.topologyDigest);
  EXPECT_NE(a.tableDigest, b.tableDigest);
  RoutePlan c = planRoutes(ring(6), 3);  // another NCCL_MESH_RELAY_MAX_HOPS: same picture, another table
  EXPECT_EQ(a.topologyDigest, c.topologyDigest);
  EXPECT_NE(a.tableDigest, c.tableDigest);
}

TEST(RoutePlan, LooksUpNodesByAddressAndDescribesItself) {
  RoutePlan plan = planRoutes(ring(4), 2);
  std::vector<NodeId> ids = defaultIds(4);
  EXPECT_EQ(plan.nodeOf(addr(0, 0).addr), ids[0]);
  EXPECT_EQ(plan.nodeOf(addr(1, 1).addr), ids[2]);
  EXPECT_EQ(plan.nodeOf(0x01020304u), 0u);
  std::vector<std::string> lines = plan.describe();
  ASSERT_EQ(lines.size(), 1u + 4u + 8u);
  EXPECT_EQ(lines[0], "topology " + hex64(plan.topologyDigest) + " table " + hex64(plan.tableDigest) +
                          ": 4 node(s), 4 relayed pair(s), at most 2 relay(s) per path");
  EXPECT_EQ(lines[1].rfind("pair " + hex64(plan.paths[0].src) + " -> " + hex64(plan.paths[0].dst) + " via ", 0), 0u);
  EXPECT_EQ(lines[5].substr(lines[5].size() - 22), ": 1 direct + 1 relayed");
}

// Partial meshes: rings of 8 with up to 5 chords. Where many assignments tie the search may
// stop at its budget; it stops at the same place whatever the input order.
TEST(RoutePlan, PartialMeshesOfEightArePlannedTheSameFromAnyOrder) {
  std::mt19937 rng(5);
  int finished = 0;
  for (int trial = 0; trial < 24; ++trial) {
    std::vector<std::pair<int, int>> all;
    for (int a = 0; a < 8; ++a) {
      for (int b = a + 2; b < 8; ++b) all.push_back({a, b});
    }
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<std::pair<int, int>> cables = ringCables(8);
    for (size_t i = 0; i < static_cast<size_t>(trial % 6); ++i) cables.push_back(all[i]);
    std::vector<PlanNode> nodes = cabling(8, cables, defaultIds(8));
    RoutePlan plan = planRoutes(nodes, 3);
    SCOPED_TRACE("trial " + std::to_string(trial));
    EXPECT_TRUE(plan.unreachable.empty());
    expectPathsAreWalks(plan);
    expectLoadsMatchPaths(plan);
    finished += plan.searchSteps < kPlanSearchBudget ? 1 : 0;
    std::reverse(nodes.begin(), nodes.end());
    for (PlanNode& n : nodes) std::reverse(n.neighbours.begin(), n.neighbours.end());
    RoutePlan again = planRoutes(nodes, 3);
    EXPECT_EQ(again.tableDigest, plan.tableDigest);
    EXPECT_EQ(again.searchSteps, plan.searchSteps);
  }
  EXPECT_GE(finished, 20);
}

}  // namespace
}  // namespace mesh
