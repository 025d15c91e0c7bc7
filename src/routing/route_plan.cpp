// SPDX-License-Identifier: Apache-2.0
// The relay's route plan (see route_plan.h). Nodes are numbered by their place in the
// canonical list, so index order is NodeId order and every loop below visits pairs, edges
// and candidates in the order the rule names.
#include "mesh/routing/route_plan.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <tuple>

namespace mesh {

namespace {

constexpr int kNoEdge = -1;
constexpr int kFar = 1 << 30;

// A pair's candidate: the node indices from src to dst, and the directed edges it crosses.
struct Candidate {
  std::vector<int> nodes;
  std::vector<int> edges;
};

struct Pair {
  int src = 0;
  int dst = 0;
  std::vector<Candidate> candidates;
};

// The lexicographic objective of the refinement; lower is better.
struct Score {
  int maxEdge = 0;
  uint64_t edgeSquares = 0;
  uint64_t relaySquares = 0;
  bool operator<(const Score& o) const {
    return std::tie(maxEdge, edgeSquares, relaySquares) < std::tie(o.maxEdge, o.edgeSquares, o.relaySquares);
  }
};

// Loads under placement and removal, with the objective kept up to date in O(path).
class Loads {
 public:
  Loads(size_t edges, size_t nodes) : edge_(edges, 0), relay_(nodes, 0), histogram_(1, edges) {}

  void add(const Candidate& c, int sign) {
    for (int e : c.edges) bump(static_cast<size_t>(e), sign);
    for (size_t i = 1; i + 1 < c.nodes.size(); ++i) {
      int& r = relay_[static_cast<size_t>(c.nodes[i])];
      score_.relaySquares += static_cast<uint64_t>(2 * r * sign + 1);  // (r+s)^2 - r^2, s = +-1
      r += sign;
    }
  }
  int edge(int e) const { return edge_[static_cast<size_t>(e)]; }
  const Score& score() const { return score_; }
  // What adding c would add to the two sums of squares, at today's loads. Loads only grow
  // as pairs are placed, so this is a lower bound of what c adds later.
  // The busiest edge of c once c is added.
  int busiestWith(const Candidate& c) const {
    int m = 0;
    for (int e : c.edges) m = std::max(m, edge_[static_cast<size_t>(e)] + 1);
    return m;
  }
  std::pair<uint64_t, uint64_t> squaresAdded(const Candidate& c) const {
    uint64_t edges = 0;
    uint64_t relays = 0;
    for (int e : c.edges) edges += static_cast<uint64_t>(2 * edge_[static_cast<size_t>(e)] + 1);
    for (size_t i = 1; i + 1 < c.nodes.size(); ++i) {
      relays += static_cast<uint64_t>(2 * relay_[static_cast<size_t>(c.nodes[i])] + 1);
    }
    return {edges, relays};
  }

 private:
  void bump(size_t e, int sign) {
    int& l = edge_[e];
    score_.edgeSquares += static_cast<uint64_t>(2 * l * sign + 1);
    --histogram_[static_cast<size_t>(l)];
    l += sign;
    if (static_cast<size_t>(l) >= histogram_.size()) histogram_.resize(static_cast<size_t>(l) + 1, 0);
    ++histogram_[static_cast<size_t>(l)];
    if (l > score_.maxEdge) score_.maxEdge = l;
    while (score_.maxEdge > 0 && histogram_[static_cast<size_t>(score_.maxEdge)] == 0) --score_.maxEdge;
  }

  std::vector<int> edge_;
  std::vector<int> relay_;
  std::vector<size_t> histogram_;  // edges per load value
  Score score_;
};

class Planner {
 public:
  Planner(const std::vector<PlanNode>& nodes, int maxHops) : nodes_(nodes), maxHops_(maxHops) {}
  void run(RoutePlan* out);

 private:
  void buildEdges();
  void distances();
  void collectPairs(RoutePlan* out);
  void enumerate(Pair* p, int v, std::vector<int>* walk);
  void greedy(Loads* loads);
  void search(size_t i, Loads* loads);
  bool hopeless(size_t i, const Loads& loads) const;

  const std::vector<PlanNode>& nodes_;
  int maxHops_;
  size_t n_ = 0;
  std::vector<std::vector<int>> adj_;     // mutual neighbours, by index
  std::vector<std::vector<int>> edgeId_;  // [u][v] -> directed edge, or kNoEdge
  std::vector<std::pair<int, int>> edges_;
  std::vector<std::vector<int>> dist_;
  std::vector<Pair> pairs_;
  std::vector<size_t> fixed_;    // pairs with one candidate
  std::vector<size_t> choice_;   // pairs with several, in (src, dst) order
  std::vector<size_t> chosen_;   // per pair: the candidate taken
  std::vector<size_t> current_;  // the search's assignment
  Score best_;
  uint64_t steps_ = 0;
};

void Planner::buildEdges() {
  n_ = nodes_.size();
  adj_.assign(n_, {});
  edgeId_.assign(n_, std::vector<int>(n_, kNoEdge));
  auto index = [this](NodeId id) {
    auto it = std::lower_bound(nodes_.begin(), nodes_.end(), id,
                               [](const PlanNode& a, NodeId b) { return a.id < b; });
    return it != nodes_.end() && it->id == id ? static_cast<int>(it - nodes_.begin()) : -1;
  };
  for (size_t u = 0; u < n_; ++u) {
    for (NodeId nb : nodes_[u].neighbours) {
      int v = index(nb);
      if (v < 0) continue;
      const std::vector<NodeId>& back = nodes_[static_cast<size_t>(v)].neighbours;
      if (!std::binary_search(back.begin(), back.end(), nodes_[u].id)) continue;
      adj_[u].push_back(v);  // sorted: neighbours are sorted by id, ids by index
      edgeId_[u][static_cast<size_t>(v)] = static_cast<int>(edges_.size());
      edges_.push_back({static_cast<int>(u), v});
    }
  }
}

void Planner::distances() {
  dist_.assign(n_, std::vector<int>(n_, kFar));
  for (size_t s = 0; s < n_; ++s) {
    std::deque<int> queue{static_cast<int>(s)};
    dist_[s][s] = 0;
    while (!queue.empty()) {
      int v = queue.front();
      queue.pop_front();
      for (int w : adj_[static_cast<size_t>(v)]) {
        if (dist_[s][static_cast<size_t>(w)] != kFar) continue;
        dist_[s][static_cast<size_t>(w)] = dist_[s][static_cast<size_t>(v)] + 1;
        queue.push_back(w);
      }
    }
  }
}

// Depth first through neighbours in id order: candidates come out lexicographically.
void Planner::enumerate(Pair* p, int v, std::vector<int>* walk) {
  if (p->candidates.size() >= kPlanMaxPathsPerPair) return;
  size_t s = static_cast<size_t>(p->src);
  size_t t = static_cast<size_t>(p->dst);
  if (v == p->dst) {
    Candidate c;
    c.nodes = *walk;
    for (size_t i = 0; i + 1 < walk->size(); ++i) {
      c.edges.push_back(edgeId_[static_cast<size_t>((*walk)[i])][static_cast<size_t>((*walk)[i + 1])]);
    }
    p->candidates.push_back(std::move(c));
    return;
  }
  for (int w : adj_[static_cast<size_t>(v)]) {
    size_t wi = static_cast<size_t>(w);
    if (dist_[s][wi] != dist_[s][static_cast<size_t>(v)] + 1 || dist_[wi][t] != dist_[static_cast<size_t>(v)][t] - 1) continue;
    walk->push_back(w);
    enumerate(p, w, walk);
    walk->pop_back();
  }
}

void Planner::collectPairs(RoutePlan* out) {
  for (size_t s = 0; s < n_; ++s) {
    for (size_t t = 0; t < n_; ++t) {
      if (s == t || edgeId_[s][t] != kNoEdge) continue;
      if (dist_[s][t] == kFar || dist_[s][t] - 1 > maxHops_) {
        out->unreachable.push_back({nodes_[s].id, nodes_[t].id});
        continue;
      }
      Pair p;
      p.src = static_cast<int>(s);
      p.dst = static_cast<int>(t);
      std::vector<int> walk{p.src};
      enumerate(&p, p.src, &walk);
      (p.candidates.size() == 1 ? fixed_ : choice_).push_back(pairs_.size());
      pairs_.push_back(std::move(p));
    }
  }
}

// Step 3 of the rule, on loads that already hold every cabled pair.
void Planner::greedy(Loads* loads) {
  chosen_.assign(pairs_.size(), 0);
  for (size_t i = 0; i < pairs_.size(); ++i) {
    const Pair& p = pairs_[i];
    auto key = [&](const Candidate& c) {
      int busiest = 0;
      int sum = 0;
      for (int e : c.edges) {
        busiest = std::max(busiest, loads->edge(e) + 1);
        sum += loads->edge(e) + 1;
      }
      return std::make_pair(busiest, sum);
    };
    size_t best = 0;
    for (size_t k = 1; k < p.candidates.size(); ++k) {
      if (key(p.candidates[k]) < key(p.candidates[best])) best = k;  // ties keep the lower relays
    }
    chosen_[i] = best;
    loads->add(p.candidates[best], +1);
  }
}

// Whether no completion of the assignment so far can be strictly better than the best: the
// busiest edge only grows; and once it equals the best's, the sums of squares cannot drop
// below what they are plus the least each remaining pair adds at today's loads.
bool Planner::hopeless(size_t i, const Loads& loads) const {
  const Score& now = loads.score();
  int busiest = now.maxEdge;
  uint64_t edges = now.edgeSquares;
  uint64_t relays = now.relaySquares;
  for (size_t j = i; j < choice_.size(); ++j) {
    int least = INT32_MAX;
    std::pair<uint64_t, uint64_t> squares{UINT64_MAX, UINT64_MAX};
    for (const Candidate& c : pairs_[choice_[j]].candidates) {
      least = std::min(least, loads.busiestWith(c));
      std::pair<uint64_t, uint64_t> added = loads.squaresAdded(c);
      squares = {std::min(squares.first, added.first), std::min(squares.second, added.second)};
    }
    busiest = std::max(busiest, least);
    edges += squares.first;
    relays += squares.second;
  }
  if (busiest != best_.maxEdge) return busiest > best_.maxEdge;
  return std::make_pair(edges, relays) >= std::make_pair(best_.edgeSquares, best_.relaySquares);
}

// Step 4: depth first over the pairs with a choice, each branch ended as soon as it is
// hopeless (above).
void Planner::search(size_t i, Loads* loads) {
  if (++steps_ > kPlanSearchBudget || hopeless(i, *loads)) return;
  if (i == choice_.size()) {
    best_ = loads->score();
    chosen_ = current_;
    return;
  }
  size_t pi = choice_[i];
  for (size_t k = 0; k < pairs_[pi].candidates.size() && steps_ <= kPlanSearchBudget; ++k) {
    current_[pi] = k;
    loads->add(pairs_[pi].candidates[k], +1);
    search(i + 1, loads);
    loads->add(pairs_[pi].candidates[k], -1);
  }
}

void Planner::run(RoutePlan* out) {
  buildEdges();
  distances();
  collectPairs(out);
  Loads greedyLoads(edges_.size(), n_);
  for (size_t e = 0; e < edges_.size(); ++e) greedyLoads.add(Candidate{{}, {static_cast<int>(e)}}, +1);
  Loads searchLoads = greedyLoads;
  greedy(&greedyLoads);
  best_ = greedyLoads.score();
  current_ = chosen_;
  for (size_t pi : fixed_) searchLoads.add(pairs_[pi].candidates[0], +1);
  if (!choice_.empty()) search(0, &searchLoads);
  out->searchSteps = std::min(steps_, kPlanSearchBudget);

  std::vector<int> relayed(edges_.size(), 0);
  for (size_t i = 0; i < pairs_.size(); ++i) {
    const Candidate& c = pairs_[i].candidates[chosen_[i]];
    PlannedPath path;
    path.src = nodes_[static_cast<size_t>(pairs_[i].src)].id;
    path.dst = nodes_[static_cast<size_t>(pairs_[i].dst)].id;
    for (size_t k = 1; k + 1 < c.nodes.size(); ++k) path.relays.push_back(nodes_[static_cast<size_t>(c.nodes[k])].id);
    for (int e : c.edges) ++relayed[static_cast<size_t>(e)];
    out->paths.push_back(std::move(path));
  }
  for (size_t e = 0; e < edges_.size(); ++e) {
    out->loads.push_back({nodes_[static_cast<size_t>(edges_[e].first)].id,
                          nodes_[static_cast<size_t>(edges_[e].second)].id, 1, relayed[e]});
  }
}

std::string nodeText(NodeId id) { return hex64(id); }

}  // namespace

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::vector<PlanNode> canonicalNodes(std::vector<PlanNode> nodes) {
  auto addrLess = [](const Ipv4Prefix& a, const Ipv4Prefix& b) {
    return std::make_pair(a.addr, a.prefixLen) < std::make_pair(b.addr, b.prefixLen);
  };
  std::sort(nodes.begin(), nodes.end(), [](const PlanNode& a, const PlanNode& b) { return a.id < b.id; });
  std::vector<PlanNode> out;
  for (PlanNode& n : nodes) {
    if (n.id == 0) continue;
    if (!out.empty() && out.back().id == n.id) {  // the same node twice: one node, both lists
      out.back().addrs.insert(out.back().addrs.end(), n.addrs.begin(), n.addrs.end());
      out.back().neighbours.insert(out.back().neighbours.end(), n.neighbours.begin(), n.neighbours.end());
    } else {
      out.push_back(std::move(n));
    }
  }
  for (PlanNode& n : out) {
    std::sort(n.addrs.begin(), n.addrs.end(), addrLess);
    n.addrs.erase(std::unique(n.addrs.begin(), n.addrs.end()), n.addrs.end());
    std::sort(n.neighbours.begin(), n.neighbours.end());
    n.neighbours.erase(std::unique(n.neighbours.begin(), n.neighbours.end()), n.neighbours.end());
    n.neighbours.erase(std::remove(n.neighbours.begin(), n.neighbours.end(), n.id), n.neighbours.end());
    n.neighbours.erase(std::remove(n.neighbours.begin(), n.neighbours.end(), NodeId{0}), n.neighbours.end());
  }
  return out;
}

uint64_t topologyDigest(const std::vector<PlanNode>& canonical) {
  Fnv64 h;
  h.u64(canonical.size());
  for (const PlanNode& n : canonical) {
    h.u64(n.id).u64(n.addrs.size());
    for (const Ipv4Prefix& a : n.addrs) h.u64(a.addr, 4).byte(a.prefixLen);
    h.u64(n.neighbours.size());
    for (NodeId nb : n.neighbours) h.u64(nb);
  }
  return h.value();
}

RoutePlan planRoutes(std::vector<PlanNode> nodes, int maxHops) {
  RoutePlan plan;
  plan.maxHops = std::clamp(maxHops, 1, kRouteMaxHopsLimit);
  plan.nodes = canonicalNodes(std::move(nodes));
  plan.topologyDigest = topologyDigest(plan.nodes);
  Planner(plan.nodes, plan.maxHops).run(&plan);
  Fnv64 h;
  h.u64(plan.topologyDigest).u64(static_cast<uint64_t>(plan.maxHops)).u64(plan.paths.size());
  for (const PlannedPath& p : plan.paths) {
    h.u64(p.src).u64(p.dst).u64(p.relays.size());
    for (NodeId r : p.relays) h.u64(r);
  }
  h.u64(plan.unreachable.size());
  for (const auto& [s, d] : plan.unreachable) h.u64(s).u64(d);
  plan.tableDigest = h.value();
  return plan;
}

const PlannedPath* RoutePlan::find(NodeId src, NodeId dst) const {
  auto it = std::lower_bound(paths.begin(), paths.end(), std::make_pair(src, dst),
                             [](const PlannedPath& p, const std::pair<NodeId, NodeId>& k) {
                               return std::make_pair(p.src, p.dst) < k;
                             });
  return it != paths.end() && it->src == src && it->dst == dst ? &*it : nullptr;
}

const PlanNode* RoutePlan::node(NodeId id) const {
  auto it = std::lower_bound(nodes.begin(), nodes.end(), id, [](const PlanNode& p, NodeId v) { return p.id < v; });
  return it != nodes.end() && it->id == id ? &*it : nullptr;
}

NodeId RoutePlan::nodeOf(uint32_t addr) const {
  for (const PlanNode& n : nodes) {
    for (const Ipv4Prefix& a : n.addrs) {
      if (a.addr == addr) return n.id;
    }
  }
  return 0;
}

NodeId RoutePlan::nextHop(NodeId self, NodeId src, NodeId dst) const {
  for (NodeId from : {src, self}) {
    const PlannedPath* path = find(from, dst);
    if (path == nullptr) continue;
    if (from == self) return path->relays.front();
    auto at = std::find(path->relays.begin(), path->relays.end(), self);
    if (at != path->relays.end()) return std::next(at) != path->relays.end() ? *std::next(at) : dst;
  }
  return 0;
}

int RoutePlan::maxRelayed() const {
  int m = 0;
  for (const EdgeLoad& l : loads) m = std::max(m, l.relayed);
  return m;
}

int RoutePlan::minRelayed() const {
  if (loads.empty()) return 0;
  int m = loads.front().relayed;
  for (const EdgeLoad& l : loads) m = std::min(m, l.relayed);
  return m;
}

std::vector<std::string> RoutePlan::describe() const {
  std::vector<std::string> lines;
  lines.push_back("topology " + hex64(topologyDigest) + " table " + hex64(tableDigest) + ": " +
                  std::to_string(nodes.size()) + " node(s), " + std::to_string(paths.size()) +
                  " relayed pair(s), at most " + std::to_string(maxHops) + " relay(s) per path");
  for (const PlannedPath& p : paths) {
    std::string line = "pair " + nodeText(p.src) + " -> " + nodeText(p.dst) + " via";
    for (NodeId r : p.relays) line += " " + nodeText(r);
    lines.push_back(line);
  }
  for (const EdgeLoad& l : loads) {
    lines.push_back("cable " + nodeText(l.from) + " -> " + nodeText(l.to) + ": " + std::to_string(l.direct) +
                    " direct + " + std::to_string(l.relayed) + " relayed");
  }
  for (const auto& [s, d] : unreachable) {
    lines.push_back("pair " + nodeText(s) + " -> " + nodeText(d) + " unreachable within " + std::to_string(maxHops) +
                    " relay(s)");
  }
  return lines;
}

}  // namespace mesh
