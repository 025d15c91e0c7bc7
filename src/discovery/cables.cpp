// SPDX-License-Identifier: Apache-2.0
// One grouping of ports into cables for the plugin and the doctor (mesh/discovery/cables.h).
#include "mesh/discovery/cables.h"

#include <cctype>
#include <numeric>

#include "mesh/routing/subnet_routing.h"

namespace mesh {
namespace {

// The PCI address a sysfs device path ends in ("0002:01:00.1"), split at the domain.
bool splitPciAddress(const std::string& path, std::string* domain, std::string* rest) {
  std::string last = path.substr(path.find_last_of('/') + 1);
  size_t colon = last.find(':');
  if (colon == std::string::npos || last.find('.') == std::string::npos || last.size() < 12) return false;
  *domain = last.substr(0, colon);
  *rest = last.substr(colon + 1);
  return true;
}

bool shareSubnet(const CableEnd& a, const CableEnd& b) {
  for (const Ipv4Prefix& x : a.addrs) {
    for (const Ipv4Prefix& y : b.addrs) {
      if (onSameLink(x, y)) return true;
    }
  }
  return false;
}

// A netdev name reduced to what one port's functions share, or "" when no rule applies:
// "enP2p1s0f1np1" and "enp1s0f1np1" -> "p1s0f1np1"; "p3f1" and "p3" -> "p3"; "swf1" and
// "sw" -> "sw".
std::string portKey(const std::string& nd) {
  if (nd.rfind("enP", 0) == 0) {
    size_t p = nd.find('p', 3);
    return p == std::string::npos ? "" : nd.substr(p);
  }
  if (nd.rfind("enp", 0) == 0) return nd.substr(2);
  // The fabric's cable ends: p<digits>[f<digits>], and sw[f<digits>] for a node's cable to a
  // switch (scripts/fabric-net --topology switch).
  size_t i = 0;
  if (nd.rfind("sw", 0) == 0) {
    i = 2;
  } else {
    if (nd.size() < 2 || nd[0] != 'p' || !isdigit(static_cast<unsigned char>(nd[1]))) return "";
    i = 1;
    while (i < nd.size() && isdigit(static_cast<unsigned char>(nd[i]))) ++i;
  }
  if (i == nd.size()) return nd;
  if (nd[i] != 'f' || i + 1 == nd.size()) return "";
  for (size_t j = i + 1; j < nd.size(); ++j) {
    if (!isdigit(static_cast<unsigned char>(nd[j]))) return "";
  }
  return nd.substr(0, i);
}

int findRoot(std::vector<int>& parent, int i) {
  while (parent[i] != i) i = parent[i] = parent[parent[i]];
  return i;
}

}  // namespace

bool socketDirectSiblings(const std::string& pciPathA, const std::string& pciPathB) {
  std::string da, ra, db, rb;
  return splitPciAddress(pciPathA, &da, &ra) && splitPciAddress(pciPathB, &db, &rb) && ra == rb && da != db;
}

bool cableSiblingsByName(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty() || a == b) return false;
  std::string ka = portKey(a), kb = portKey(b);
  return !ka.empty() && ka == kb;
}

std::vector<std::vector<int>> groupCableEnds(const std::vector<CableEnd>& ends) {
  std::vector<int> parent(ends.size());
  std::iota(parent.begin(), parent.end(), 0);
  for (size_t i = 0; i < ends.size(); ++i) {
    for (size_t j = i + 1; j < ends.size(); ++j) {
      const CableEnd& a = ends[i];
      const CableEnd& b = ends[j];
      // A PCI path on both sides decides alone: names only stand in where sysfs says nothing.
      bool byPci = !a.pciPath.empty() && !b.pciPath.empty();
      bool siblings = byPci ? socketDirectSiblings(a.pciPath, b.pciPath) : cableSiblingsByName(a.netdev, b.netdev);
      if (siblings || shareSubnet(a, b)) {
        parent[findRoot(parent, static_cast<int>(j))] = findRoot(parent, static_cast<int>(i));
      }
    }
  }
  std::vector<std::vector<int>> groups;
  std::vector<int> groupOfRoot(ends.size(), -1);
  for (size_t i = 0; i < ends.size(); ++i) {
    int root = findRoot(parent, static_cast<int>(i));
    if (groupOfRoot[root] < 0) {
      groupOfRoot[root] = static_cast<int>(groups.size());
      groups.emplace_back();
    }
    groups[groupOfRoot[root]].push_back(static_cast<int>(i));
  }
  return groups;
}

}  // namespace mesh
