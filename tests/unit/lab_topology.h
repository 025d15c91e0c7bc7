// SPDX-License-Identifier: Apache-2.0
// The lab's addressing for routing tests (subnet routing, relay routes): link L between
// nodes a < b is 198.18.L.0/24, node n has 198.18.L.(n+1) on it, and a node's NICs are its
// links in link order, labelled rxe_l<L>:1 with GID index 10 + L.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mesh/routing/subnet_routing.h"
#include "mesh/wire/handle_codec.h"

namespace mesh {
namespace lab {

struct Link {
  int id;
  int a;
  int b;
};

inline uint32_t linkAddr(int linkId, int node) {
  return 0xC6120000u | static_cast<uint32_t>(linkId) << 8 | static_cast<uint32_t>(node + 1);
}

inline Ipv4Prefix linkSubnet(int linkId) { return Ipv4Prefix{linkAddr(linkId, -1), 24}; }

inline std::vector<LocalNic> nodeNics(const std::vector<Link>& links, int node) {
  std::vector<LocalNic> nics;
  for (const Link& l : links) {
    if (l.a != node && l.b != node) continue;
    LocalNic nic;
    nic.index = static_cast<int>(nics.size());
    nic.label = "rxe_l" + std::to_string(l.id) + ":1";
    nic.addrs.push_back({{linkAddr(l.id, node), 24}, 10 + l.id});
    nics.push_back(nic);
  }
  return nics;
}

// What `node` puts in its listen handle: every address, tagged with its NIC index.
inline std::vector<HandleAddress> nodeHandle(const std::vector<Link>& links, int node) {
  std::vector<HandleAddress> out;
  for (const LocalNic& nic : nodeNics(links, node)) {
    for (const LocalAddress& a : nic.addrs) {
      out.push_back({a.ip.addr, a.ip.prefixLen, static_cast<uint8_t>(nic.index)});
    }
  }
  return out;
}

// The index of `node`'s NIC on link linkId, or -1 when the node is not on it.
inline int nicOnLink(const std::vector<Link>& links, int node, int linkId) {
  int index = 0;
  for (const Link& l : links) {
    if (l.a != node && l.b != node) continue;
    if (l.id == linkId) return index;
    ++index;
  }
  return -1;
}

}  // namespace lab
}  // namespace mesh
