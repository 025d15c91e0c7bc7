// SPDX-License-Identifier: Apache-2.0
// Pure parts of NIC discovery: GID decoding, speed/MTU tables, the sysfs GID fallback.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "mesh/discovery/nic_discovery.h"

namespace mesh {
namespace {

TEST(GidToIpv4, DecodesIpv4MappedGid) {
  uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 2, 3};
  uint32_t addr = 0;
  ASSERT_TRUE(gidToIpv4(gid, &addr));
  EXPECT_EQ(formatIpv4(addr), "198.18.2.3");
}

TEST(GidToIpv4, RejectsLinkLocalAndZeroAddress) {
  uint8_t linkLocal[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56};
  uint8_t zero[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};
  uint32_t addr = 0;
  EXPECT_FALSE(gidToIpv4(linkLocal, &addr));
  EXPECT_FALSE(gidToIpv4(zero, &addr));
}

TEST(PortSpeed, MultipliesLaneRateByWidth) {
  EXPECT_EQ(portSpeedMbps(32, 2), 100000);   // EDR 4x
  EXPECT_EQ(portSpeedMbps(64, 2), 200000);   // HDR 4x
  EXPECT_EQ(portSpeedMbps(128, 2), 400000);  // NDR 4x
  EXPECT_EQ(portSpeedMbps(1, 1), 2500);      // SDR 1x
  EXPECT_EQ(portSpeedMbps(256, 2), 800000);  // XDR 4x (active_speed_ex)
  EXPECT_EQ(portSpeedMbps(64, 16), 100000);  // HDR 2x
  EXPECT_EQ(portSpeedMbps(0, 2), 0);         // no speed reported
  EXPECT_EQ(portSpeedMbps(32, 0), 0);        // no width reported
}

// NCCL's IB transport reads a code by its lowest set bit, and a bit past its table as the
// table's last entry: a rate newer than both of us is reported as XDR, never as unknown (0,
// which NCCL's topology would take for 10 Gb/s).
TEST(PortSpeed, ReadsCodesAsNcclsIbTransportDoes) {
  EXPECT_EQ(portSpeedMbps(512, 2), 800000);     // a rate past XDR: XDR's lanes
  EXPECT_EQ(portSpeedMbps(32 | 64, 2), 100000);  // lowest bit: EDR
  EXPECT_EQ(portSpeedMbps(32, 32), 50000);      // a width past 2X: 2 lanes, as NCCL
}

// NCCL 2.30 asks ibv_query_port_speed first (rdma-core 62; 100 Mb/s units), then
// active_speed_ex (rdma-core 49; XDR does not fit active_speed's 8 bits), then active_speed.
TEST(PortSpeed, PrefersQueryPortSpeedThenActiveSpeedEx) {
  EXPECT_EQ(reportedPortSpeedMbps(0, 2000, 256, 0, 2), 200000);         // the query answers
  EXPECT_EQ(reportedPortSpeedMbps(EOPNOTSUPP, 0, 256, 0, 2), 800000);  // no query: XDR 4x
  EXPECT_EQ(reportedPortSpeedMbps(0, 0, 256, 0, 2), 800000);           // the query says 0
  EXPECT_EQ(reportedPortSpeedMbps(EOPNOTSUPP, 0, 0, 64, 2), 200000);   // rdma-core < 49
  EXPECT_EQ(reportedPortSpeedMbps(0, uint64_t{1} << 40, 0, 64, 2), INT_MAX);  // clamped
}

TEST(Mtu, ConvertsBothWays) {
  EXPECT_EQ(mtuToBytes(IBV_MTU_1024), 1024);
  EXPECT_EQ(mtuToBytes(IBV_MTU_4096), 4096);
  EXPECT_EQ(mtuToBytes(0), 0);
  EXPECT_EQ(bytesToMtu(4096), IBV_MTU_4096);
  EXPECT_EQ(bytesToMtu(256), IBV_MTU_256);
  EXPECT_EQ(bytesToMtu(1500), 0);
}

TEST(ParseGidText, ParsesSysfsFormat) {
  uint8_t gid[16];
  ASSERT_TRUE(parseGidText("0000:0000:0000:0000:0000:ffff:c612:0001\n", gid));
  uint32_t addr = 0;
  ASSERT_TRUE(gidToIpv4(gid, &addr));
  EXPECT_EQ(formatIpv4(addr), "198.18.0.1");
  EXPECT_FALSE(parseGidText("not a gid", gid));
}

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mesh-sysfs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    base_ = root_ + "/class/infiniband/rxe_p1/ports/1";
    ASSERT_EQ(system(("mkdir -p " + base_ + "/gids " + base_ + "/gid_attrs/types " + base_ +
                      "/gid_attrs/ndevs").c_str()), 0);
  }
  void TearDown() override { ASSERT_EQ(system(("rm -rf " + root_).c_str()), 0); }
  void put(const std::string& rel, const std::string& text) {
    std::ofstream(base_ + "/" + rel) << text << "\n";
  }
  std::string root_, base_;
};

TEST_F(FakeSysfs, ReadsRoceV2EntriesWithNetdev) {
  put("gids/0", "fe80:0000:0000:0000:5054:00ff:fe12:3456");
  put("gid_attrs/types/0", "RoCE v2");
  put("gid_attrs/ndevs/0", "p1");
  put("gids/1", "0000:0000:0000:0000:0000:ffff:c612:0001");
  put("gid_attrs/types/1", "RoCE v2");
  put("gid_attrs/ndevs/1", "p1");
  put("gids/2", "0000:0000:0000:0000:0000:ffff:c612:0001");
  put("gid_attrs/types/2", "IB/RoCE v1");
  put("gid_attrs/ndevs/2", "p1");
  put("gids/3", "0000:0000:0000:0000:0000:0000:0000:0000");  // unused slot
  auto gids = readSysfsGids(root_, "rxe_p1", 1, 8);
  ASSERT_EQ(gids.size(), 3u);
  EXPECT_EQ(gids[1].index, 1);
  EXPECT_TRUE(gids[1].rocev2);
  EXPECT_EQ(gids[1].netdev, "p1");
  EXPECT_FALSE(gids[2].rocev2);
}

TEST_F(FakeSysfs, MissingDeviceYieldsNothing) {
  EXPECT_TRUE(readSysfsGids(root_, "nope", 1, 4).empty());
}

}  // namespace
}  // namespace mesh
