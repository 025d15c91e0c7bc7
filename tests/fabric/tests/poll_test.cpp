// SPDX-License-Identifier: Apache-2.0
// ibv_poll_cq on the fabric (lib/cq.cpp) against the fabric's lock: a real CQ is memory the
// NIC writes, so polling it never waits for the NIC. Spinning pollers (NCCL's proxy, the
// plugin's relay thread) that queued for the lock on every empty poll starved the NIC thread
// of it for seconds on a 2-core host, and every send of the process stopped meanwhile.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>

#include "../lib/fabric.h"

namespace meshfab {
int pollCq(ibv_cq* icq, int n, ibv_wc* wc);

namespace {

constexpr auto kDeadline = std::chrono::seconds(10);  // a hang guard, not a speed target

TEST(FabricPollCq, EmptyCqReturnsWhileTheNicHoldsTheLock) {
  Fabric* f = Fabric::get();
  Cq cq;
  cq.ring.resize(8);
  std::unique_lock<std::mutex> nic(f->mu);  // the NIC thread (or another poller) is inside
  auto poll = std::async(std::launch::async, [&cq] {
    ibv_wc wc[4];
    return pollCq(&cq.cq, 4, wc);
  });
  bool returned = poll.wait_for(kDeadline) == std::future_status::ready;
  nic.unlock();
  EXPECT_TRUE(returned) << "poll_cq on an empty CQ queued for the lock the NIC thread held";
  EXPECT_EQ(poll.get(), 0);
}

TEST(FabricPollCq, VisibleCompletionIsReturnedThoughTheLockIsBusy) {
  Fabric* f = Fabric::get();
  Qp qp;
  Cq cq;
  cq.ring.resize(8);
  {
    std::lock_guard<std::mutex> g(f->mu);
    cq.ring[0].wc.wr_id = 42;
    cq.ring[0].wc.status = IBV_WC_SUCCESS;
    cq.ring[0].send = true;
    cq.ring[0].qp = &qp;
    cq.ring[0].wqe = 0;
    cq.count = 1;
  }
  std::unique_lock<std::mutex> nic(f->mu);
  auto poll = std::async(std::launch::async, [&cq] {
    ibv_wc wc[4];
    int n = pollCq(&cq.cq, 4, wc);
    return n == 1 ? static_cast<int>(wc[0].wr_id) : -n;
  });
  nic.unlock();  // before or after the poller found it busy: it must wait and take the entry
  ASSERT_EQ(poll.wait_for(kDeadline), std::future_status::ready);
  EXPECT_EQ(poll.get(), 42) << "a completion in the CQ was not returned";
  EXPECT_EQ(cq.count.load(), 0u);
  EXPECT_EQ(qp.sqFree, 1u);
}

}  // namespace
}  // namespace meshfab
