// SPDX-License-Identifier: Apache-2.0
// The launch order that makes NCCL's ring follow the cables (mesh/routing/ring_order.h).
#include "mesh/routing/ring_order.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>

#include "mesh/platform/text.h"

namespace mesh {
namespace {

using Cables = std::vector<std::vector<bool>>;  // [a][b]: a and b share a subnet

Ipv4Prefix network(const Ipv4Prefix& p) { return Ipv4Prefix{p.addr & prefixMask(p.prefixLen), p.prefixLen}; }

// Subnets are compared as networks, so "198.18.0.1/24" and "198.18.0.2/24" (both ends of
// one cable, as someone might type them) are the same cable.
Cables cableMatrix(const std::vector<RingNode>& nodes) {
  size_t n = nodes.size();
  Cables c(n, std::vector<bool>(n, false));
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = a + 1; b < n; ++b) {
      for (const Ipv4Prefix& pa : nodes[a].subnets) {
        for (const Ipv4Prefix& pb : nodes[b].subnets) {
          if (network(pa) == network(pb)) c[a][b] = c[b][a] = true;
        }
      }
    }
  }
  return c;
}

std::string where(const RingNode& node, size_t index) {
  return node.line > 0 ? "line " + std::to_string(node.line) : "node " + std::to_string(index + 1);
}

std::string validate(const std::vector<RingNode>& nodes) {
  if (nodes.empty()) return "no nodes given: one line per node, as `nccl-mesh-info --subnets` prints it";
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const RingNode& node = nodes[i];
    if (node.name.empty()) return where(node, i) + ": a node without a name";
    auto it = seen.emplace(node.name, i);
    if (!it.second) {
      return "node '" + node.name + "' is listed twice (" + where(nodes[it.first->second], it.first->second) +
             " and " + where(node, i) + "): one line per node";
    }
    if (node.subnets.empty()) {
      return where(node, i) + ": node '" + node.name +
             "' has no mesh subnet, so no cable: check its ports with `nccl-mesh-info` there, or "
             "leave it out of the ring";
    }
  }
  return "";
}

// Exact: f[mask][last] = the fewest uncabled pairs still to come from a path that starts at
// node 0, has visited `mask` and stands at `last`, counting the wrap back to node 0. Filled
// from the full mask down, then walked forward taking the earliest-listed next node that
// keeps the optimum, which makes the order deterministic. Chosen over
// plain backtracking because with few cables backtracking degrades to N! orders.
std::vector<size_t> exactOrder(const Cables& c) {
  size_t n = c.size();
  size_t full = (size_t{1} << n) - 1;
  auto step = [&](size_t a, size_t b) { return c[a][b] ? 0 : 1; };
  std::vector<uint8_t> f((full + 1) * n, 0);
  for (size_t last = 0; last < n; ++last) f[full * n + last] = static_cast<uint8_t>(step(last, 0));
  for (size_t mask = full - 1; mask > 0; --mask) {
    if ((mask & 1) == 0) continue;  // every path starts at node 0
    for (size_t last = 0; last < n; ++last) {
      if ((mask >> last & 1) == 0) continue;
      int best = 255;
      for (size_t v = 0; v < n; ++v) {
        if ((mask >> v & 1) == 0) best = std::min(best, step(last, v) + f[(mask | size_t{1} << v) * n + v]);
      }
      f[mask * n + last] = static_cast<uint8_t>(best);
    }
  }
  // Among the best next nodes, one over a cable before one without: a line given from an
  // end then reads along the cables, with its gap at the wrap.
  std::vector<size_t> order = {0};
  size_t mask = 1;
  while (mask != full) {
    size_t last = order.back();
    size_t next = n;
    for (int wantStep = 0; wantStep <= 1 && next == n; ++wantStep) {
      for (size_t v = 0; v < n && next == n; ++v) {
        if ((mask >> v & 1) == 0 && step(last, v) == wantStep &&
            wantStep + f[(mask | size_t{1} << v) * n + v] == f[mask * n + last]) {
          next = v;
        }
      }
    }
    order.push_back(next);
    mask |= size_t{1} << next;
  }
  return order;
}

// Greedy for large N: start at a node with the fewest cables (an end, if the cables form a
// line), always step to the cabled unvisited node with the fewest unvisited cables left
// (Warnsdorff's rule: ends are not stranded), jump to such a node when stuck. Then rotate so
// node 0 is first: a cyclic order's uncabled pairs do not depend on where it starts.
std::vector<size_t> greedyOrder(const Cables& c) {
  size_t n = c.size();
  std::vector<bool> visited(n, false);
  auto freeCables = [&](size_t v) {
    size_t k = 0;
    for (size_t u = 0; u < n; ++u) k += (!visited[u] && c[v][u]) ? 1 : 0;
    return k;
  };
  auto pick = [&](long from) {  // from < 0: any unvisited node
    size_t best = n;
    size_t bestFree = 0;
    for (size_t v = 0; v < n; ++v) {
      if (visited[v] || (from >= 0 && !c[static_cast<size_t>(from)][v])) continue;
      size_t k = freeCables(v);
      if (best == n || k < bestFree) {
        best = v;
        bestFree = k;
      }
    }
    return best;
  };
  std::vector<size_t> order;
  size_t cur = pick(-1);
  while (cur != n) {
    visited[cur] = true;
    order.push_back(cur);
    size_t next = pick(static_cast<long>(cur));
    cur = next != n ? next : pick(-1);
  }
  std::rotate(order.begin(), std::find(order.begin(), order.end(), size_t{0}), order.end());
  return order;
}

std::string pairText(const std::vector<RingNode>& nodes, const std::pair<size_t, size_t>& p) {
  return nodes[p.first].name + " -> " + nodes[p.second].name;
}

}  // namespace

RingOrder ringOrder(const std::vector<RingNode>& nodes) {
  RingOrder r;
  r.error = validate(nodes);
  if (!r.ok()) return r;
  Cables c = cableMatrix(nodes);
  size_t n = nodes.size();
  r.exact = n <= kRingOrderExactMax;
  r.order = r.exact ? exactOrder(c) : greedyOrder(c);
  // One node has no pair; two make the pairs (a, b) and (b, a), both over the one cable.
  for (size_t i = 0; n > 1 && i < n; ++i) {
    size_t a = r.order[i];
    size_t b = r.order[(i + 1) % n];
    if (!c[a][b]) r.uncabled.emplace_back(a, b);
  }
  return r;
}

std::string subnetsLine(const std::string& name, const std::vector<Ipv4Prefix>& subnets) {
  std::string line = name;
  for (const Ipv4Prefix& p : subnets) line += " " + formatPrefix(network(p));
  return line;
}

bool parseNodeLines(const std::string& text, std::vector<RingNode>* nodes, std::string* error) {
  std::istringstream in(text);
  std::string raw;
  for (int lineNo = 1; std::getline(in, raw); ++lineNo) {
    std::istringstream words(raw.substr(0, raw.find('#')));
    RingNode node;
    node.line = lineNo;
    if (!(words >> node.name)) continue;  // blank or comment only
    Ipv4Prefix p;
    if (node.name.find('/') != std::string::npos && parsePrefix(node.name, &p)) {
      *error = "line " + std::to_string(lineNo) + ": '" + node.name +
               "' is a subnet, but the first word must be the node's name (NAME SUBNET/LEN ..., "
               "as `nccl-mesh-info --subnets` prints it)";
      return false;
    }
    std::string word;
    while (words >> word) {
      if (word.find('/') == std::string::npos || !parsePrefix(word, &p)) {
        *error = "line " + std::to_string(lineNo) + ": '" + word + "' is not a subnet A.B.C.D/LEN (node '" +
                 node.name + "'; lines are NAME SUBNET/LEN ..., as `nccl-mesh-info --subnets` prints them)";
        return false;
      }
      if (std::find(node.subnets.begin(), node.subnets.end(), network(p)) == node.subnets.end()) {
        node.subnets.push_back(network(p));
      }
    }
    nodes->push_back(node);
  }
  return true;
}

std::vector<std::string> describeRingOrder(const std::vector<RingNode>& nodes, const RingOrder& ring) {
  std::string kind;
  size_t n = ring.order.size();
  if (ring.uncabled.empty()) {
    kind = "follows the cables everywhere";
  } else {
    std::string pairs;
    for (const auto& p : ring.uncabled) pairs += (pairs.empty() ? "" : ", ") + pairText(nodes, p);
    bool onlyWrap = ring.uncabled.size() == 1 && ring.uncabled[0].first == ring.order[n - 1];
    if (ring.uncabled.size() == 1) {
      kind = "line: " + pairs + " is not cabled: NCCL's ring " +
             (onlyWrap ? "closes through the relay there" : "goes through the relay there");
    } else {
      kind = strf("%zu pairs not cabled: %s: NCCL's ring goes through the relay there", ring.uncabled.size(),
                  pairs.c_str());
    }
    if (!ring.exact) {
      kind += strf("; a greedy order for more than %zu nodes, maybe not the fewest", kRingOrderExactMax);
    }
  }
  std::string names;
  std::string hosts;
  std::string positions;
  for (size_t i = 0; i < n; ++i) {
    const std::string& name = nodes[ring.order[i]].name;
    names += (i ? " " : "") + name;
    hosts += (i ? "," : "") + name;
    positions += strf("%s%s %zu", i ? ", " : "", name.c_str(), i);
  }
  const std::string& first = nodes[ring.order[0]].name;
  return {strf("Ring order (%zu node%s, %s): %s", n, n == 1 ? "" : "s", kind.c_str(), names.c_str()),
          "Launch ranks in this order (rank 0 on " + first + ", every rank of a node before the next node's): e.g. " +
              "mpirun -H " + hosts + " ..., or torchrun --node_rank=POSITION (" + positions + ")"};
}

}  // namespace mesh
