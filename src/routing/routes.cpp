// SPDX-License-Identifier: Apache-2.0
// Route discovery (see routes.h). The table is rebuilt from scratch on every change: with
// at most a few dozen subnets this costs microseconds, and it means no state survives that
// the live neighbours do not still claim.
#include "mesh/routing/routes.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "mesh/platform/text.h"

namespace mesh {

namespace {

Ipv4Prefix network(const Ipv4Prefix& p) {
  uint8_t len = p.prefixLen > 32 ? 32 : p.prefixLen;
  return Ipv4Prefix{p.addr & prefixMask(len), len};
}

// Lower = preferred, for two routes to the same subnet (tie-break 1 in routes.h).
auto routePreference(const RelayRoute& r) {
  return std::make_tuple(r.hops, r.nextHop, r.localPort, r.nextHopAddr);
}

std::string hexNode(NodeId id) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

std::string describePort(const LocalNic& nic) {
  std::string text = nic.label.empty() ? "port " + std::to_string(nic.index) : nic.label;
  for (const LocalAddress& a : nic.addrs) text += " " + formatPrefix(a.ip);
  return text;
}

// --- NCCL_MESH_ROUTES -------------------------------------------------------------------

const char* const kRoutesExample = "e.g. 198.18.2.0/24=198.18.0.2";

bool parseEntry(const std::string& entry, size_t number, StaticRoute* out, std::string* error) {
  std::string where = "entry " + std::to_string(number) + " '" + entry + "': ";
  size_t eq = entry.find('=');
  if (eq == std::string::npos) {
    *error = where + "no '='; write DEST/LEN=NEXTHOP, " + kRoutesExample;
    return false;
  }
  std::string dest = trim(entry.substr(0, eq));
  std::string hop = trim(entry.substr(eq + 1));
  if (dest.find('/') == std::string::npos) {
    *error = where + "the destination '" + dest + "' needs a prefix length, e.g. " + dest + "/24";
    return false;
  }
  if (!parsePrefix(dest, &out->dest)) {
    *error = where + "'" + dest + "' is not an IPv4 prefix (a.b.c.d/0..32)";
    return false;
  }
  if (network(out->dest).addr != out->dest.addr) {
    *error = where + "the destination " + dest + " has host bits set; did you mean " +
             formatPrefix(network(out->dest)) + "?";
    return false;
  }
  if (hop.find('/') != std::string::npos) {
    *error = where + "the next hop '" + hop + "' must be a plain address, without /LEN";
    return false;
  }
  if (!parseIpv4(hop, &out->nextHop)) {
    *error = where + "the next hop '" + hop + "' is not an IPv4 address (a.b.c.d)";
    return false;
  }
  return true;
}

}  // namespace

bool parseStaticRoutes(const std::string& text, std::vector<StaticRoute>* out, std::string* error) {
  std::vector<StaticRoute> routes;
  if (trim(text).empty()) {
    *out = routes;
    return true;
  }
  std::vector<std::string> entries;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',' || text[i] == ';') {
      entries.push_back(trim(text.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (entries.size() > kStaticRoutesMax) {
    *error = std::to_string(entries.size()) + " entries; at most " +
             std::to_string(kStaticRoutesMax);
    return false;
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].empty()) {
      *error = "entry " + std::to_string(i + 1) +
               " is empty (two separators in a row, or one at an end); " + kRoutesExample;
      return false;
    }
    StaticRoute r;
    if (!parseEntry(entries[i], i + 1, &r, error)) return false;
    for (size_t j = 0; j < routes.size(); ++j) {
      if (routes[j].dest == r.dest) {
        *error = "the destination " + formatPrefix(r.dest) +
                 " appears twice (entries " + std::to_string(j + 1) + " and " + std::to_string(i + 1) +
                 "); keep one";
        return false;
      }
    }
    routes.push_back(r);
  }
  *out = std::move(routes);
  return true;
}

std::string formatStaticRoutes(const std::vector<StaticRoute>& routes) {
  std::string text;
  for (const StaticRoute& r : routes) {
    if (!text.empty()) text += ",";
    text += formatPrefix(r.dest) + "=" + formatIpv4(r.nextHop);
  }
  return text;
}

const char* routeSourceName(RouteSource s) {
  switch (s) {
    case RouteSource::Attached:
      return "attached";
    case RouteSource::Learned:
      return "learned";
    case RouteSource::Static:
      return "static";
  }
  return "?";
}

// --- RouteTable -----------------------------------------------------------------------------

RouteTable::RouteTable(NodeId self, std::vector<LocalNic> ports, RouteSettings settings,
                       std::vector<StaticRoute> statics)
    : self_(self), ports_(std::move(ports)), settings_(settings) {
  settings_.maxHops = std::clamp(settings_.maxHops, 1, kRouteMaxHopsLimit);
  resolveStatics(statics);
  recompute();
}

const LocalNic* RouteTable::port(int index) const {
  for (const LocalNic& p : ports_) {
    if (p.index == index) return &p;
  }
  return nullptr;
}

// A static next hop is reached over the port whose subnet holds it (the operator named the
// neighbour, so this is their word, not an inference); the lowest such port wins.
void RouteTable::resolveStatics(const std::vector<StaticRoute>& statics) {
  for (const StaticRoute& s : statics) {
    std::string what = "NCCL_MESH_ROUTES " + formatPrefix(s.dest) + "=" + formatIpv4(s.nextHop);
    const LocalNic* via = nullptr;
    bool own = false;
    bool attached = false;
    for (const LocalNic& p : ports_) {
      for (const LocalAddress& a : p.addrs) {
        own = own || a.ip.addr == s.nextHop;
        attached = attached || network(a.ip) == s.dest;
        bool holds = sameSubnet(a.ip.addr, s.nextHop, a.ip.prefixLen);
        if (holds && (via == nullptr || p.index < via->index)) via = &p;
      }
    }
    if (attached) {
      staticProblems_.push_back(what + ": the destination is one of this node's own links; ignored");
    } else if (own) {
      staticProblems_.push_back(what + ": the next hop is this node's own address; ignored");
    } else if (via == nullptr) {
      std::string local;
      for (const LocalNic& p : ports_) local += (local.empty() ? "" : ", ") + describePort(p);
      staticProblems_.push_back(what + ": the next hop is on none of this node's links (" +
                                (local.empty() ? std::string("no ports") : local) + "); ignored");
    } else {
      statics_.push_back({s, via->index});
    }
  }
}

bool RouteTable::onHello(int localPort, const NodeHello& hello, uint64_t nowMs, std::string* why) {
  const LocalNic* p = port(localPort);
  std::string from = "HELLO from node " + hexNode(hello.node) + " on port " + std::to_string(localPort);
  if (p == nullptr) {
    *why = from + ": no such local port";
    return false;
  }
  if (downPorts_.count(localPort) != 0) {
    *why = from + ": the port is down";
    return false;
  }
  if (hello.node == 0 || hello.node == self_) {
    *why = from + (hello.node == 0 ? ": node id 0 is reserved"
                                   : ": carries our own node id (a loop, or two nodes share an id)");
    return false;
  }
  // The neighbour's address on this link: one both ends consider on-link; the longest
  // common prefix, then the lowest address.
  uint32_t linkAddr = 0;
  int bestLen = -1;
  for (const Ipv4Prefix& theirs : hello.addrs) {
    for (const LocalAddress& ours : p->addrs) {
      if (theirs.addr == ours.ip.addr || !onSameLink(ours.ip, theirs)) continue;
      int len = std::min(theirs.prefixLen, ours.ip.prefixLen);
      if (len > bestLen || (len == bestLen && theirs.addr < linkAddr)) {
        bestLen = len;
        linkAddr = theirs.addr;
      }
    }
  }
  if (bestLen < 0) {
    std::string theirs;
    for (const Ipv4Prefix& a : hello.addrs) theirs += (theirs.empty() ? "" : ", ") + formatPrefix(a);
    *why = from + ": none of its addresses (" + (theirs.empty() ? "none" : theirs) +
           ") shares a subnet with " + describePort(*p) + "; not a neighbour";
    return false;
  }
  auto key = std::make_pair(localPort, hello.node);
  if (neighbours_.count(key) == 0) {
    size_t onPort = 0;
    for (const auto& kv : neighbours_) onPort += kv.first.first == localPort ? 1 : 0;
    if (onPort >= kRouteMaxNeighboursPerPort) {
      *why = from + ": " + describePort(*p) + " already holds " + std::to_string(kRouteMaxNeighboursPerPort) +
             " neighbours, more than a mesh has (a misbehaving sender on the link?); a new one waits until one "
             "expires";
      return false;
    }
  }
  Neighbour& n = neighbours_[key];
  n.hello = hello;
  n.linkAddr = linkAddr;
  n.heardMs = nowMs;
  recompute();
  return true;
}

void RouteTable::portUp(int localPort) {
  if (downPorts_.erase(localPort) != 0) recompute();
}

void RouteTable::portDown(int localPort) {
  bool down = port(localPort) != nullptr && downPorts_.insert(localPort).second;
  bool dropped = dropNeighbours([localPort](int p, const Neighbour&) { return p == localPort; });
  if (down || dropped) recompute();
}

bool RouteTable::expire(uint64_t nowMs) {
  uint64_t holdMs = settings_.holdMs;
  bool changed = dropNeighbours([nowMs, holdMs](int, const Neighbour& n) {
    return nowMs > n.heardMs && nowMs - n.heardMs > holdMs;
  });
  if (changed) recompute();
  return changed;
}

std::vector<NeighbourLink> RouteTable::neighbours() const {
  std::vector<NeighbourLink> out;
  for (const auto& [key, n] : neighbours_) out.push_back({key.first, key.second, n.linkAddr});
  return out;
}

bool RouteTable::dropNeighbours(const std::function<bool(int port, const Neighbour& n)>& gone) {
  size_t before = neighbours_.size();
  for (auto it = neighbours_.begin(); it != neighbours_.end();) {
    it = gone(it->first.first, it->second) ? neighbours_.erase(it) : std::next(it);
  }
  return neighbours_.size() != before;
}

void RouteTable::recompute() {
  // Keyed by (address, prefix length) so the output is sorted by subnet.
  std::map<std::pair<uint32_t, uint8_t>, RelayRoute> best;
  auto offer = [&best](const RelayRoute& r) {
    auto key = std::make_pair(r.subnet.addr, r.subnet.prefixLen);
    auto it = best.find(key);
    if (it == best.end()) {
      best.emplace(key, r);
    } else if (it->second.source != RouteSource::Attached &&
               routePreference(r) < routePreference(it->second)) {
      it->second = r;
    }
  };
  for (const LocalNic& p : ports_) {
    if (downPorts_.count(p.index) != 0) continue;
    for (const LocalAddress& a : p.addrs) {
      RelayRoute r;
      r.subnet = network(a.ip);
      r.localPort = p.index;
      // Attached routes only compete with each other: the lowest port wins.
      auto key = std::make_pair(r.subnet.addr, r.subnet.prefixLen);
      auto it = best.find(key);
      if (it == best.end() || p.index < it->second.localPort) best[key] = r;
    }
  }
  for (const auto& [key, n] : neighbours_) {
    for (const RouteAdvert& adv : n.hello.routes) {
      if (adv.hops >= kRouteHopsUnreachable || adv.hops + 1 > settings_.maxHops) continue;
      RelayRoute r;
      r.subnet = network(adv.subnet);
      r.hops = adv.hops + 1;
      r.source = RouteSource::Learned;
      r.localPort = key.first;
      r.nextHop = key.second;
      r.nextHopAddr = n.linkAddr;
      offer(r);
    }
  }
  for (const ResolvedStatic& s : statics_) {
    RelayRoute r;
    r.subnet = s.route.dest;
    r.hops = 1;
    r.source = RouteSource::Static;
    r.localPort = s.localPort;
    r.nextHopAddr = s.route.nextHop;
    for (const auto& [key, n] : neighbours_) {
      if (key.first == s.localPort && n.linkAddr == s.route.nextHop) r.nextHop = key.second;
    }
    // resolveStatics dropped destinations attached here, so this overrides a learned route.
    best[std::make_pair(r.subnet.addr, r.subnet.prefixLen)] = r;
  }
  routes_.clear();
  for (const auto& kv : best) routes_.push_back(kv.second);
}

NodeHello RouteTable::helloFor(int localPort) const {
  NodeHello h;
  h.node = self_;
  for (const LocalNic& p : ports_) {
    if (downPorts_.count(p.index) != 0) continue;
    for (const LocalAddress& a : p.addrs) {
      if (h.addrs.size() < kHelloMaxAddresses) h.addrs.push_back(a.ip);
    }
  }
  for (const RelayRoute& r : routes_) {
    if (r.source == RouteSource::Static) continue;
    bool backToNextHop = r.source == RouteSource::Learned && r.localPort == localPort;
    if (backToNextHop && !settings_.poisonReverse) continue;
    int hops = backToNextHop ? kRouteHopsUnreachable : r.hops;
    h.routes.push_back({r.subnet, static_cast<uint8_t>(hops)});
  }
  if (h.routes.size() > kHelloMaxRoutes) {
    std::stable_sort(h.routes.begin(), h.routes.end(),
                     [](const RouteAdvert& a, const RouteAdvert& b) { return a.hops < b.hops; });
    h.routes.resize(kHelloMaxRoutes);
  }
  return h;
}

NextHopResult RouteTable::nextHops(const std::vector<HandleAddress>& peer) const {
  NextHopResult result;
  for (const HandleAddress& a : peer) {
    const RelayRoute* match = nullptr;
    for (const RelayRoute& r : routes_) {
      if (!sameSubnet(r.subnet.addr, a.addr, r.subnet.prefixLen)) continue;
      if (match == nullptr || r.subnet.prefixLen > match->subnet.prefixLen) match = &r;
    }
    if (match != nullptr) result.hops.push_back({a.addr, *match});
  }
  std::sort(result.hops.begin(), result.hops.end(), [](const NextHop& x, const NextHop& y) {
    return std::make_tuple(routePreference(x.route), x.peerAddr) <
           std::make_tuple(routePreference(y.route), y.peerAddr);
  });
  std::vector<NextHop> distinct;
  for (const NextHop& h : result.hops) {
    bool seen = std::any_of(distinct.begin(), distinct.end(), [&h](const NextHop& d) {
      return d.route.localPort == h.route.localPort && d.route.nextHopAddr == h.route.nextHopAddr;
    });
    if (!seen) distinct.push_back(h);
  }
  result.hops = std::move(distinct);
  if (result.hops.empty()) {
    std::string peerText;
    for (const HandleAddress& a : peer) {
      peerText += (peerText.empty() ? "" : ", ") + formatPrefix(Ipv4Prefix{a.addr, a.prefixLen});
    }
    result.error = "no route to the peer (" + (peerText.empty() ? std::string("no addresses") : peerText) +
                   ") within " + std::to_string(settings_.maxHops) + " relay hop(s); " +
                   std::to_string(neighbours_.size()) +
                   " neighbour(s) heard; raise NCCL_MESH_RELAY_MAX_HOPS, check the cabling, or "
                   "add NCCL_MESH_ROUTES";
  }
  return result;
}

void preferIdlePorts(std::vector<NextHop>* hops, const std::function<int(int localPort)>& sendsOnPort) {
  std::vector<std::pair<NextHop, int>> keyed;
  for (const NextHop& h : *hops) keyed.push_back({h, sendsOnPort(h.route.localPort)});
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.first.route.hops, a.second) < std::make_pair(b.first.route.hops, b.second);
  });
  hops->clear();
  for (const auto& k : keyed) hops->push_back(k.first);
}

void preferPlannedHop(std::vector<NextHop>* hops, NodeId planned, uint32_t peerAddr,
                      const std::vector<NeighbourLink>& links) {
  if (planned == 0) return;
  std::vector<NextHop> first, rest;
  for (NextHop h : *hops) {
    h.planned = h.route.nextHop == planned;
    (h.planned ? first : rest).push_back(h);
  }
  if (first.empty()) {
    for (const NeighbourLink& l : links) {
      if (l.node != planned) continue;
      NextHop h;
      h.peerAddr = peerAddr;
      h.planned = true;
      h.route.hops = 1;
      h.route.source = RouteSource::Learned;
      h.route.localPort = l.localPort;
      h.route.nextHop = l.node;
      h.route.nextHopAddr = l.linkAddr;
      first.push_back(h);
    }
  }
  first.insert(first.end(), rest.begin(), rest.end());
  *hops = std::move(first);
}

std::vector<std::string> RouteTable::describe() const {
  std::vector<std::string> lines;
  for (const RelayRoute& r : routes_) {
    const LocalNic* p = port(r.localPort);
    std::string portText = p == nullptr ? "port " + std::to_string(r.localPort)
                                        : (p->label.empty() ? "port " + std::to_string(p->index) : p->label);
    std::string line = formatPrefix(r.subnet) + " " + routeSourceName(r.source) + " hops " +
                       std::to_string(r.hops) + " on " + portText;
    if (r.source != RouteSource::Attached) {
      line += " via " + formatIpv4(r.nextHopAddr);
      if (r.nextHop != 0) line += " (node " + hexNode(r.nextHop) + ")";
    }
    lines.push_back(line);
  }
  return lines;
}

}  // namespace mesh
