// SPDX-License-Identifier: Apache-2.0
// The cables of a node: which RDMA ports (or their netdevs) drive one wire. One rule, used by
// the plugin (the node device's speed, nccl-mesh-info's cable list) and by the doctor (how
// many peers a node is cabled to), so the two never disagree (issue 32). Pure code,
// unit-tested.
//
// Ends are one cable's functions when
//  - they are one port's PCIe functions in Socket Direct (a DGX Spark port: the same
//    bus:device.function in two PCI domains, e.g. 0000:01:00.1 and 0002:01:00.1), or
//  - they have IPv4 addresses in one subnet (a switchless mesh gives every cable a subnet:
//    two ports in one are the functions of one cable end, NVIDIA's Spark addressing), or
//  - their netdev names say so where no PCI path does (a container without sysfs, the
//    userspace fabric): DGX Spark names a port's two functions alike but for the PCI domain
//    (enp1s0f1np1 and enP2p1s0f1np1), and scripts/fabric-net names the second function of
//    the cable to node j p<j>f1 beside p<j>.
// Every other end is a cable of its own.
#pragma once

#include <string>
#include <vector>

#include "mesh/platform/ipv4.h"

namespace mesh {

struct CableEnd {
  std::string netdev;               // "" unknown
  std::string pciPath;              // sysfs device path; "" unknown
  std::vector<Ipv4Prefix> addrs;    // its IPv4 addresses with prefixes
};

// Groups of indexes into `ends`, each sorted, in the order of their first end.
std::vector<std::vector<int>> groupCableEnds(const std::vector<CableEnd>& ends);

// True for two PCI paths of one Socket Direct port: equal bus:device.function, different domain.
bool socketDirectSiblings(const std::string& pciPathA, const std::string& pciPathB);
// True for two netdev names of one port's functions (the naming rules above).
bool cableSiblingsByName(const std::string& netdevA, const std::string& netdevB);

}  // namespace mesh
