// SPDX-License-Identifier: Apache-2.0
// The devices NCCL sees (net_devices.h): node mode's PCI path and GUID, per-port mode's
// exact values, the capabilities a node device can promise.
#include "mesh/plugin/net_devices.h"

#include <gtest/gtest.h>

namespace mesh {
namespace {

MeshPort port(const std::string& dev, const std::string& pci, uint64_t guid, bool gdr = false) {
  MeshPort p;
  p.device = dev;
  p.port = 1;
  p.pciPath = pci;
  p.guid = guid;
  p.speedMbps = 100000;
  p.gdr = gdr;
  return p;
}

Config mode(DeviceMode m) {
  Config c;
  c.devices = m;
  return c;
}

const char* kFnA = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
const char* kFnB = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1";
const char* kFarNic = "/sys/devices/pci0000:80/0000:80:02.0/0000:81:00.0";

// A dual-port NIC on one PCI function: the node device sits exactly there.
TEST(NetDevices, NodeModeOnOnePciFunctionReportsThatFunction) {
  std::vector<NetDevice> d = makeNetDevices({port("mlx5_0", kFnA, 0xa), port("mlx5_0", kFnA, 0xa)},
                                            mode(DeviceMode::Node));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].pciPath, kFnA);
  EXPECT_EQ(d[0].guid, 0xau);
  EXPECT_EQ(d[0].ports, std::vector<int>({0, 1}));
}

// Ports on two PCI devices (two cards, on different sockets, or a DGX Spark's two PCIe
// domains): no single position is true, so no PCI path; NCCL then attaches the device to a
// CPU (xml.cc ncclTopoFillNet) instead of trusting the first port's GPU distance.
TEST(NetDevices, NodeModeOnSeveralPciDevicesReportsNoPciPath) {
  const char* otherDomain = "/sys/devices/pci0002:00/0002:00:00.0/0002:01:00.1";
  for (const char* second : {kFarNic, otherDomain}) {
    std::vector<NetDevice> d = makeNetDevices({port("mlx5_0", kFnA, 0xa), port("mlx5_1", second, 0xb)},
                                              mode(DeviceMode::Node));
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].pciPath, "") << second;
    EXPECT_EQ(d[0].guid, 0xau) << "the first port's GUID";
  }
}

// The two ports of a dual-port ConnectX are two functions of one PCI device, at one PCIe
// position: the node device sits at function 0, where NCCL's IB transport puts every port
// of a multi-port NIC (net_ib ncclIbGetPciPath), so NCCL's GPUDirect and affinity choices see
// the card (with no PCI path they saw a CPU-attached NIC and staged through host memory).
TEST(NetDevices, NodeModeOnTheFunctionsOfOneCardReportsFunctionZero) {
  for (const auto& pair : {std::make_pair(kFnA, kFnB), std::make_pair(kFnB, kFnA), std::make_pair(kFnB, kFnB)}) {
    std::vector<NetDevice> d = makeNetDevices({port("mlx5_0", pair.first, 0xa), port("mlx5_1", pair.second, 0xb)},
                                              mode(DeviceMode::Node));
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].pciPath, kFnA) << pair.first << " + " << pair.second;
  }
}

// A node device promises GPUDirect only when every port can do it.
TEST(NetDevices, NodeModeCapabilitiesAreWhatEveryPortCanDo) {
  std::vector<NetDevice> d = makeNetDevices({port("a", kFnA, 1, true), port("b", kFnB, 2, false)},
                                            mode(DeviceMode::Node));
  EXPECT_EQ(d[0].ptrSupport, kPtrHost);
  d = makeNetDevices({port("a", kFnA, 1, true), port("b", kFnB, 2, true)}, mode(DeviceMode::Node));
  EXPECT_EQ(d[0].ptrSupport, kPtrHost | kPtrCuda);
}

TEST(NetDevices, PortModeIsExactPerPort) {
  std::vector<NetDevice> d = makeNetDevices({port("mlx5_0", kFnA, 0xa), port("mlx5_1", kFarNic, 0xb)},
                                            mode(DeviceMode::Port));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].name, "mlx5_0:1");
  EXPECT_EQ(d[0].pciPath, kFnA);
  EXPECT_EQ(d[0].guid, 0xau);
  EXPECT_EQ(d[1].pciPath, kFarNic);
  EXPECT_EQ(d[1].guid, 0xbu);
  EXPECT_EQ(d[1].ports, std::vector<int>({1}));
}

// ncclNet v12: one rail and one plane for the whole mesh, in both modes (NCCL 2.30
// search.cc ncclTopoSearchCheckNet lets a channel leave through another device of the same
// rail, and forbids crossing planes).
TEST(NetDevices, EveryDeviceIsOnRailZeroAndPlaneZero) {
  for (DeviceMode m : {DeviceMode::Node, DeviceMode::Port}) {
    for (const NetDevice& d : makeNetDevices({port("a", kFnA, 1), port("b", kFarNic, 2)}, mode(m))) {
      EXPECT_EQ(d.railId, 0);
      EXPECT_EQ(d.planeId, 0);
    }
  }
}

TEST(NetDevices, NoPortsNoDevices) { EXPECT_TRUE(makeNetDevices({}, Config()).empty()); }

}  // namespace
}  // namespace mesh

namespace mesh {
namespace {

MeshPort sparkFunction(const std::string& dev, const std::string& pci, const char* prefix, int mbps) {
  MeshPort p = port(dev, pci, 0x1);
  p.speedMbps = mbps;
  PortAddress a;
  EXPECT_TRUE(parsePrefix(prefix, &a.ip)) << prefix;
  p.addrs.push_back(a);
  return p;
}

// A DGX Spark port: rocep1s0f1 and roceP2p1s0f1 are one port's two PCIe x4 functions
// (Socket Direct), each reporting the port's 200G link speed.
const char* kSparkA = "/sys/devices/pci0000:00/0000:00:00.0/0000:01:00.1";
const char* kSparkB = "/sys/devices/pci0002:00/0002:00:00.0/0002:01:00.1";

TEST(Cables, SocketDirectFunctionsAreOneCableAtTheLinkSpeed) {
  EXPECT_TRUE(socketDirectSiblings(kSparkA, kSparkB));
  EXPECT_FALSE(socketDirectSiblings(kSparkA, kSparkA));  // the same function
  EXPECT_FALSE(socketDirectSiblings(kFnA, kFnB));        // two functions of one domain: two ports
  EXPECT_FALSE(socketDirectSiblings("", kSparkB));
  // Each function its own subnet (one Spark addressing): still one cable, by PCI identity.
  std::vector<MeshPort> ports = {sparkFunction("rocep1s0f1", kSparkA, "198.18.0.1/24", 200000),
                                 sparkFunction("roceP2p1s0f1", kSparkB, "198.18.128.1/24", 200000),
                                 sparkFunction("rocep1s0f0", kFnA, "198.18.1.1/24", 200000)};
  auto cables = cableGroups(ports);
  ASSERT_EQ(cables.size(), 2u);
  EXPECT_EQ(cables[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(cables[1], (std::vector<int>{2}));
  EXPECT_EQ(cableSpeedMbps(ports, cables[0]), 200000);
  std::vector<NetDevice> devs = makeNetDevices(ports, mode(DeviceMode::Node));
  ASSERT_EQ(devs.size(), 1u);
  EXPECT_EQ(devs[0].speedMbps, 200000);
}

TEST(Cables, PortsInOneSubnetAreOneCableAndTheirSpeedsAddUp) {
  // Two ports of 100G in one subnet (the fabric's two functions per cable end, no PCI
  // identity): one peer gets both, 200G; a third port on another cable is its own.
  std::vector<MeshPort> ports = {sparkFunction("fab_p1", "", "198.18.0.1/24", 100000),
                                 sparkFunction("fab_p2", "", "198.18.1.1/24", 100000),
                                 sparkFunction("fab_p1f1", "", "198.18.0.129/24", 100000)};
  auto cables = cableGroups(ports);
  ASSERT_EQ(cables.size(), 2u);
  EXPECT_EQ(cables[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(cableSpeedMbps(ports, cables[0]), 200000);
  EXPECT_EQ(cableSpeedMbps(ports, cables[1]), 100000);
  EXPECT_EQ(makeNetDevices(ports, mode(DeviceMode::Node))[0].speedMbps, 200000);
  // Per-port mode stays exact per port; NCCL_MESH_SPEED still wins.
  EXPECT_EQ(makeNetDevices(ports, mode(DeviceMode::Port))[0].speedMbps, 100000);
  Config fixed = mode(DeviceMode::Node);
  fixed.speedMbps = 12345;
  EXPECT_EQ(makeNetDevices(ports, fixed)[0].speedMbps, 12345);
}

TEST(Cables, SeparateCablesAreSeparate) {
  std::vector<MeshPort> ports = {sparkFunction("a", kFnA, "198.18.0.1/24", 100000),
                                 sparkFunction("b", kFnB, "198.18.1.1/24", 200000)};
  auto cables = cableGroups(ports);
  ASSERT_EQ(cables.size(), 2u);
  // The node device: the fastest cable, not the sum of cables to different peers.
  EXPECT_EQ(makeNetDevices(ports, mode(DeviceMode::Node))[0].speedMbps, 200000);
}

}  // namespace
}  // namespace mesh
