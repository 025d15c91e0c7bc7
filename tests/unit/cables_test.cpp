// SPDX-License-Identifier: Apache-2.0
// One grouping of a node's ports into cables for the plugin and the doctor
// (mesh/discovery/cables.h, issue 32): DGX Spark's Socket Direct functions, both address
// plans (both functions in the cable's subnet, or one subnet each), the fabric's names.
#include <gtest/gtest.h>

#include "mesh/discovery/cables.h"

namespace mesh {
namespace {

Ipv4Prefix net(uint8_t c, uint8_t d, uint8_t len = 24) {
  return Ipv4Prefix{(198u << 24) | (18u << 16) | (uint32_t{c} << 8) | d, len};
}

using Groups = std::vector<std::vector<int>>;

TEST(Cables, SparkFunctionsByPciPathInEitherAddressPlan) {
  const char* f0 = "/sys/devices/pci0000:00/0000:00:00.0/0000:01:00.1";
  const char* f1 = "/sys/devices/pci0002:00/0002:00:00.0/0002:01:00.1";
  const char* g0 = "/sys/devices/pci0000:00/0000:00:00.0/0000:01:00.0";
  const char* g1 = "/sys/devices/pci0002:00/0002:00:00.0/0002:01:00.0";
  // One subnet per function: only the PCI paths tell.
  std::vector<CableEnd> split = {{"enp1s0f1np1", f0, {net(0, 1)}}, {"enP2p1s0f1np1", f1, {net(0, 129, 25)}},
                                 {"enp1s0f0np0", g0, {net(1, 1)}}, {"enP2p1s0f0np0", g1, {net(2, 1)}}};
  EXPECT_EQ(groupCableEnds(split), (Groups{{0, 1}, {2, 3}}));
  // Both in the cable's subnet: the subnet tells too.
  std::vector<CableEnd> shared = split;
  shared[1].addrs = {net(0, 2)};
  EXPECT_EQ(groupCableEnds(shared), (Groups{{0, 1}, {2, 3}}));
}

TEST(Cables, NamesStandInWhereSysfsSaysNothing) {
  // The fabric: p<j> and p<j>f1, one subnet each, no PCI path.
  std::vector<CableEnd> fabric = {{"p1", "", {net(0, 1)}}, {"p1f1", "", {net(0, 129, 25)}},
                                  {"p2", "", {net(1, 1)}}, {"p2f1", "", {net(1, 129, 25)}}};
  EXPECT_EQ(groupCableEnds(fabric), (Groups{{0, 1}, {2, 3}}));
  // A node's cable to the fabric's switch: sw and swf1, one subnet each (--fn-subnets split).
  std::vector<CableEnd> switched = {{"sw", "", {net(0, 1)}}, {"swf1", "", {net(1, 1)}}};
  EXPECT_EQ(groupCableEnds(switched), (Groups{{0, 1}}));
  EXPECT_FALSE(cableSiblingsByName("sw", "swp1"));
  EXPECT_FALSE(cableSiblingsByName("sw", "sw2"));
  // Spark names in a container without sysfs.
  EXPECT_TRUE(cableSiblingsByName("enp1s0f1np1", "enP2p1s0f1np1"));
  EXPECT_FALSE(cableSiblingsByName("enp1s0f1np1", "enp1s0f0np0"));    // two ports of one NIC
  EXPECT_FALSE(cableSiblingsByName("enP2p1s0f1np1", "enP2p1s0f0np0"));
  // The lab's parallel cables (p1, p1b) are two cables, however alike their names.
  EXPECT_FALSE(cableSiblingsByName("p1", "p1b"));
  EXPECT_FALSE(cableSiblingsByName("p1", "p12"));
  EXPECT_FALSE(cableSiblingsByName("p1", "p1"));
}

TEST(Cables, PciPathsDecideOverNames) {
  // Two ports whose names look like functions of one but whose PCI paths say two NICs.
  std::vector<CableEnd> ends = {{"p1", "/sys/devices/pci0000:00/0000:01:00.0", {net(0, 1)}},
                                {"p1f1", "/sys/devices/pci0000:00/0000:02:00.0", {net(1, 1)}}};
  EXPECT_EQ(groupCableEnds(ends), (Groups{{0}, {1}}));
  EXPECT_TRUE(socketDirectSiblings("/x/0000:01:00.1", "/y/0002:01:00.1"));
  EXPECT_FALSE(socketDirectSiblings("/x/0000:01:00.1", "/y/0000:01:00.1"));
}

}  // namespace
}  // namespace mesh
