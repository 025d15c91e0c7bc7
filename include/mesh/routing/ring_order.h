// SPDX-License-Identifier: Apache-2.0
// nccl-mesh-info --ring-order, the pure part (unit-tested): the order to launch nodes in so
// that NCCL's ring follows the cables. NCCL numbers nodes in the order their first rank
// appears and links node n to node n+1, the last back to the first (docs/topologies.md,
// the 4-node ring's item 4); a consecutive pair with no cable between them is reached through the relay,
// which is slower. Owns: the "NAME SUBNET/LEN..." node lines `nccl-mesh-info --subnets`
// prints, the search for a cyclic order with the fewest uncabled consecutive pairs, and the
// words of the answer. No sockets, no RDMA, no logging.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "mesh/platform/ipv4.h"

namespace mesh {

// Up to this many nodes the search is exact; above, a greedy walk (the exact search is
// 2^N·N² steps, about 17 M at 16 nodes).
constexpr size_t kRingOrderExactMax = 16;

struct RingNode {
  std::string name;
  std::vector<Ipv4Prefix> subnets;  // its mesh ports' subnets; two nodes sharing one are cabled
  int line = 0;                     // where it was read (for error messages); 0: not from a file
};

struct RingOrder {
  std::string error;                                // non-empty: the input is unusable
  std::vector<size_t> order;                        // indexes into the nodes, order[0] == 0
  std::vector<std::pair<size_t, size_t>> uncabled;  // consecutive (from, to) node indexes
                                                    // without a cable, the wrap pair last
  bool exact = true;                                // false: greedy, maybe not the fewest
  bool ok() const { return error.empty(); }
};

// A cyclic order of every node in which each consecutive pair (and the last with the first)
// shares a subnet when such an order exists, else one with the fewest pairs that do not.
// Deterministic: the first node given comes first, and among equally good orders the one
// that picks earlier-listed nodes first. Rejects duplicate names and nodes without subnets.
RingOrder ringOrder(const std::vector<RingNode>& nodes);

// The line `nccl-mesh-info --subnets` prints: "NAME 198.18.0.0/24 198.18.1.0/24".
std::string subnetsLine(const std::string& name, const std::vector<Ipv4Prefix>& subnets);

// Node lines as --subnets prints them, one node per line; blank lines and '#' comments are
// skipped. False with an error naming the line on a malformed one.
bool parseNodeLines(const std::string& text, std::vector<RingNode>* nodes, std::string* error);

// The answer in words: the order and whether it follows the cables, then how to launch it.
std::vector<std::string> describeRingOrder(const std::vector<RingNode>& nodes, const RingOrder& ring);

}  // namespace mesh
