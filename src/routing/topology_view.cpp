// SPDX-License-Identifier: Apache-2.0
// A node's view of the whole cabling and the plan computed from it (see topology_view.h).
#include "mesh/routing/topology_view.h"

#include <algorithm>
#include <chrono>

#include "mesh/platform/ipv4.h"

namespace mesh {

namespace {

std::string node(NodeId id) { return "node " + hex64(id); }

}  // namespace

TopologyView::TopologyView(NodeId self, int maxHops, uint64_t holdMs)
    : self_(self), maxHops_(maxHops), holdMs_(holdMs) {
  replan();
}

TopologyRecord TopologyView::own() const {
  TopologyRecord r;
  r.origin = self_;
  r.topologyDigest = plan_.topologyDigest;
  r.tableDigest = plan_.tableDigest;
  r.addrs = ownAddrs_;
  r.neighbours = ownNeighbours_;
  return r;
}

// The plan's input is every record's adjacency; digests and sequence numbers are not part
// of it, so a record that only renews them leaves the plan alone.
bool TopologyView::replan() {
  std::vector<PlanNode> nodes;
  nodes.push_back({self_, ownAddrs_, ownNeighbours_});
  for (const auto& [origin, h] : held_) nodes.push_back({origin, h.record.addrs, h.record.neighbours});
  std::vector<PlanNode> canonical = canonicalNodes(nodes);
  planPending_ = false;
  if (!plan_.nodes.empty() && canonical == plan_.nodes) return false;
  if (planGapMs_ > 0 && nowMs_ < plannedAtMs_ + planGapMs_) {
    planPending_ = true;  // expire() plans it once the gap has passed
    return false;
  }
  if (canonical.size() > kTopologyMaxRecords) {
    // Sent as overflow, so never used: the picture alone (closure() reads it), no paths.
    plan_ = RoutePlan();
    plan_.maxHops = maxHops_;
    plan_.nodes = std::move(canonical);
    return true;
  }
  auto started = std::chrono::steady_clock::now();
  plan_ = planRoutes(std::move(canonical), maxHops_);
  auto tookMs = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  planGapMs_ = 4 * static_cast<uint64_t>(tookMs.count());
  plannedAtMs_ = nowMs_;
  return true;
}

bool TopologyView::countsFit() const {
  return held_.size() + 1 <= kTopologyMaxRecords && ownNeighbours_.size() <= kTopologyMaxNeighbours &&
         ownAddrs_.size() <= kHelloMaxAddresses;
}

bool TopologyView::setOwn(std::vector<Ipv4Prefix> addrs, std::vector<NodeId> neighbours) {
  std::sort(neighbours.begin(), neighbours.end());
  neighbours.erase(std::unique(neighbours.begin(), neighbours.end()), neighbours.end());
  bool ownChanged = addrs != ownAddrs_ || neighbours != ownNeighbours_;
  ownAddrs_ = std::move(addrs);
  ownNeighbours_ = std::move(neighbours);
  return replan() || ownChanged;
}

bool TopologyView::onHello(NodeId sender, const HelloTopology& t, uint64_t nowMs) {
  nowMs_ = std::max(nowMs_, nowMs);
  bool changed = false;
  if (t.overflow) {
    // Any one keeps the plan off; more only cost memory. A mark not kept changes nothing (so
    // a flood of new senders does not make this node send its HELLOs at once, each time).
    bool known = overflowSeenMs_.count(sender) != 0;
    if (known || overflowSeenMs_.size() < kTopologyMaxHeld) {
      changed = !known;
      overflowSeenMs_[sender] = nowMs;
    }
  }
  for (const TopologyRecord& r : t.records) {
    if (r.origin == self_ || r.origin == 0) continue;
    auto it = held_.find(r.origin);
    if (it == held_.end() && held_.size() >= kTopologyMaxHeld) continue;
    if (it != held_.end() && r.seq <= it->second.record.seq) continue;
    auto dead = tombstones_.find(r.origin);
    if (dead != tombstones_.end()) {
      if (r.seq <= dead->second.record.seq) continue;
      tombstones_.erase(dead);
    }
    if (it == held_.end() || !it->second.record.sameContent(r)) changed = true;
    held_[r.origin] = Held{r, nowMs};
  }
  replan();
  return changed;
}

bool TopologyView::expire(uint64_t nowMs) {
  nowMs_ = std::max(nowMs_, nowMs);
  auto stale = [this, nowMs](uint64_t since) { return nowMs > since && nowMs - since > holdMs_; };
  bool gone = false;
  for (auto it = held_.begin(); it != held_.end();) {
    bool drop = stale(it->second.renewedMs);
    if (drop) tombstones_[it->first] = Held{it->second.record, nowMs};
    gone = gone || drop;
    it = drop ? held_.erase(it) : std::next(it);
  }
  for (auto it = tombstones_.begin(); it != tombstones_.end();) {
    bool old = nowMs > it->second.renewedMs && nowMs - it->second.renewedMs > 3 * holdMs_;
    it = old ? tombstones_.erase(it) : std::next(it);
  }
  for (auto it = overflowSeenMs_.begin(); it != overflowSeenMs_.end();) {
    bool drop = stale(it->second);
    gone = gone || drop;
    it = drop ? overflowSeenMs_.erase(it) : std::next(it);
  }
  bool planned = (gone || planPending_) && replan();
  return gone || planned;
}

HelloTopology TopologyView::advertise(uint64_t ownSeq) const {
  HelloTopology t;
  t.overflow = ownOverflow_ || !countsFit();
  if (t.overflow) return t;
  TopologyRecord mine = own();
  mine.seq = ownSeq;
  t.records.push_back(mine);
  for (const auto& [origin, h] : held_) t.records.push_back(h.record);
  return t;
}

std::vector<TopologyRecord> TopologyView::records() const {
  std::vector<TopologyRecord> out;
  for (const auto& [origin, h] : held_) out.push_back(h.record);
  TopologyRecord mine = own();
  auto at = std::lower_bound(out.begin(), out.end(), self_,
                             [](const TopologyRecord& r, NodeId id) { return r.origin < id; });
  out.insert(at, mine);
  return out;
}

PlanAgreement TopologyView::agreement() const {
  auto differ = [](NodeId who, std::string why) { return PlanAgreement{false, who, std::move(why)}; };
  if (ownOverflow_) {
    return differ(self_, "this node's view (" + std::to_string(plan_.nodes.size()) +
                             " nodes) does not fit one HELLO; the plan covers small clusters only");
  }
  if (!countsFit()) {
    return differ(self_, "this node's view (" + std::to_string(held_.size() + 1) + " nodes, " +
                             std::to_string(ownNeighbours_.size()) + " heard by this node) is more than one HELLO "
                             "carries (" + std::to_string(kTopologyMaxRecords) + " nodes, " +
                             std::to_string(kTopologyMaxNeighbours) + " heard by each); the plan covers small "
                             "clusters only");
  }
  if (!overflowSeenMs_.empty()) {
    NodeId who = overflowSeenMs_.begin()->first;
    return differ(who, node(who) + "'s view does not fit one HELLO; the plan covers small clusters only");
  }
  // What is wrong with the picture first: it says more than the digests it causes.
  for (const PlanNode& n : plan_.nodes) {
    for (NodeId nb : n.neighbours) {
      const PlanNode* other = plan_.node(nb);
      if (other == nullptr) {
        return differ(nb, node(n.id) + " hears " + node(nb) + ", whose HELLOs have not reached this node");
      }
      if (!std::binary_search(other->neighbours.begin(), other->neighbours.end(), n.id)) {
        return differ(nb, node(n.id) + " hears " + node(nb) + " but " + node(nb) + " does not hear " + node(n.id) +
                              " (HELLOs lost one way, or a cable just cut)");
      }
    }
  }
  for (const auto& [origin, h] : held_) {
    const TopologyRecord& r = h.record;
    if (r.topologyDigest == plan_.topologyDigest && r.tableDigest == plan_.tableDigest) continue;
    return differ(origin, node(origin) + " advertises topology " + hex64(r.topologyDigest) + " table " +
                              hex64(r.tableDigest) + ", this node has topology " + hex64(plan_.topologyDigest) +
                              " table " + hex64(plan_.tableDigest));
  }
  return PlanAgreement{};
}

PlanAgreement TopologyView::closure() const {
  if (ownAddrs_.empty()) return PlanAgreement{false, self_, "this node's own addresses are not known yet"};
  for (const PlanNode& n : plan_.nodes) {
    for (const Ipv4Prefix& a : n.addrs) {
      if (a.prefixLen >= 32) continue;  // no neighbour can share it (no HELLO is sent on it)
      bool heard = false;
      for (NodeId nb : n.neighbours) {
        const PlanNode* other = plan_.node(nb);
        if (other == nullptr) continue;
        for (const Ipv4Prefix& b : other->addrs) heard = heard || sameSubnet(b.addr, a.addr, a.prefixLen);
      }
      if (!heard) {
        return PlanAgreement{false, n.id,
                             node(n.id) + "'s address " + formatIpv4(a.addr) + "/" + std::to_string(a.prefixLen) +
                                 " leads to no node heard (one still starting, or one that runs no plugin process)"};
      }
    }
  }
  return PlanAgreement{};
}

}  // namespace mesh
