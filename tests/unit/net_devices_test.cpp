// SPDX-License-Identifier: Apache-2.0
// The devices NCCL sees (net_devices.h): node mode's PCI path and GUID, per-port mode's
// exact values, the capabilities a node device can promise.
#include "mesh/net_devices.h"

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

// Ports on two PCI devices (two functions of one card, or two cards on different sockets):
// no single position is true, so no PCI path; NCCL then attaches the device to a CPU
// (xml.cc ncclTopoFillNet) instead of trusting the first port's GPU distance.
TEST(NetDevices, NodeModeOnSeveralPciDevicesReportsNoPciPath) {
  for (const char* second : {kFnB, kFarNic}) {
    std::vector<NetDevice> d = makeNetDevices({port("mlx5_0", kFnA, 0xa), port("mlx5_1", second, 0xb)},
                                              mode(DeviceMode::Node));
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].pciPath, "") << second;
    EXPECT_EQ(d[0].guid, 0xau) << "the first port's GUID";
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
