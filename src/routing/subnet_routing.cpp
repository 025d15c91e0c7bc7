// SPDX-License-Identifier: Apache-2.0
// Subnet routing: picks the local port(s) cabled to a peer from the addresses alone.
// Every tie is broken explicitly so the same inputs give the same routes in the same
// order whatever order discovery listed ports and addresses in: the data path stripes by
// route index, and a run that is not reproducible cannot be debugged.
#include "mesh/routing/subnet_routing.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

namespace mesh {

namespace {

uint8_t clampPrefix(uint8_t len) { return len > 32 ? 32 : len; }

bool pairMatches(const Ipv4Prefix& local, const HandleAddress& peer) {
  return onSameLink(local, Ipv4Prefix{peer.addr, peer.prefixLen});
}

// Lower key = preferred address pair for one physical link.
auto linkPreference(const Route& r) {
  return std::make_tuple(-static_cast<int>(r.prefixLen), r.local.addr, r.peerAddr,
                         r.local.prefixLen, r.gidIndex);
}

Route makeRoute(const LocalNic& nic, const LocalAddress& local, const HandleAddress& peer) {
  Route r;
  r.localNic = nic.index;
  r.gidIndex = local.gidIndex;
  r.local = local.ip;
  r.peerAddr = peer.addr;
  r.peerNic = peer.nic;
  r.prefixLen = std::min(clampPrefix(local.ip.prefixLen), clampPrefix(peer.prefixLen));
  return r;
}

// The routes one peer address yields: its matches with the longest local prefix, the way
// the kernel would pick the outgoing interface for it.
std::vector<Route> routesForPeerAddress(const std::vector<LocalNic>& nics,
                                        const HandleAddress& peer) {
  std::vector<Route> best;
  int bestLocalPrefix = -1;
  for (const LocalNic& nic : nics) {
    for (const LocalAddress& local : nic.addrs) {
      if (!pairMatches(local.ip, peer)) continue;
      int localPrefix = clampPrefix(local.ip.prefixLen);
      if (localPrefix < bestLocalPrefix) continue;
      if (localPrefix > bestLocalPrefix) {
        best.clear();
        bestLocalPrefix = localPrefix;
      }
      best.push_back(makeRoute(nic, local, peer));
    }
  }
  return best;
}

std::string describeNoRoute(const std::vector<LocalNic>& nics,
                            const std::vector<HandleAddress>& peer) {
  std::string peerText;
  for (const HandleAddress& a : peer) {
    if (!peerText.empty()) peerText += ", ";
    peerText += formatPrefix(Ipv4Prefix{a.addr, a.prefixLen});
  }
  std::string localText;
  for (const LocalNic& nic : nics) {
    std::string label = nic.label.empty() ? "nic " + std::to_string(nic.index) : nic.label;
    for (const LocalAddress& a : nic.addrs) {
      if (!localText.empty()) localText += ", ";
      localText += formatPrefix(a.ip) + " on " + label;
    }
  }
  if (peerText.empty()) peerText = "no addresses";
  if (localText.empty()) localText = "no usable port with an IPv4 address";
  return "no local RoCEv2 port shares a subnet with the peer (peer: " + peerText +
         "; local: " + localText + "); check the cabling and addresses, or NCCL_MESH_HCA";
}

// Both functions of a cable end (a DGX Spark port is two PCIe functions on one wire) can put
// all of them in one subnet: then every local function matches every peer function of that
// subnet. A cable end's functions are paired instead, the i-th local with the i-th peer one
// (wrapping when the counts differ), so that each function at both ends carries one share:
// max(n, m) links rather than n x m, half the QPs on a Spark cable, and each function's
// traffic towards the peer's address of one function only. `routes` holds one route per
// (local nic, peer nic) of one subnet, sorted by local nic, then peer nic.
std::vector<Route> pairFunctions(const std::vector<Route>& routes) {
  std::vector<int> locals, peers;
  for (const Route& r : routes) {
    if (std::find(locals.begin(), locals.end(), r.localNic) == locals.end()) locals.push_back(r.localNic);
    if (std::find(peers.begin(), peers.end(), r.peerNic) == peers.end()) peers.push_back(r.peerNic);
  }
  if (locals.size() < 2 || peers.size() < 2) return routes;  // one function on a side: all pairs
  std::sort(locals.begin(), locals.end());
  std::sort(peers.begin(), peers.end());
  std::vector<Route> out;
  for (size_t i = 0; i < std::max(locals.size(), peers.size()); ++i) {
    int l = locals[i % locals.size()], p = peers[i % peers.size()];
    for (const Route& r : routes) {
      if (r.localNic == l && r.peerNic == p) out.push_back(r);
    }
  }
  return out;
}

// The subnet a route's link is on: the local address under the shorter of both prefixes.
std::pair<uint32_t, int> linkSubnet(const Route& r) {
  uint32_t mask = r.prefixLen == 0 ? 0 : ~uint32_t{0} << (32 - r.prefixLen);
  return {r.local.addr & mask, r.prefixLen};
}

}  // namespace

bool onSameLink(const Ipv4Prefix& a, const Ipv4Prefix& b) {
  return sameSubnet(a.addr, b.addr, a.prefixLen) && sameSubnet(a.addr, b.addr, b.prefixLen);
}

RouteResult routeToPeer(const std::vector<LocalNic>& nics, const std::vector<HandleAddress>& peer) {
  // One route per physical link, keyed by (local nic, peer nic): extra addresses on a
  // netdev are the same cable and must not be striped over as if they were another.
  std::map<std::pair<int, int>, Route> perLink;
  for (const HandleAddress& p : peer) {
    for (const Route& r : routesForPeerAddress(nics, p)) {
      auto key = std::make_pair(r.localNic, static_cast<int>(r.peerNic));
      auto it = perLink.find(key);
      if (it == perLink.end()) {
        perLink.emplace(key, r);
      } else if (linkPreference(r) < linkPreference(it->second)) {
        it->second = r;
      }
    }
  }
  std::map<std::pair<uint32_t, int>, std::vector<Route>> perSubnet;  // perLink's order within each
  for (const auto& entry : perLink) perSubnet[linkSubnet(entry.second)].push_back(entry.second);
  RouteResult result;
  for (const auto& entry : perSubnet) {
    for (const Route& r : pairFunctions(entry.second)) result.routes.push_back(r);
  }
  std::sort(result.routes.begin(), result.routes.end(), [](const Route& a, const Route& b) {
    return std::make_tuple(-static_cast<int>(a.prefixLen), a.localNic, a.peerNic) <
           std::make_tuple(-static_cast<int>(b.prefixLen), b.localNic, b.peerNic);
  });
  if (result.routes.empty()) result.error = describeNoRoute(nics, peer);
  return result;
}

RouteResult connectRoutes(const std::vector<LocalNic>& nics, const std::vector<HandleAddress>& peer,
                          size_t maxLinks) {
  RouteResult result = routeToPeer(nics, peer);
  size_t cap = std::max<size_t>(maxLinks, 1);
  if (result.routes.size() > cap) result.routes.resize(cap);
  return result;
}

HsLink linkForRoute(const Route& route) {
  HsLink l;
  l.senderAddr = route.local.addr;
  l.receiverAddr = route.peerAddr;
  l.senderNic = static_cast<uint8_t>(route.localNic);
  l.receiverNic = route.peerNic;
  l.prefixLen = route.prefixLen;
  return l;
}

RouteResult acceptRoutes(const std::vector<LocalNic>& nics, const std::vector<HsLink>& links) {
  RouteResult result;
  for (const HsLink& link : links) {
    const LocalNic* nic = nullptr;
    for (const LocalNic& n : nics) {
      if (n.index == link.receiverNic) nic = &n;
    }
    const LocalAddress* match = nullptr;
    for (size_t i = 0; nic != nullptr && i < nic->addrs.size(); ++i) {
      const LocalAddress& a = nic->addrs[i];
      if (a.ip.addr == link.receiverAddr && sameSubnet(a.ip.addr, link.senderAddr, a.ip.prefixLen)) {
        match = &a;
      }
    }
    if (match == nullptr) {
      result.routes.clear();
      result.error = "link " + formatIpv4(link.senderAddr) + " -> " + formatIpv4(link.receiverAddr) +
                     " does not match a local port's subnet";
      return result;
    }
    Route r;
    r.localNic = nic->index;
    r.gidIndex = match->gidIndex;
    r.local = match->ip;
    r.peerAddr = link.senderAddr;
    r.peerNic = link.senderNic;
    r.prefixLen = link.prefixLen;
    result.routes.push_back(r);
  }
  if (result.routes.empty()) result.error = "the HELLO names no link";
  return result;
}

}  // namespace mesh
