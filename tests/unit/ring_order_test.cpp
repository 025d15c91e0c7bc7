// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --ring-order's pure part: the launch order that makes NCCL's ring follow
// the cables, the node lines it reads, and its words.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "mesh/routing/ring_order.h"

namespace mesh {
namespace {

// Cable k is subnet 198.18.k.0/24.
Ipv4Prefix cable(int k) {
  Ipv4Prefix p;
  EXPECT_TRUE(parsePrefix("198.18." + std::to_string(k) + ".0/24", &p));
  return p;
}

RingNode node(const std::string& name, std::vector<int> cables) {
  RingNode n;
  n.name = name;
  for (int k : cables) n.subnets.push_back(cable(k));
  return n;
}

// A ring of n nodes: node i has cables i-1 and i (mod n), node i and i+1 share cable i.
std::vector<RingNode> ringNodes(int n) {
  std::vector<RingNode> nodes;
  for (int i = 0; i < n; ++i) nodes.push_back(node("n" + std::to_string(i), {(i + n - 1) % n, i}));
  return nodes;
}

std::vector<std::string> names(const std::vector<RingNode>& nodes, const RingOrder& r) {
  std::vector<std::string> out;
  for (size_t i : r.order) out.push_back(nodes[i].name);
  return out;
}

// Every node once, the first given first, and `uncabled` is what the order's pairs say.
void expectConsistent(const std::vector<RingNode>& nodes, const RingOrder& r) {
  ASSERT_TRUE(r.ok()) << r.error;
  ASSERT_EQ(r.order.size(), nodes.size());
  EXPECT_EQ(r.order[0], 0u);
  std::vector<size_t> sorted = r.order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], i);
  size_t uncabled = 0;
  for (size_t i = 0; nodes.size() > 1 && i < nodes.size(); ++i) {
    const RingNode& a = nodes[r.order[i]];
    const RingNode& b = nodes[r.order[(i + 1) % nodes.size()]];
    bool shared = std::any_of(a.subnets.begin(), a.subnets.end(), [&](const Ipv4Prefix& p) {
      return std::find(b.subnets.begin(), b.subnets.end(), p) != b.subnets.end();
    });
    uncabled += shared ? 0 : 1;
  }
  EXPECT_EQ(r.uncabled.size(), uncabled);
}

TEST(RingOrder, ShuffledFourRingComesBackInCableOrder) {
  // Ring A-B-C-D-A given as C, A, D, B.
  std::vector<RingNode> nodes = {node("C", {1, 2}), node("A", {3, 0}), node("D", {2, 3}), node("B", {0, 1})};
  RingOrder r = ringOrder(nodes);
  expectConsistent(nodes, r);
  EXPECT_TRUE(r.exact);
  EXPECT_TRUE(r.uncabled.empty());
  // From C, its neighbours are D (given 3rd) and B (given 4th): D first.
  EXPECT_EQ(names(nodes, r), (std::vector<std::string>{"C", "D", "A", "B"}));
}

TEST(RingOrder, FiveAndEightRingsGivenInReverseHalves) {
  for (int n : {5, 8}) {
    std::vector<RingNode> ring = ringNodes(n);
    // Node 0, then the odd nodes, then the even ones: no two consecutive are cabled.
    std::vector<RingNode> nodes = {ring[0]};
    for (int i = 1; i < n; i += 2) nodes.push_back(ring[static_cast<size_t>(i)]);
    for (int i = 2; i < n; i += 2) nodes.push_back(ring[static_cast<size_t>(i)]);
    RingOrder r = ringOrder(nodes);
    expectConsistent(nodes, r);
    EXPECT_TRUE(r.uncabled.empty()) << n;
    std::vector<std::string> want;
    for (int i = 0; i < n; ++i) want.push_back("n" + std::to_string(i));
    EXPECT_EQ(names(nodes, r), want) << n;  // n1 is listed before n(n-1): that direction
  }
}

TEST(RingOrder, FourLineHasOnlyTheWrapPairUncabled) {
  // Line A-B-C-D (cables 0, 1, 2), given as A, C, D, B.
  std::vector<RingNode> nodes = {node("A", {0}), node("C", {1, 2}), node("D", {2}), node("B", {0, 1})};
  RingOrder r = ringOrder(nodes);
  expectConsistent(nodes, r);
  EXPECT_EQ(names(nodes, r), (std::vector<std::string>{"A", "B", "C", "D"}));
  ASSERT_EQ(r.uncabled.size(), 1u);
  EXPECT_EQ(r.uncabled[0], std::make_pair(size_t{2}, size_t{0}));  // D -> A
  std::vector<std::string> text = describeRingOrder(nodes, r);
  ASSERT_EQ(text.size(), 2u);
  EXPECT_EQ(text[0],
            "Ring order (4 nodes, line: D -> A is not cabled: NCCL's ring closes through the relay there): "
            "A B C D");
  EXPECT_EQ(text[1],
            "Launch ranks in this order (rank 0 on A, every rank of a node before the next node's): e.g. "
            "mpirun -H A,B,C,D ..., or torchrun --node_rank=POSITION (A 0, B 1, C 2, D 3)");
}

TEST(RingOrder, LineStartedInTheMiddleKeepsTheFirstNodeFirst) {
  // Line A-B-C-D given from B: the uncabled pair is not the wrap, and the text says so.
  std::vector<RingNode> nodes = {node("B", {0, 1}), node("A", {0}), node("C", {1, 2}), node("D", {2})};
  RingOrder r = ringOrder(nodes);
  expectConsistent(nodes, r);
  EXPECT_EQ(names(nodes, r), (std::vector<std::string>{"B", "A", "D", "C"}));
  ASSERT_EQ(r.uncabled.size(), 1u);
  EXPECT_NE(describeRingOrder(nodes, r)[0].find("line: A -> D is not cabled: NCCL's ring goes through"),
            std::string::npos);
}

TEST(RingOrder, FullMeshOfThreeFollowsTheCables) {
  std::vector<RingNode> nodes = {node("A", {0, 1}), node("B", {0, 2}), node("C", {1, 2})};
  RingOrder r = ringOrder(nodes);
  expectConsistent(nodes, r);
  EXPECT_TRUE(r.uncabled.empty());
  EXPECT_EQ(names(nodes, r), (std::vector<std::string>{"A", "B", "C"}));
  EXPECT_EQ(describeRingOrder(nodes, r)[0], "Ring order (3 nodes, follows the cables everywhere): A B C");
}

TEST(RingOrder, NodeCabledToNobodyIsPlacedAndItsPairsReported) {
  // A triangle, and E whose only subnet no other node has.
  std::vector<RingNode> nodes = {node("A", {0, 1}), node("E", {9}), node("B", {0, 2}), node("C", {1, 2})};
  RingOrder r = ringOrder(nodes);
  expectConsistent(nodes, r);
  ASSERT_EQ(r.uncabled.size(), 2u);  // into E and out of it: no order does better
  for (const auto& p : r.uncabled) EXPECT_TRUE(p.first == 1 || p.second == 1);
  std::string text = describeRingOrder(nodes, r)[0];
  EXPECT_NE(text.find("2 pairs not cabled: "), std::string::npos) << text;
  EXPECT_NE(text.find("-> E"), std::string::npos) << text;
  EXPECT_NE(text.find("E ->"), std::string::npos) << text;
}

TEST(RingOrder, TwoNodesAndOneNode) {
  std::vector<RingNode> two = {node("A", {0}), node("B", {0})};
  RingOrder r = ringOrder(two);
  expectConsistent(two, r);
  EXPECT_TRUE(r.uncabled.empty());
  std::vector<RingNode> one = {node("A", {0})};
  r = ringOrder(one);
  expectConsistent(one, r);
  EXPECT_EQ(describeRingOrder(one, r)[0], "Ring order (1 node, follows the cables everywhere): A");
}

TEST(RingOrder, SubnetsCompareAsNetworks) {
  // Each end's own address with its length, as someone might type them: one cable.
  RingNode a = node("A", {});
  RingNode b = node("B", {});
  Ipv4Prefix p;
  ASSERT_TRUE(parsePrefix("198.18.0.1/24", &p));
  a.subnets.push_back(p);
  ASSERT_TRUE(parsePrefix("198.18.0.2/24", &p));
  b.subnets.push_back(p);
  RingOrder r = ringOrder({a, b});
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_TRUE(r.uncabled.empty());
  ASSERT_TRUE(parsePrefix("198.18.0.2/25", &p));  // another length: another subnet
  b.subnets = {p};
  EXPECT_EQ(ringOrder({a, b}).uncabled.size(), 2u);
}

TEST(RingOrder, DuplicateNameAndNodeWithoutSubnetAreErrors) {
  std::vector<RingNode> nodes = {node("A", {0}), node("B", {0}), node("A", {1})};
  nodes[0].line = 2;
  nodes[2].line = 7;
  RingOrder r = ringOrder(nodes);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error, "node 'A' is listed twice (line 2 and line 7): one line per node");
  r = ringOrder({node("A", {0}), node("B", {})});
  EXPECT_NE(r.error.find("node 2: node 'B' has no mesh subnet"), std::string::npos) << r.error;
  EXPECT_NE(ringOrder({}).error.find("no nodes given"), std::string::npos);
}

TEST(RingOrder, Deterministic) {
  // A 6-node full mesh: every order is a ring; the earliest-listed one comes back, each time.
  std::vector<RingNode> nodes;
  for (int i = 0; i < 6; ++i) {
    std::vector<int> cables;
    for (int j = 0; j < 6; ++j) {
      if (j != i) cables.push_back(std::min(i, j) * 6 + std::max(i, j));
    }
    nodes.push_back(node("m" + std::to_string(i), cables));
  }
  RingOrder first = ringOrder(nodes);
  expectConsistent(nodes, first);
  EXPECT_EQ(first.order, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
  for (int k = 0; k < 3; ++k) EXPECT_EQ(ringOrder(nodes).order, first.order);
}

TEST(RingOrder, SixteenExactSeventeenGreedy) {
  // A 16-ring in the worst order for a walk (odd nodes first) is still solved exactly.
  std::vector<RingNode> ring = ringNodes(16);
  std::vector<RingNode> nodes = {ring[0]};
  for (size_t i = 1; i < 16; i += 2) nodes.push_back(ring[i]);
  for (size_t i = 2; i < 16; i += 2) nodes.push_back(ring[i]);
  RingOrder r = ringOrder(nodes);
  expectConsistent(nodes, r);
  EXPECT_TRUE(r.exact);
  EXPECT_TRUE(r.uncabled.empty());
  // 17 and more: greedy, which still finds a ring and a line, a line from its middle too.
  ring = ringNodes(32);
  r = ringOrder(ring);
  expectConsistent(ring, r);
  EXPECT_FALSE(r.exact);
  EXPECT_TRUE(r.uncabled.empty());
  std::vector<RingNode> line;
  for (int i = 0; i < 20; ++i) {
    std::vector<int> cables;
    if (i > 0) cables.push_back(i - 1);
    if (i < 19) cables.push_back(i);
    line.push_back(node("l" + std::to_string(i), cables));
  }
  std::rotate(line.begin(), line.begin() + 10, line.end());
  r = ringOrder(line);
  expectConsistent(line, r);
  EXPECT_EQ(r.uncabled.size(), 1u);
  std::string text = describeRingOrder(line, r)[0];
  // Greedy cannot know that no ring exists: it says so even when it found the best.
  EXPECT_NE(text.find("(20 nodes, line: l0 -> l19 is not cabled"), std::string::npos) << text;
  EXPECT_NE(text.find("maybe not the fewest"), std::string::npos) << text;
  // Two separate triangles: the greedy result says it may not be the best.
  std::vector<RingNode> split;
  for (int t = 0; t < 6; ++t) {
    int base = (t / 3) * 3;
    int i = t % 3;
    split.push_back(node("t" + std::to_string(t), {base + i, base + (i + 2) % 3}));
  }
  for (int i = 0; i < 12; ++i) split.push_back(node("x" + std::to_string(i), {100 + i}));
  r = ringOrder(split);
  expectConsistent(split, r);
  EXPECT_NE(describeRingOrder(split, r)[0].find("a greedy order for more than 16 nodes, maybe not the fewest"),
            std::string::npos);
}

TEST(RingOrder, NodeLinesRoundTrip) {
  std::vector<RingNode> nodes;
  std::string error;
  std::string text = "# collected with nccl-mesh-info --subnets\n\n" +
                     subnetsLine("nodeA", {cable(0), cable(3)}) + "\n  nodeB 198.18.0.7/24 198.18.1.0/24  # note\n";
  ASSERT_TRUE(parseNodeLines(text, &nodes, &error)) << error;
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(subnetsLine(nodes[0].name, nodes[0].subnets), "nodeA 198.18.0.0/24 198.18.3.0/24");
  EXPECT_EQ(nodes[0].line, 3);
  EXPECT_EQ(subnetsLine(nodes[1].name, nodes[1].subnets), "nodeB 198.18.0.0/24 198.18.1.0/24");
  EXPECT_EQ(nodes[1].line, 4);
}

TEST(RingOrder, MalformedNodeLinesNameTheLine) {
  std::vector<RingNode> nodes;
  std::string error;
  EXPECT_FALSE(parseNodeLines("a 198.18.0.0/24\nb 198.18.0.0/33\n", &nodes, &error));
  EXPECT_EQ(error.rfind("line 2: '198.18.0.0/33' is not a subnet A.B.C.D/LEN (node 'b';", 0), 0u) << error;
  nodes.clear();
  EXPECT_FALSE(parseNodeLines("a 198.18.0.1\n", &nodes, &error));  // no length: not a subnet
  EXPECT_EQ(error.rfind("line 1: '198.18.0.1' is not a subnet", 0), 0u) << error;
  nodes.clear();
  EXPECT_FALSE(parseNodeLines("\n198.18.0.0/24 198.18.1.0/24\n", &nodes, &error));
  EXPECT_EQ(error.rfind("line 2: '198.18.0.0/24' is a subnet, but the first word must be the node's name", 0), 0u)
      << error;
}

}  // namespace
}  // namespace mesh
