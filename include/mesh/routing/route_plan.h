// SPDX-License-Identifier: Apache-2.0
// The relay's route plan (issue 31): one table of relayed paths for the whole cluster,
// which every node computes from the same picture of the cabling and so computes the same.
// A node alone cannot balance relayed traffic (it sees only its own connections); the
// cluster can, if every node places every uncabled pair the same way. Pure code: no
// sockets, no clock, no logging; unit-tested on rings, lines and partial meshes.
//
// Input: the nodes, each with its mesh addresses and the NodeIds of its neighbours (a
// neighbour shares a cable; parallel links or functions between one pair are one edge), in
// any order. An edge exists only when both ends list each other (a cable one end no longer
// hears is not planned over).
//
// The rule, applied to the canonical input (nodes by NodeId, lists sorted, duplicates gone):
//  1. Load of a directed edge u -> v = the ordered pairs whose traffic crosses it. Every
//     cabled ordered pair loads its own edge with 1 (the base load).
//  2. Every ordered pair (src, dst) without an edge that is reachable through at most
//     maxHops relays is planned; its candidates are its shortest paths (fewest relays), in
//     lexicographic order of their relay NodeIds (at most kPlanMaxPathsPerPair of them).
//     Pairs farther than maxHops relays, or not connected, are listed as unreachable.
//  3. Greedy placement: in (src, dst) order, each pair takes the candidate that minimizes
//     the busiest directed edge of the path after adding it, then the sum of the path's
//     loads after adding it, then the lexicographic order of its relays.
//  4. Refinement: a greedy pass cannot see that a tie it broke early forces a worse choice
//     later (on a 4-ring labelled 0-2-1-3 it leaves two directions with 2 relayed pairs
//     and two with none), so a bounded exact search follows. It looks for the assignment
//     of candidates that is strictly better by (busiest directed edge, sum of squared
//     directed-edge loads, sum of squared relayed pairs per relay node) than the best
//     known, starting from the greedy one, in (src, dst) order with candidates in
//     lexicographic order, and keeps the first strictly better one it finds each time.
//     Pairs with one candidate are placed before the search. The search stops after
//     kPlanSearchBudget steps (a count, not a time, so every node stops at the same
//     place) with the best found so far.
// On an even ring every cable direction then carries the same number of relayed pairs
// (4-ring: one each); a 6-ring's opposite nodes leave 3 or 4 per direction. A pair is
// never striped over two relays (see docs/relay.md, "Limits of the relay").
//
// Digests (FNV-1a 64): topologyDigest covers the canonical input (ids, addresses, neighbour
// lists as given, so two nodes whose pictures differ in any way see different digests);
// tableDigest covers the topology digest, maxHops, every planned path and every unreachable
// pair. Two nodes with equal digests hold the same table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mesh/platform/ipv4.h"
#include "mesh/routing/routes.h"

namespace mesh {

constexpr size_t kPlanMaxPathsPerPair = 64;   // shortest paths considered per pair
constexpr uint64_t kPlanSearchBudget = 200000;  // refinement steps (assignments tried)

// FNV-1a 64, fed field by field (each integer as its little-endian bytes): the digests here
// and the node id (nodeIdFromPorts).
class Fnv64 {
 public:
  Fnv64& byte(uint8_t b) {
    h_ = (h_ ^ b) * 0x100000001b3ull;
    return *this;
  }
  Fnv64& u64(uint64_t v, int bytes = 8) {
    for (int i = 0; i < bytes; ++i) byte(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;  // offset basis
};

// One node of the cabling, as its HELLOs describe it.
struct PlanNode {
  NodeId id = 0;
  std::vector<Ipv4Prefix> addrs;    // its mesh addresses, with prefixes
  std::vector<NodeId> neighbours;   // the nodes it hears on a shared subnet
  bool operator==(const PlanNode& o) const {
    return id == o.id && addrs == o.addrs && neighbours == o.neighbours;
  }
};

struct PlannedPath {
  NodeId src = 0;
  NodeId dst = 0;
  std::vector<NodeId> relays;  // the nodes in between, src's neighbour first
};

// Relayed pairs crossing one directed edge, and the one cabled pair using it.
struct EdgeLoad {
  NodeId from = 0;
  NodeId to = 0;
  int direct = 0;   // 1: the cabled pair (from, to)
  int relayed = 0;  // planned paths crossing from -> to
  int total() const { return direct + relayed; }
};

struct RoutePlan {
  int maxHops = 0;
  std::vector<PlanNode> nodes;                          // canonical: by id, lists sorted
  std::vector<PlannedPath> paths;                       // by (src, dst)
  std::vector<std::pair<NodeId, NodeId>> unreachable;   // uncabled pairs with no path
  std::vector<EdgeLoad> loads;                          // every directed edge, by (from, to)
  uint64_t topologyDigest = 0;
  uint64_t tableDigest = 0;
  uint64_t searchSteps = 0;  // refinement steps taken (kPlanSearchBudget: stopped early)

  // The path planned for (src, dst); nullptr for cabled, unreachable or unknown pairs.
  const PlannedPath* find(NodeId src, NodeId dst) const;
  // The node with id `id`; nullptr when the plan has none.
  const PlanNode* node(NodeId id) const;
  // The node that holds `addr` as one of its mesh addresses; 0 when none does.
  NodeId nodeOf(uint32_t addr) const;
  // Where node `self` sends the relayed pair (src, dst): the node after it on the pair's
  // path (dst itself when self is the last relay); self's own path to dst when self is not
  // on the pair's path (src used another rule, or the plan changed since it asked); 0 when
  // neither path exists.
  NodeId nextHop(NodeId self, NodeId src, NodeId dst) const;
  // The busiest directed edge's relayed pairs, and the least busy one's (0 without edges).
  int maxRelayed() const;
  int minRelayed() const;
  // For nccl-mesh-info --routes and the log: the digests, one line per pair ("a -> b via
  // r1 r2"), one per directed edge ("a -> b: 1 direct + 2 relayed"), the unreachable pairs.
  std::vector<std::string> describe() const;
};

// The canonical form of `nodes` (step 0 of the rule) and its digest.
std::vector<PlanNode> canonicalNodes(std::vector<PlanNode> nodes);
uint64_t topologyDigest(const std::vector<PlanNode>& canonical);

// The plan for `nodes` (any order) with at most maxHops relays per path (1..15).
RoutePlan planRoutes(std::vector<PlanNode> nodes, int maxHops);

// "0123456789abcdef": node ids and digests as every plan line shows them.
std::string hex64(uint64_t v);

}  // namespace mesh
