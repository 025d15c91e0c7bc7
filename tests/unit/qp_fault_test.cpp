// SPDX-License-Identifier: Apache-2.0
// Resource exhaustion in the QP lifecycle, without RDMA: a fake verbs table hands out
// CQs and QPs it owns, counts every create and destroy, and fails the calls a test names
// (ENOMEM as when the device's max_qp is reached, EINVAL for bad capacities, errors on
// ibv_modify_qp). The WARN lines are captured through the logger hook.
#include "mesh/rdma/qp.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "mesh/discovery/nic_discovery.h"
#include "mesh/platform/log.h"

namespace mesh {
namespace {

// --- the fake device ---------------------------------------------------------------------

struct FakeVerbs {
  // Device attributes reported by ibv_query_device.
  int maxQp = 64;
  int maxQpWr = 1024;
  int maxCq = 16;
  int maxCqe = 4096;

  // Failure injection. *CallAt: the Nth call (1-based) fails with *Errno; 0 = never.
  int failQpCallAt = 0;
  int failQpErrno = 0;
  int qpLimit = -1;  // createQp fails with ENOMEM once this many QPs are live; -1 = none
  int failCqCallAt = 0;
  int failCqErrno = 0;
  int failModifyState = -1;  // ibv_modify_qp to this qp_state fails; -1 = never
  int failModifyErrno = 0;

  // Counters and what is live.
  int qpCalls = 0, qpCreates = 0, qpDestroys = 0;
  int cqCalls = 0, cqCreates = 0, cqDestroys = 0;
  int pdAllocs = 0, pdDeallocs = 0, closes = 0;
  std::set<ibv_qp*> liveQps;
  std::set<ibv_cq*> liveCqs;
  std::vector<uint32_t> createdQpns, destroyedQpns;
  std::vector<int> modifyStates;  // qp_state of every ibv_modify_qp, in order
  int lastCqe = 0;
  uint32_t nextQpn = 0x100;
  ibv_pd* pd = nullptr;
};

FakeVerbs g;

int fakeQueryDevice(ibv_context*, ibv_device_attr* attr) {
  *attr = ibv_device_attr{};
  attr->max_qp = g.maxQp;
  attr->max_qp_wr = g.maxQpWr;
  attr->max_cq = g.maxCq;
  attr->max_cqe = g.maxCqe;
  attr->max_sge = 4;
  return 0;
}

ibv_pd* fakeAllocPd(ibv_context* ctx) {
  auto* pd = new ibv_pd{};
  pd->context = ctx;
  ++g.pdAllocs;
  g.pd = pd;
  return pd;
}

int fakeDeallocPd(ibv_pd* pd) {
  EXPECT_EQ(pd, g.pd);
  EXPECT_TRUE(g.liveQps.empty()) << "PD freed while QPs still use it";
  ++g.pdDeallocs;
  g.pd = nullptr;
  delete pd;
  return 0;
}

int fakeCloseDevice(ibv_context* ctx) {
  ++g.closes;
  delete ctx;
  return 0;
}

ibv_cq* fakeCreateCq(ibv_context* ctx, int cqe, void*, ibv_comp_channel*, int) {
  ++g.cqCalls;
  g.lastCqe = cqe;
  if (g.cqCalls == g.failCqCallAt) {
    errno = g.failCqErrno;
    return nullptr;
  }
  auto* cq = new ibv_cq{};
  cq->context = ctx;
  cq->cqe = cqe;
  g.liveCqs.insert(cq);
  ++g.cqCreates;
  return cq;
}

int fakeDestroyCq(ibv_cq* cq) {
  ++g.cqDestroys;
  if (g.liveCqs.erase(cq) == 0) {
    ADD_FAILURE() << "ibv_destroy_cq on a CQ that is not live";
    errno = EINVAL;
    return EINVAL;
  }
  delete cq;
  return 0;
}

ibv_qp* fakeCreateQp(ibv_pd* pd, ibv_qp_init_attr* init) {
  ++g.qpCalls;
  EXPECT_EQ(pd, g.pd) << "QP not created on the device's PD";
  EXPECT_EQ(init->qp_type, IBV_QPT_RC);
  if (g.qpCalls == g.failQpCallAt) {
    errno = g.failQpErrno;
    return nullptr;
  }
  if (g.qpLimit >= 0 && static_cast<int>(g.liveQps.size()) >= g.qpLimit) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* qp = new ibv_qp{};
  qp->context = pd->context;
  qp->qp_context = init->qp_context;
  qp->pd = pd;
  qp->send_cq = init->send_cq;
  qp->recv_cq = init->recv_cq;
  qp->qp_type = init->qp_type;
  qp->state = IBV_QPS_RESET;
  qp->qp_num = g.nextQpn++;
  g.liveQps.insert(qp);
  g.createdQpns.push_back(qp->qp_num);
  ++g.qpCreates;
  return qp;
}

int fakeModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  EXPECT_TRUE(g.liveQps.count(qp) == 1) << "ibv_modify_qp on a QP that is not live";
  EXPECT_TRUE(mask & IBV_QP_STATE);
  g.modifyStates.push_back(attr->qp_state);
  if (static_cast<int>(attr->qp_state) == g.failModifyState) {
    errno = g.failModifyErrno;
    return g.failModifyErrno;
  }
  qp->state = attr->qp_state;
  return 0;
}

int fakeDestroyQp(ibv_qp* qp) {
  ++g.qpDestroys;
  if (g.liveQps.erase(qp) == 0) {
    ADD_FAILURE() << "ibv_destroy_qp on a QP that is not live";
    errno = EINVAL;
    return EINVAL;
  }
  g.destroyedQpns.push_back(qp->qp_num);
  delete qp;
  return 0;
}

VerbsApi fakeApi() {
  VerbsApi api;
  api.queryDevice = fakeQueryDevice;
  api.allocPd = fakeAllocPd;
  api.deallocPd = fakeDeallocPd;
  api.closeDevice = fakeCloseDevice;
  api.createCq = fakeCreateCq;
  api.destroyCq = fakeDestroyCq;
  api.createQp = fakeCreateQp;
  api.modifyQp = fakeModifyQp;
  api.destroyQp = fakeDestroyQp;
  // regDmabufMr stays nullptr: open() skips the DMA-BUF probe.
  return api;
}

// --- captured log lines ------------------------------------------------------------------

struct LogLine {
  ncclDebugLogLevel level;
  std::string text;
};
std::vector<LogLine> gLogs;

__attribute__((format(printf, 5, 6))) void captureLog(ncclDebugLogLevel level, unsigned long,
                                                      const char*, int, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  gLogs.push_back({level, buf});
}

std::vector<std::string> warnings() {
  std::vector<std::string> out;
  for (const LogLine& l : gLogs) {
    if (l.level == NCCL_LOG_WARN) out.push_back(l.text);
  }
  return out;
}

// The one WARN a failure should produce ("" plus a test failure when there is not exactly one).
std::string onlyWarning() {
  std::vector<std::string> w = warnings();
  EXPECT_EQ(w.size(), 1u);
  return w.size() == 1 ? w[0] : std::string();
}

// --- fixture -----------------------------------------------------------------------------

class QpFault : public ::testing::Test {
 protected:
  void SetUp() override {
    g = FakeVerbs{};
    gLogs.clear();
    setLogger(captureLog);
    api_ = fakeApi();
  }

  void TearDown() override {
    dev_.reset();
    if (opened_) {
      EXPECT_EQ(g.pdDeallocs, 1);
      EXPECT_EQ(g.closes, 1);
    }
    setLogger(nullptr);
  }

  // Opens the fake device with the attributes in `g`.
  void openDevice() {
    dev_ = std::make_unique<VerbsDevice>(&api_, "rxe_fake0", new ibv_context{});
    ASSERT_EQ(dev_->open(), ncclSuccess);
    ASSERT_NE(dev_->pd(), nullptr);
    ASSERT_EQ(dev_->attr().max_qp, g.maxQp);
    opened_ = true;
  }

  VerbsApi api_;
  std::unique_ptr<VerbsDevice> dev_;
  bool opened_ = false;
};

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// 1. ibv_create_qp fails with ENOMEM (the device's max_qp reached).
TEST_F(QpFault, TooManyQpsFailsCleanlyAndNamesTheQpLimit) {
  g.maxQp = 64;
  ASSERT_NO_FATAL_FAILURE(openDevice());
  CompletionQueue cq;
  ASSERT_EQ(cq.create(dev_.get(), 128), ncclSuccess);

  g.failQpCallAt = 1;
  g.failQpErrno = ENOMEM;
  {
    QueuePair qp;
    EXPECT_EQ(qp.create(dev_.get(), 2, cq.get(), QpCaps{}), ncclSystemError);
    EXPECT_EQ(qp.get(), nullptr);
    EXPECT_EQ(qp.qpn(), 0u);
    EXPECT_EQ(g.qpCalls, 1);
    EXPECT_EQ(g.qpCreates, 0);
    EXPECT_TRUE(g.liveQps.empty());
  }
  EXPECT_EQ(g.qpDestroys, 0);

  std::string w = onlyWarning();
  EXPECT_TRUE(contains(w, "ibv_create_qp")) << w;
  EXPECT_TRUE(contains(w, "rxe_fake0:2")) << w;
  EXPECT_TRUE(contains(w, strerror(ENOMEM))) << w;
  EXPECT_TRUE(contains(w, "errno 12")) << w;
  EXPECT_TRUE(contains(w, "max_qp 64")) << w;
  EXPECT_TRUE(contains(w, "locked memory")) << w;
  EXPECT_TRUE(contains(w, "ulimit -l")) << w;
  EXPECT_FALSE(contains(w, "\n")) << "one line: " << w;
}

// ibv_create_qp fails with EINVAL: the hint is about WR capacities, not the QP count.
TEST_F(QpFault, InvalidQpCapsNameTheWrLimit) {
  g.maxQpWr = 1024;
  ASSERT_NO_FATAL_FAILURE(openDevice());
  CompletionQueue cq;
  ASSERT_EQ(cq.create(dev_.get(), 128), ncclSuccess);

  g.failQpCallAt = 1;
  g.failQpErrno = EINVAL;
  QpCaps caps;
  caps.maxSendWr = 4096;
  caps.maxRecvWr = 2048;
  QueuePair qp;
  EXPECT_EQ(qp.create(dev_.get(), 1, cq.get(), caps), ncclSystemError);
  EXPECT_EQ(qp.get(), nullptr);
  EXPECT_TRUE(g.liveQps.empty());

  std::string w = onlyWarning();
  EXPECT_TRUE(contains(w, "rxe_fake0:1")) << w;
  EXPECT_TRUE(contains(w, strerror(EINVAL))) << w;
  EXPECT_TRUE(contains(w, "4096 send / 2048 recv WRs")) << w;
  EXPECT_TRUE(contains(w, "max_qp_wr 1024")) << w;
  EXPECT_FALSE(contains(w, "max_qp ")) << w;
}

// 2. ibv_create_cq fails with ENOMEM.
TEST_F(QpFault, CqCreateEnomemFailsCleanlyAndNamesTheCqLimits) {
  g.maxCq = 16;
  g.maxCqe = 4096;
  ASSERT_NO_FATAL_FAILURE(openDevice());
  g.failCqCallAt = 1;
  g.failCqErrno = ENOMEM;
  {
    CompletionQueue cq;
    EXPECT_EQ(cq.create(dev_.get(), 256), ncclSystemError);
    EXPECT_EQ(cq.get(), nullptr);
    EXPECT_EQ(cq.entries(), 0);
    EXPECT_EQ(g.lastCqe, 256);
    EXPECT_TRUE(g.liveCqs.empty());
    cq.reset();
  }
  EXPECT_EQ(g.cqDestroys, 0);

  std::string w = onlyWarning();
  EXPECT_TRUE(contains(w, "ibv_create_cq(rxe_fake0, 256 entries)")) << w;
  EXPECT_TRUE(contains(w, strerror(ENOMEM))) << w;
  EXPECT_TRUE(contains(w, "errno 12")) << w;
  EXPECT_TRUE(contains(w, "max_cq 16")) << w;
  EXPECT_TRUE(contains(w, "max_cqe 4096")) << w;
  EXPECT_TRUE(contains(w, "ulimit -l")) << w;
}

// A CQ request above max_cqe fails with a WARN naming both figures and creates nothing: the
// comms size their CQs never to overflow, and a CQ cut to the limit could (an overrun is a
// CQ error, which fails the comm).
TEST_F(QpFault, CqEntriesAboveMaxCqeFailAndCreateNothing) {
  g.maxCqe = 1000;
  ASSERT_NO_FATAL_FAILURE(openDevice());
  {
    CompletionQueue cq;
    EXPECT_EQ(cq.create(dev_.get(), 1001), ncclSystemError);
    ASSERT_EQ(cq.create(dev_.get(), 1000), ncclSuccess);
    EXPECT_EQ(g.lastCqe, 1000);
    EXPECT_EQ(cq.entries(), 1000);
  }
  EXPECT_EQ(g.cqCreates, 1);
  EXPECT_EQ(g.cqDestroys, 1);
  EXPECT_TRUE(g.liveCqs.empty());
  ASSERT_EQ(warnings().size(), 1u);
  EXPECT_TRUE(contains(warnings()[0], "needs a completion queue of 1001 entries, the device holds at most 1000"))
      << warnings()[0];
}

// 3. QPs up to the device limit succeed, the next fails cleanly, teardown frees exactly
// what was created.
TEST_F(QpFault, CreatesUpToTheQpLimitThenFailsAndFreesExactlyWhatItCreated) {
  constexpr int kLimit = 8;
  g.maxQp = kLimit;
  g.qpLimit = kLimit;
  ASSERT_NO_FATAL_FAILURE(openDevice());
  CompletionQueue cq;
  ASSERT_EQ(cq.create(dev_.get(), 256), ncclSuccess);
  {
    std::vector<std::unique_ptr<QueuePair>> qps;
    std::set<uint32_t> qpns;
    for (int i = 0; i < kLimit; ++i) {
      qps.push_back(std::make_unique<QueuePair>());
      ASSERT_EQ(qps.back()->create(dev_.get(), 1, cq.get(), QpCaps{}), ncclSuccess) << i;
      EXPECT_NE(qps.back()->get(), nullptr);
      qpns.insert(qps.back()->qpn());
    }
    EXPECT_EQ(qpns.size(), static_cast<size_t>(kLimit));
    EXPECT_TRUE(warnings().empty());

    QueuePair extra;
    EXPECT_EQ(extra.create(dev_.get(), 1, cq.get(), QpCaps{}), ncclSystemError);
    EXPECT_EQ(extra.get(), nullptr);
    EXPECT_EQ(g.qpCreates, kLimit);
    EXPECT_EQ(g.liveQps.size(), static_cast<size_t>(kLimit));
    std::string w = onlyWarning();
    EXPECT_TRUE(contains(w, "max_qp 8")) << w;
    EXPECT_EQ(g.qpDestroys, 0);

    // Freeing one makes room again; the failed object is reusable.
    qps.front()->reset();
    EXPECT_EQ(g.qpDestroys, 1);
    ASSERT_EQ(extra.create(dev_.get(), 1, cq.get(), QpCaps{}), ncclSuccess);
    EXPECT_EQ(g.liveQps.size(), static_cast<size_t>(kLimit));
  }
  EXPECT_EQ(g.qpCreates, kLimit + 1);
  EXPECT_EQ(g.qpDestroys, g.qpCreates);
  EXPECT_TRUE(g.liveQps.empty());
  std::multiset<uint32_t> created(g.createdQpns.begin(), g.createdQpns.end());
  std::multiset<uint32_t> destroyed(g.destroyedQpns.begin(), g.destroyedQpns.end());
  EXPECT_EQ(created, destroyed);
}

// reset(), toError() and the destructor on a QueuePair whose create failed touch nothing.
TEST_F(QpFault, FailedQueuePairNeverCallsDestroyOrModify) {
  ASSERT_NO_FATAL_FAILURE(openDevice());
  CompletionQueue cq;
  ASSERT_EQ(cq.create(dev_.get(), 64), ncclSuccess);
  g.failQpCallAt = 1;
  g.failQpErrno = ENOMEM;
  {
    QueuePair qp;
    ASSERT_EQ(qp.create(dev_.get(), 1, cq.get(), QpCaps{}), ncclSystemError);
    qp.toError();
    qp.reset();
    qp.reset();
    QueuePair neverCreated;
    neverCreated.reset();
  }
  EXPECT_EQ(g.qpDestroys, 0);
  EXPECT_TRUE(g.modifyStates.empty());
  EXPECT_EQ(warnings().size(), 1u);  // only the create failure
}

// Re-creating over a live QP releases the old one first, even when the new create fails.
TEST_F(QpFault, RecreateReleasesThePreviousQpEvenWhenTheNewOneFails) {
  ASSERT_NO_FATAL_FAILURE(openDevice());
  CompletionQueue cq;
  ASSERT_EQ(cq.create(dev_.get(), 64), ncclSuccess);
  g.failQpCallAt = 2;
  g.failQpErrno = ENOMEM;
  {
    QueuePair qp;
    ASSERT_EQ(qp.create(dev_.get(), 1, cq.get(), QpCaps{}), ncclSuccess);
    uint32_t first = qp.qpn();
    EXPECT_EQ(qp.create(dev_.get(), 1, cq.get(), QpCaps{}), ncclSystemError);
    EXPECT_EQ(qp.get(), nullptr);
    ASSERT_EQ(g.destroyedQpns.size(), 1u);
    EXPECT_EQ(g.destroyedQpns[0], first);
    EXPECT_TRUE(g.liveQps.empty());
  }
  EXPECT_EQ(g.qpCreates, 1);
  EXPECT_EQ(g.qpDestroys, 1);
}

// 4. ibv_modify_qp fails on the way to INIT: an error, a WARN naming the step, and the QP
// is still destroyed by its owner.
TEST_F(QpFault, ModifyToInitFailureStillDestroysTheQp) {
  ASSERT_NO_FATAL_FAILURE(openDevice());
  CompletionQueue cq;
  ASSERT_EQ(cq.create(dev_.get(), 64), ncclSuccess);
  g.failModifyState = IBV_QPS_INIT;
  g.failModifyErrno = EINVAL;
  uint32_t qpn = 0;
  {
    QueuePair qp;
    ASSERT_EQ(qp.create(dev_.get(), 1, cq.get(), QpCaps{}), ncclSuccess);
    qpn = qp.qpn();
    EXPECT_EQ(qp.toInit(), ncclSystemError);
    EXPECT_NE(qp.get(), nullptr);  // still owned, not leaked or dangling
    EXPECT_EQ(qp.get()->state, IBV_QPS_RESET);
    std::string w = onlyWarning();
    EXPECT_TRUE(contains(w, "ibv_modify_qp(INIT)")) << w;
    EXPECT_TRUE(contains(w, "rxe_fake0:1")) << w;
    EXPECT_TRUE(contains(w, "QPN " + std::to_string(qpn))) << w;
    EXPECT_TRUE(contains(w, strerror(EINVAL))) << w;
    EXPECT_EQ(g.qpDestroys, 0);
  }
  EXPECT_EQ(g.qpCreates, 1);
  EXPECT_EQ(g.qpDestroys, 1);
  ASSERT_EQ(g.destroyedQpns.size(), 1u);
  EXPECT_EQ(g.destroyedQpns[0], qpn);
  EXPECT_TRUE(g.liveQps.empty());
}

// ibv_modify_qp fails on the way to RTR (after INIT worked): the WARN carries the remote
// end, and the usual teardown (ERR, then destroy) frees the QP.
TEST_F(QpFault, ModifyToRtrFailureStillDestroysTheQp) {
  ASSERT_NO_FATAL_FAILURE(openDevice());
  CompletionQueue cq;
  ASSERT_EQ(cq.create(dev_.get(), 64), ncclSuccess);
  g.failModifyState = IBV_QPS_RTR;
  g.failModifyErrno = ETIMEDOUT;
  {
    QueuePair qp;
    ASSERT_EQ(qp.create(dev_.get(), 1, cq.get(), QpCaps{}), ncclSuccess);
    ASSERT_EQ(qp.toInit(), ncclSuccess);
    QpRemote remote;
    remote.qpn = 0x4242;
    remote.psn = 7;
    remote.mtu = IBV_MTU_1024;
    remote.localGidIndex = 3;
    const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 2};
    memcpy(remote.gid, gid, 16);
    EXPECT_EQ(qp.toRtr(remote, QpTuning{}), ncclSystemError);
    EXPECT_NE(qp.get(), nullptr);
    EXPECT_EQ(qp.get()->state, IBV_QPS_INIT);
    std::string w = onlyWarning();
    EXPECT_TRUE(contains(w, "ibv_modify_qp(RTR)")) << w;
    EXPECT_TRUE(contains(w, strerror(ETIMEDOUT))) << w;
    EXPECT_TRUE(contains(w, "remote QPN " + std::to_string(0x4242))) << w;
    EXPECT_TRUE(contains(w, "198.18.0.2")) << w;
    EXPECT_TRUE(contains(w, "local GID index 3")) << w;
    EXPECT_TRUE(contains(w, "MTU 1024")) << w;
    qp.toError();
  }
  const std::vector<int> expected = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_ERR};
  EXPECT_EQ(g.modifyStates, expected);
  EXPECT_EQ(g.qpCreates, 1);
  EXPECT_EQ(g.qpDestroys, 1);
  EXPECT_TRUE(g.liveQps.empty());
}

TEST(PeerMtu, NamedOnlyWhenTheEndsDiffer) {
  EXPECT_EQ(peerMtuNote(IBV_MTU_4096, IBV_MTU_4096), "");
  std::string note = peerMtuNote(IBV_MTU_4096, IBV_MTU_1024);
  EXPECT_NE(note.find("peer_mtu=1024 (differs from ours, 4096"), std::string::npos) << note;
  EXPECT_EQ(negotiatedMtu(IBV_MTU_4096, IBV_MTU_1024), IBV_MTU_1024);
}

}  // namespace
}  // namespace mesh
