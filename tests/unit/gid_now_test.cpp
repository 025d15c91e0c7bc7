// SPDX-License-Identifier: Apache-2.0
// The GID index of a local address is looked up again at every connect (gidNow, Comm::prepare),
// as NCCL's IB transport does (2.30.7 net_ib/connect.cc: ncclIbGetGidIndex in connect and
// accept): an address removed and added again can come back at another index when IPv6 GIDs
// took its slot meanwhile, and a QP built with the index from init would then send from the
// wrong GID (or fail at RTR).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fake_rdma.h"
#include "fifo_pair.h"
#include "mesh/discovery/nic_discovery.h"
#include "warn_capture.h"

namespace mesh {
namespace fake {
namespace {

constexpr uint32_t kAddr = (198u << 24) | (18u << 16) | 1u;  // 198.18.0.1
constexpr uint32_t kPeer = (198u << 24) | (18u << 16) | 2u;

void linkLocal(uint8_t gid[16]) {
  memset(gid, 0, 16);
  gid[0] = 0xfe;
  gid[1] = 0x80;
  gid[15] = 7;
}

TEST(GidNow, SameMovedGoneOrUnknown) {
  FakeRdma fake;
  ibv_context* ctx = fake.openDevice("d0");
  uint8_t known[16], v6[16];
  mappedGid(kAddr, known);
  linkLocal(v6);
  // Nothing readable: keep what discovery found.
  GidNow now = gidNow(*fake.api(), ctx, "d0", 1, kAddr, 3, known);
  EXPECT_EQ(now.state, GidNow::State::Unknown);
  EXPECT_EQ(now.index, 3);
  fake.setGid("d0", 3, known, true);
  EXPECT_EQ(gidNow(*fake.api(), ctx, "d0", 1, kAddr, 3, known).state, GidNow::State::Same);
  // The address left and came back at index 5; an IPv6 GID took index 3.
  fake.setGid("d0", 3, v6, true);
  fake.setGid("d0", 5, known, true);
  now = gidNow(*fake.api(), ctx, "d0", 1, kAddr, 3, known);
  EXPECT_EQ(now.state, GidNow::State::Moved);
  EXPECT_EQ(now.index, 5);
  EXPECT_EQ(memcmp(now.gid, known, 16), 0);
  // Index 3 holds the address's RoCE v1 GID: not ours either.
  fake.setGid("d0", 3, known, false);
  now = gidNow(*fake.api(), ctx, "d0", 1, kAddr, 3, known);
  EXPECT_EQ(now.state, GidNow::State::Moved);
  EXPECT_EQ(now.index, 5);
  // Gone: only the v1 entry and the IPv6 one are left.
  fake.clearGid("d0", 5);
  fake.setGid("d0", 4, v6, true);
  now = gidNow(*fake.api(), ctx, "d0", 1, kAddr, 3, known);
  EXPECT_EQ(now.state, GidNow::State::Gone);
}

// An rxe port's table is 1024 long. rdma-core passes the table call's buffer length in 16
// bits and refuses a longer one before the kernel is asked (the fake does as it does): sized
// for 1024 x 8 entries, the call failed every time and only sysfs could answer (nothing
// answers here). And an index beyond 255 is one a QP cannot name (8 bits): not the address's.
TEST(GidNow, AnRxeSizedTableIsReadThroughTheTableCallAndIndexesPast255AreNotUsed) {
  FakeRdma fake;
  fake.gidTableLen = 1024;
  ibv_context* ctx = fake.openDevice("d0");
  uint8_t known[16], v6[16];
  mappedGid(kAddr, known);
  linkLocal(v6);
  fake.setGid("d0", 3, v6, true);
  fake.setGid("d0", 5, known, true);
  GidNow now = gidNow(*fake.api(), ctx, "d0", 1, kAddr, 3, known);
  EXPECT_EQ(now.state, GidNow::State::Moved);
  EXPECT_EQ(now.index, 5);
  fake.clearGid("d0", 5);
  fake.setGid("d0", 300, known, true);
  now = gidNow(*fake.api(), ctx, "d0", 1, kAddr, 3, known);
  EXPECT_EQ(now.state, GidNow::State::Gone) << "index " << now.index;
}

class GidRefresh : public ::testing::Test {
 protected:
  ~GidRefresh() override { disc_.devices.clear(); }
  void SetUp() override { addFakePort(fake_, &disc_, "d0", kAddr); }  // GID index 1 at "init"

  // One send comm's HELLO over the port, or the prepare's error.
  ncclResult_t prepare(HsMessage* hello) {
    CommSettings s;
    s.ops = fake_.ops();
    SendComm comm(&disc_, s);
    ncclResult_t rc = comm.prepare({fakeRoute(0, kAddr, kPeer)}, 0, hello);
    comm.close();
    return rc;
  }

  FakeRdma fake_;
  Discovery disc_;
  testing_support::WarnCapture warnings_;
};

TEST_F(GidRefresh, AConnectUsesTheIndexTheTableHasNow) {
  uint8_t gid[16], v6[16];
  mappedGid(kAddr, gid);
  linkLocal(v6);
  fake_.setGid("d0", 1, v6, true);
  fake_.setGid("d0", 4, gid, true);
  HsMessage hello;
  ASSERT_EQ(prepare(&hello), ncclSuccess);
  ASSERT_FALSE(hello.qps.empty());
  for (const HsQp& q : hello.qps) {
    EXPECT_EQ(q.gidIndex, 4);
    EXPECT_EQ(memcmp(q.gid, gid, 16), 0);
  }
  EXPECT_TRUE(warnings_.lines().empty()) << warnings_.last();
}

TEST_F(GidRefresh, AConnectFromAnAddressNoLongerInTheTableFailsNamingIt) {
  uint8_t v6[16];
  linkLocal(v6);
  fake_.setGid("d0", 1, v6, true);
  HsMessage hello;
  EXPECT_EQ(prepare(&hello), ncclSystemError);
  ASSERT_EQ(warnings_.lines().size(), 1u);
  EXPECT_NE(warnings_.last().find("198.18.0.1 has no RoCEv2 GID in the port's GID table any more (its GID index was 1"),
            std::string::npos)
      << warnings_.last();
}

TEST_F(GidRefresh, AnUnchangedTableKeepsTheIndexFromInit) {
  uint8_t gid[16];
  mappedGid(kAddr, gid);
  fake_.setGid("d0", 1, gid, true);
  HsMessage hello;
  ASSERT_EQ(prepare(&hello), ncclSuccess);
  ASSERT_FALSE(hello.qps.empty());
  EXPECT_EQ(hello.qps[0].gidIndex, 1);
}

}  // namespace
}  // namespace fake
}  // namespace mesh
