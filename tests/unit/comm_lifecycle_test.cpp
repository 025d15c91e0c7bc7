// SPDX-License-Identifier: Apache-2.0
// A connection's verbs objects and per-connection settings, over the fake RDMA
// (fifo_pair.h), without hardware:
//  - teardown: every QP moves to ERR and is drained before the memory its WRs name is
//    deregistered, QPs go before their CQ, MRs and QPs before the PD (the fake refuses,
//    and the test reports, any other order);
//  - the GPUDirect flush reads through EVERY device of the comm, as NCCL 2.28.9
//    net_ib.cc ncclIbIflush ("we don't know which devIndex the recv was on, so we flush
//    on all devices"; 2.30.7 net_ib/p2p.cc);
//  - traffic class: NCCL 2.28.9 net_ib.cc ncclIbConnect / 2.30.7 net_ib/connect.cc
//    ncclIbConnectImpl: NCCL_IB_TC when set, else the communicator's trafficClass, else 0;
//    the connector decides and sends it in its metadata, and ncclIbAccept builds the
//    receiver's QPs (flush QP included) with the connector's value, except that
//    NCCL_IB_FIFO_TC, when set on the accepting node, replaces it on the receiver's data QPs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fifo_pair.h"
#include "warn_capture.h"

namespace mesh {
namespace fake {
namespace {

class CommLifecycle : public ::testing::Test {
 protected:
  testing_support::WarnCapture warnings_;

  // One message of `size` bytes through the pair; returns the receiver's buffer.
  Buffer* transfer(FifoPair& p, size_t size) {
    Buffer* dst = p.buffer(false, size);
    Buffer* src = p.buffer(true, size);
    fillPattern(src->data(), size, 3);
    void* data[1] = {dst->data()};
    size_t sizes[1] = {size};
    int tags[1] = {0};
    MrHandle* mh[1] = {&dst->mh};
    Request* recv = nullptr;
    EXPECT_EQ(p.receiver()->irecv(1, data, sizes, tags, mh, &recv), ncclSuccess);
    EXPECT_NE(recv, nullptr);
    fake_.run();
    Request* send = nullptr;
    EXPECT_EQ(p.sender()->isend(src->data(), size, 0, &src->mh, &send), ncclSuccess);
    EXPECT_NE(send, nullptr);
    EXPECT_TRUE(p.waitDone(recv));
    EXPECT_TRUE(p.waitDone(send));
    EXPECT_TRUE(matchesPattern(dst->data(), size, 3));
    return dst;
  }

  Request* flush(FifoPair& p, Buffer* b, size_t size) {
    void* data[1] = {b->data()};
    int sizes[1] = {static_cast<int>(size)};
    MrHandle* mh[1] = {&b->mh};
    Request* req = nullptr;
    EXPECT_EQ(p.receiver()->iflush(1, data, sizes, mh, &req), ncclSuccess);
    return req;
  }

  // The lkey of the first MR registered on `device` (a comm's control region: the pair
  // registers its buffers only after both comms exist).
  std::string firstMrOn(const std::string& device) const {
    for (const std::string& e : fake_.events()) {
      if (e.rfind("reg_mr " + device + " ", 0) == 0) return e.substr(e.rfind(' ') + 1);
    }
    return "?";
  }

  FakeRdma fake_;
};

// The receiver's flush QP has a READ in flight when the comm closes: it must be moved to
// ERR and drained, and destroyed, before the control memory its WR names is deregistered.
TEST_F(CommLifecycle, FlushQpIsDrainedAndDestroyedBeforeItsMemoryGoes) {
  PairOptions o;
  o.forceFlush = true;
  FifoPair p(fake_, o);
  Buffer* dst = transfer(p, 4096);
  ASSERT_NE(flush(p, dst, 4096), nullptr);
  ASSERT_EQ(fake_.queued(), 1u) << "the flush READ is queued, not executed";
  std::string ctrlMr = firstMrOn("b0");
  std::vector<uint32_t> qps = fake_.qpnsOn("b0");
  ASSERT_EQ(qps.size(), 2u) << "b0 holds the data QP and the flush QP";
  uint32_t flushQp = qps.back();
  p.closeComms();
  int err = fake_.eventIndex("qp_err " + std::to_string(flushQp));
  int destroyed = fake_.eventIndex("destroy_qp " + std::to_string(flushQp));
  int dereg = fake_.eventIndex("dereg_mr b0 " + ctrlMr);
  ASSERT_GE(dereg, 0) << "the control MR was never deregistered";
  EXPECT_GE(err, 0) << "the flush QP never went to ERR";
  EXPECT_LT(err, dereg) << "flush QP to ERR after its MR was deregistered";
  EXPECT_GE(destroyed, 0);
  EXPECT_LT(destroyed, dereg) << "flush QP destroyed after its MR was deregistered";
}

// After both comms and the devices are gone, nothing is left and nothing was refused.
TEST_F(CommLifecycle, EveryVerbsObjectIsReleasedOnceInOrder) {
  PairOptions o;
  o.links = 2;
  o.qpsPerLink = 2;
  o.forceFlush = true;
  {
    FifoPair p(fake_, o);
    Buffer* dst = transfer(p, 300000);
    ASSERT_NE(flush(p, dst, 300000), nullptr);
  }
  EXPECT_EQ(fake_.liveQps(), 0u);
  EXPECT_EQ(fake_.liveCqs(), 0u);
  EXPECT_EQ(fake_.liveMrs(), 0u);
  EXPECT_EQ(fake_.livePds(), 0u);
  EXPECT_TRUE(warnings_.lines().empty()) << warnings_.lines().front();
}

// Data striped over two links lands through two devices: the flush reads through both.
TEST_F(CommLifecycle, FlushReadsThroughEveryDeviceOfTheComm) {
  PairOptions o;
  o.links = 2;
  o.forceFlush = true;
  o.splitMin = 1024;
  FifoPair p(fake_, o);
  Buffer* dst = transfer(p, 100000);
  Request* req = flush(p, dst, 100000);
  ASSERT_NE(req, nullptr);
  ASSERT_TRUE(p.waitDone(req));
  EXPECT_EQ(fake_.readsExecuted("b0"), 1);
  EXPECT_EQ(fake_.readsExecuted("b1"), 1) << "no flush through the second link's device";
}

std::vector<int> classesOn(const FakeRdma& fake, const std::vector<std::string>& devices) {
  std::vector<int> out;
  for (const std::string& d : devices) {
    for (uint32_t qpn : fake.qpnsOn(d)) out.push_back(fake.trafficClass(qpn));
  }
  return out;
}

// The communicator's class (no NCCL_MESH_IB_TC anywhere) on every QP of both ends,
// the receiver's flush QP included.
TEST_F(CommLifecycle, TheReceiverUsesTheClassTheSenderChose) {
  PairOptions o;
  o.connTc = 96;
  o.forceFlush = true;
  FifoPair p(fake_, o);
  EXPECT_EQ(classesOn(fake_, {"a0"}), std::vector<int>({96}));
  EXPECT_EQ(classesOn(fake_, {"b0"}), std::vector<int>({96, 96})) << "receiver's data QP, flush QP";
}

// NCCL_IB_TC's counterpart wins over the communicator's class; the sender's node decides.
TEST_F(CommLifecycle, TheEnvironmentWinsOverTheCommunicatorsClass) {
  PairOptions o;
  o.connTc = 96;
  o.senderEnvTc = 32;
  o.receiverEnvTc = 40;
  FifoPair p(fake_, o);
  EXPECT_EQ(classesOn(fake_, {"a0"}), std::vector<int>({32}));
  EXPECT_EQ(classesOn(fake_, {"b0"}), std::vector<int>({32, 32}));
}

// NCCL_IB_FIFO_TC's counterpart: the receiving node's own setting, on its data QPs only (they
// carry its credits and ACKs); the flush QP and every sender QP keep the connection's class. A
// sender's setting changes nothing (NCCL reads it in ncclIbAccept only).
TEST_F(CommLifecycle, TheReceiversFifoClassIsOnItsDataQpsOnly) {
  PairOptions o;
  o.links = 2;
  o.qpsPerLink = 2;
  o.connTc = 96;
  o.senderFifoTc = 8;
  o.receiverFifoTc = 184;
  o.forceFlush = true;
  FifoPair p(fake_, o);
  EXPECT_EQ(classesOn(fake_, {"a0", "a1"}), std::vector<int>({96, 96, 96, 96}));
  EXPECT_EQ(classesOn(fake_, {"b0"}), std::vector<int>({184, 184, 96})) << "two data QPs, then the flush QP";
  EXPECT_EQ(classesOn(fake_, {"b1"}), std::vector<int>({184, 184, 96}));
}

TEST_F(CommLifecycle, NoClassAnywhereIsZero) {
  FifoPair p(fake_);
  EXPECT_EQ(classesOn(fake_, {"a0", "b0"}), std::vector<int>({0, 0, 0}));
}

}  // namespace
}  // namespace fake
}  // namespace mesh
