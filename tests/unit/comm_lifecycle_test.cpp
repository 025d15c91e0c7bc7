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
  // Drained: the flushed READ's completion was collected before the QP went (a mutation
  // that skipped the drain passed the whole suite before this check).
  EXPECT_EQ(fake_.unpolledAtDestroy(flushQp), 0) << "the flush QP was destroyed with its flushed READ undrained";
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
  EXPECT_EQ(fake_.unpolledAtDestroyAll().size(), 10u) << "8 data QPs and 2 flush QPs";
  for (const auto& [qpn, unpolled] : fake_.unpolledAtDestroyAll()) {
    EXPECT_EQ(unpolled, 0) << "QP " << qpn << " destroyed with " << unpolled << " completion(s) undrained";
  }
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

// ECE, as NCCL IB negotiates it (2.28.9 net_ib.cc ncclIbConnect / ncclIbAccept, 2.30.7
// net_ib/connect.cc): the sender offers what its QPs query (caps 0x30000003), the receiver sets
// that before RTR and answers what its QPs settled on (AND its caps 0x30000001), the sender sets
// that before its RTR. Every data QP of both ends then runs with 0x30000001; the flush QP is
// not negotiated. A sender that set its own offer would run 0x30000003; a receiver that skipped
// the set, nothing.
std::vector<int64_t> eceOn(const FakeRdma& fake, const std::vector<std::string>& devices) {
  std::vector<int64_t> out;
  for (const std::string& d : devices) {
    for (uint32_t qpn : fake.qpnsOn(d)) out.push_back(fake.eceAtRtr(qpn));
  }
  return out;
}

int eceSetsOn(const FakeRdma& fake, const std::vector<std::string>& devices) {
  int n = 0;
  for (const std::string& d : devices) {
    for (uint32_t qpn : fake.qpnsOn(d)) n += fake.eceSets(qpn);
  }
  return n;
}

constexpr uint32_t kMellanox = 0x15b3;

TEST_F(CommLifecycle, EceIsNegotiatedAsNcclIbDoes) {
  for (const char* d : {"a0", "a1"}) fake_.enableEce(d, kMellanox, 0x30000003);
  for (const char* d : {"b0", "b1"}) fake_.enableEce(d, kMellanox, 0x30000001);
  PairOptions o;
  o.links = 2;
  o.qpsPerLink = 2;
  o.forceFlush = true;
  FifoPair p(fake_, o);
  EXPECT_EQ(eceOn(fake_, {"a0", "a1"}), std::vector<int64_t>(4, 0x30000001));
  EXPECT_EQ(eceOn(fake_, {"b0"}), std::vector<int64_t>({0x30000001, 0x30000001, -1})) << "data QPs, flush QP";
  EXPECT_EQ(eceOn(fake_, {"b1"}), std::vector<int64_t>({0x30000001, 0x30000001, -1}));
  EXPECT_EQ(eceSetsOn(fake_, {"a0", "a1", "b0", "b1"}), 8) << "one set per data QP";
  transfer(p, 1 << 20);
}

// NCCL_IB_ECE_ENABLE=0's counterpart on the connecting node: nothing is offered, so no QP of
// either end is set, whatever the receiver's own setting says.
TEST_F(CommLifecycle, EceOffOnTheSenderSetsNothingAnywhere) {
  fake_.enableEce("a0", kMellanox, 0x30000001);
  fake_.enableEce("b0", kMellanox, 0x30000001);
  PairOptions o;
  o.senderEce = false;
  FifoPair p(fake_, o);
  EXPECT_EQ(eceSetsOn(fake_, {"a0", "b0"}), 0);
  EXPECT_EQ(eceOn(fake_, {"a0", "b0"}), std::vector<int64_t>({-1, -1, -1})) << "b0 has its flush QP too";
  transfer(p, 4096);
}

// A receiver whose provider has no ECE (rxe answers EOPNOTSUPP) answers without, and the
// sender then leaves its QPs alone.
TEST_F(CommLifecycle, EceOnlyOnTheSendersDeviceIsNotUsed) {
  fake_.enableEce("a0", kMellanox, 0x30000001);
  FifoPair p(fake_);
  EXPECT_EQ(eceSetsOn(fake_, {"a0"}), 0);
  EXPECT_EQ(eceOn(fake_, {"a0", "b0"}), std::vector<int64_t>({-1, -1, -1})) << "b0 has its flush QP too";
  transfer(p, 4096);
}

// A sender whose provider has no ECE offers nothing; the receiver's QPs are not set.
TEST_F(CommLifecycle, EceOnlyOnTheReceiversDeviceIsNotUsed) {
  fake_.enableEce("b0", kMellanox, 0x30000001);
  FifoPair p(fake_);
  EXPECT_EQ(eceSetsOn(fake_, {"b0"}), 0);
  EXPECT_EQ(eceOn(fake_, {"a0", "b0"}), std::vector<int64_t>({-1, -1, -1})) << "b0 has its flush QP too";
  transfer(p, 4096);
}

// An ACCEPT that carries ECE the sender never offered (a peer that got it wrong) is not set on
// the sender's QPs: 2.30.7 sets the reduced options only where its own query succeeded.
TEST_F(CommLifecycle, EceTheSenderDidNotOfferIsNotSet) {
  fake_.enableEce("a0", kMellanox, 0x30000001);
  fake_.enableEce("b0", kMellanox, 0x30000001);
  PairOptions o;
  o.senderEce = false;
  o.editAccept = [](HsMessage* accept) {
    accept->links[0].hasEce = true;
    accept->links[0].eceVendor = kMellanox;
    accept->links[0].eceOptions = 0x30000001;
  };
  FifoPair p(fake_, o);
  EXPECT_EQ(eceSetsOn(fake_, {"a0", "b0"}), 0);
  transfer(p, 4096);
}

// A set that fails for another reason than "unsupported" fails the connection, as NCCL's
// wrap_ibv_set_ece does, naming the way out.
TEST_F(CommLifecycle, AFailingEceSetFailsTheConnectionWithAHint) {
  fake_.enableEce("a0", kMellanox, 0x30000001);
  fake_.enableEce("b0", kMellanox, 0x30000001, EIO);
  PairOptions o;
  o.mayFail = true;
  FifoPair p(fake_, o);
  EXPECT_EQ(p.receiverActivated(), ncclSystemError);
  bool hinted = false;
  for (const std::string& w : warnings_.lines()) hinted = hinted || w.find("NCCL_MESH_IB_ECE_ENABLE=0") != std::string::npos;
  EXPECT_TRUE(hinted) << warnings_.last();
}

// nccl-mesh-info's ECE column: a QP made only to ask, destroyed with its CQ afterwards.
TEST_F(CommLifecycle, ProbeEceAsksAFreshQpAndLeavesNothingBehind) {
  Discovery disc;
  addFakePort(fake_, &disc, "p0", 0xC6120001u);
  addFakePort(fake_, &disc, "p1", 0xC6120101u);
  fake_.enableEce("p0", kMellanox, 0x30000001);
  size_t qps = fake_.liveQps(), cqs = fake_.liveCqs();
  Ece ece;
  EXPECT_EQ(probeEce(disc.devices[0].get(), 1, &ece), EceResult::Ok);
  EXPECT_EQ(ece.vendorId, kMellanox);
  EXPECT_EQ(ece.options, 0x30000001u);
  EXPECT_EQ(probeEce(disc.devices[1].get(), 1, &ece), EceResult::Unsupported);
  EXPECT_EQ(fake_.liveQps(), qps);
  EXPECT_EQ(fake_.liveCqs(), cqs);
  disc.devices.clear();
}

TEST_F(CommLifecycle, NoClassAnywhereIsZero) {
  FifoPair p(fake_);
  EXPECT_EQ(classesOn(fake_, {"a0", "b0"}), std::vector<int>({0, 0, 0}));
}

}  // namespace
}  // namespace fake
}  // namespace mesh
