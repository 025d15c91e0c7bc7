// SPDX-License-Identifier: Apache-2.0
// The FIFO engine driven the way NCCL's proxy drives a net plugin, without RDMA: a sender
// and a receiver comm in one process over the fake wire (fifo_pair.h). Each test names the
// NCCL source whose behaviour it pins:
//  - NCCL 2.28.9 src/transport/net_ib.cc ncclIbIsend (2.30.7: src/transport/net_ib/p2p.cc):
//    a send matches any unmatched buffer of the NEXT posted slot whose tag is its own; no
//    slot, or no such buffer, is a NULL request with ncclSuccess (NCCL's proxy retries);
//    a send larger than the posted buffer is truncated to it; a grouped slot's writes go
//    out when every buffer of the group has its send;
//  - NCCL plugins/net/README.md: a comm takes NCCL_NET_MAX_REQUESTS (32) x maxRecvs (8) =
//    256 outstanding requests; running out is a NULL request, never an error.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fifo_pair.h"
#include "warn_capture.h"

namespace mesh {
namespace fake {
namespace {

class FifoEngine : public ::testing::Test {
 protected:
  testing_support::WarnCapture warnings_;

  // One grouped receive of `tags.size()` buffers of `size` bytes each (filled with 0xee).
  Request* postRecv(FifoPair& p, const std::vector<int>& tags, size_t size, std::vector<Buffer*>* bufs = nullptr) {
    int n = static_cast<int>(tags.size());
    void* data[kGroupMax];
    size_t sizes[kGroupMax];
    MrHandle* mh[kGroupMax];
    for (int i = 0; i < n; ++i) {
      Buffer* b = p.buffer(false, size, 0xee);
      if (bufs != nullptr) bufs->push_back(b);
      data[i] = b->data();
      sizes[i] = size;
      mh[i] = &b->mh;
    }
    Request* req = nullptr;
    EXPECT_EQ(p.receiver()->irecv(n, data, sizes, tags.data(), mh, &req), ncclSuccess);
    return req;
  }

  // A send of `size` bytes of pattern `seed`; *req NULL means "not yet".
  ncclResult_t isend(FifoPair& p, size_t size, int tag, uint32_t seed, Request** req) {
    Buffer* b = p.buffer(true, size);
    fillPattern(b->data(), size, seed);
    return p.sender()->isend(b->data(), size, tag, &b->mh, req);
  }

  FakeRdma fake_;
};

// NCCL 2.28.9 net_ib.cc ncclIbTest: a request an earlier poll found complete is reported
// without polling again. NCCL's proxy tests only each connection's oldest request, one per
// pass, so a poll there is spent on every request and delays its next post.
TEST_F(FifoEngine, ARequestAnEarlierPollCompletedIsReportedWithoutPolling) {
  FifoPair p(fake_);
  Request* r1 = postRecv(p, {1}, 4096);
  Request* r2 = postRecv(p, {1}, 4096);
  ASSERT_NE(r1, nullptr);
  ASSERT_NE(r2, nullptr);
  fake_.run();  // the FIFO writes land
  Request* s1 = nullptr;
  Request* s2 = nullptr;
  ASSERT_EQ(isend(p, 4096, 1, 1, &s1), ncclSuccess);
  ASSERT_EQ(isend(p, 4096, 1, 2, &s2), ncclSuccess);
  ASSERT_NE(s1, nullptr);
  ASSERT_NE(s2, nullptr);
  fake_.run();  // both writes and their completions
  ASSERT_TRUE(p.waitDone(r2));  // its poll takes r1's completion too
  uint64_t polls = fake_.polls();
  int done = 0;
  size_t sizes[1] = {};
  ASSERT_EQ(p.receiver()->test(r1, &done, sizes), ncclSuccess);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(sizes[0], 4096u);
  EXPECT_EQ(fake_.polls(), polls) << "test() polled for a request already complete";
  EXPECT_TRUE(p.waitDone(s1));
  EXPECT_TRUE(p.waitDone(s2));
}

// Tags of one grouped receive, sends in reverse order: each lands in its own buffer.
TEST_F(FifoEngine, GroupedSendsInReverseOrderLandInTheirBuffers) {
  FifoPair p(fake_);
  std::vector<Buffer*> bufs;
  std::vector<int> tags = {10, 11, 12, 13, 14, 15, 16, 17};
  Request* recv = postRecv(p, tags, 4096, &bufs);
  ASSERT_NE(recv, nullptr);
  fake_.run();
  std::vector<Request*> sends;
  for (int i = 7; i >= 0; --i) {
    Request* s = nullptr;
    ASSERT_EQ(isend(p, 1000 + i, tags[i], 100 + i, &s), ncclSuccess) << "tag " << tags[i];
    ASSERT_NE(s, nullptr) << "tag " << tags[i] << " is in the posted slot";
    sends.push_back(s);
  }
  size_t got[kGroupMax] = {};
  ASSERT_TRUE(p.waitDone(recv, got));
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(got[i], 1000u + i) << "buffer " << i;
    EXPECT_TRUE(matchesPattern(bufs[i]->data(), 1000 + i, 100 + i)) << "buffer " << i;
  }
  for (Request* s : sends) EXPECT_TRUE(p.waitDone(s));
}

// Three consecutive groups of 8 on one recvComm (as PXN / shared comms post them) and the
// sends of all three in a shuffled order: a send whose tag belongs to a later group is a
// NULL request until its group is the next slot, then it is retried and goes through.
TEST_F(FifoEngine, ShuffledSendsAcrossConsecutiveGroupsAreRetriedNotRefused) {
  FifoPair p(fake_);
  const int kGroups = 3;
  std::vector<int> tags = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<Request*> recvs;
  std::vector<std::vector<Buffer*>> bufs(kGroups);
  for (int g = 0; g < kGroups; ++g) recvs.push_back(postRecv(p, tags, 512, &bufs[g]));
  for (Request* r : recvs) ASSERT_NE(r, nullptr);
  fake_.run();

  struct Pending {
    int group, tag;
  };
  std::vector<Pending> order;
  for (int g = 0; g < kGroups; ++g) {
    for (int t : tags) order.push_back({g, t});
  }
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  // NCCL posts one send per tag at a time, in its step order: a later group's send of tag
  // t cannot go before the earlier group's send of t (it is the next step of that peer).
  std::vector<int> nextGroupOfTag(8, 0);
  int nulls = 0, sent = 0;
  std::vector<Request*> sends;
  for (int round = 0; round < 1000 && sent < kGroups * 8; ++round) {
    for (Pending& e : order) {
      if (e.group < 0 || nextGroupOfTag[e.tag] != e.group) continue;
      Request* s = nullptr;
      ncclResult_t rc = isend(p, 100 + e.tag, e.tag, e.group * 8 + e.tag, &s);
      ASSERT_EQ(rc, ncclSuccess) << "group " << e.group << " tag " << e.tag << ": " << warnings_.last();
      if (s == nullptr) {
        ++nulls;
        continue;
      }
      sends.push_back(s);
      ++sent;
      ++nextGroupOfTag[e.tag];
      e.group = -1;
    }
    fake_.run();
  }
  ASSERT_EQ(sent, kGroups * 8);
  EXPECT_GT(nulls, 0) << "the shuffle put no send ahead of its group: the test proved nothing";
  for (int g = 0; g < kGroups; ++g) {
    size_t got[kGroupMax] = {};
    ASSERT_TRUE(p.waitDone(recvs[g], got)) << "group " << g;
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(got[t], 100u + t) << "group " << g << " tag " << t;
      EXPECT_TRUE(matchesPattern(bufs[g][t]->data(), 100 + t, g * 8 + t)) << "group " << g << " tag " << t;
    }
  }
  for (Request* s : sends) EXPECT_TRUE(p.waitDone(s));
}

// A send whose tag is in no buffer of the next slot: NULL and ncclSuccess, as often as it
// is tried; once the receiver posts a slot with that tag (after the current one
// completes), the same send goes through.
TEST_F(FifoEngine, TagAbsentFromTheSlotIsNullUntilASlotWithItIsPosted) {
  FifoPair p(fake_);
  std::vector<Buffer*> first;
  Request* recv1 = postRecv(p, {1, 2}, 256, &first);
  fake_.run();
  for (int i = 0; i < 3; ++i) {
    Request* s = nullptr;
    EXPECT_EQ(isend(p, 64, 5, 55, &s), ncclSuccess) << warnings_.last();
    EXPECT_EQ(s, nullptr) << "tag 5 is not in the posted slot";
  }
  Request* s1 = nullptr;
  Request* s2 = nullptr;
  ASSERT_EQ(isend(p, 64, 2, 2, &s2), ncclSuccess);
  ASSERT_EQ(isend(p, 64, 1, 1, &s1), ncclSuccess);
  ASSERT_NE(s1, nullptr);
  ASSERT_NE(s2, nullptr);
  ASSERT_TRUE(p.waitDone(recv1));
  std::vector<Buffer*> second;
  Request* recv2 = postRecv(p, {5}, 256, &second);
  fake_.run();
  Request* s5 = nullptr;
  ASSERT_EQ(isend(p, 64, 5, 55, &s5), ncclSuccess);
  ASSERT_NE(s5, nullptr);
  size_t got[kGroupMax] = {};
  ASSERT_TRUE(p.waitDone(recv2, got));
  EXPECT_EQ(got[0], 64u);
  EXPECT_TRUE(matchesPattern(second[0]->data(), 64, 55));
  EXPECT_TRUE(warnings_.lines().empty()) << warnings_.lines().front();
}

// And costs no poll: NCCL's proxy calls isend over and over while the receiver has not
// posted (2.30.7 net_ib/p2p.cc, ncclIbIsend: reads the slot and returns); test() polls for
// what is in flight.
TEST_F(FifoEngine, NoSlotPostedIsNullWithoutPolling) {
  FifoPair p(fake_);
  Request* s = nullptr;
  uint64_t polls = fake_.polls();
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(isend(p, 8, 0, 0, &s), ncclSuccess);
    EXPECT_EQ(s, nullptr);
  }
  EXPECT_EQ(fake_.polls(), polls) << "a NULL isend polled the CQs";
  // The slot, once posted, is taken by the next call.
  Request* r = postRecv(p, {0}, 8);
  ASSERT_NE(r, nullptr);
  fake_.run();
  ASSERT_EQ(isend(p, 8, 0, 0, &s), ncclSuccess);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(p.waitDone(s));
  EXPECT_TRUE(p.waitDone(r));
}

// NCCL IB truncates a send to the posted size (ncclIbIsend: size = min(size, slot size));
// the receiver's test() reports the bytes that were written, the sender's too. One WARN
// per comm names both sizes.
TEST_F(FifoEngine, OversizeSendIsTruncatedToThePostedSize) {
  FifoPair p(fake_);
  for (int round = 0; round < 2; ++round) {
    std::vector<Buffer*> bufs;
    Buffer* guard = nullptr;
    Request* recv = postRecv(p, {3}, 100, &bufs);
    guard = p.buffer(false, 64, 0x5a);  // the allocation after the buffer stays untouched
    fake_.run();
    Request* s = nullptr;
    ASSERT_EQ(isend(p, 300, 3, 9, &s), ncclSuccess) << warnings_.last();
    ASSERT_NE(s, nullptr);
    size_t got[kGroupMax] = {};
    ASSERT_TRUE(p.waitDone(recv, got));
    EXPECT_EQ(got[0], 100u);
    EXPECT_TRUE(matchesPattern(bufs[0]->data(), 100, 9));
    EXPECT_EQ(guard->bytes, std::vector<uint8_t>(64, 0x5a));
    size_t sent[1] = {};
    ASSERT_TRUE(p.waitDone(s, sent));
    EXPECT_EQ(sent[0], 100u);
  }
  ASSERT_EQ(warnings_.lines().size(), 1u) << "one WARN per comm";
  EXPECT_NE(warnings_.lines()[0].find("300"), std::string::npos) << warnings_.lines()[0];
  EXPECT_NE(warnings_.lines()[0].find("100"), std::string::npos) << warnings_.lines()[0];
}

// 32 grouped receives of 8 = 256 buffers posted; the 33rd receive is NULL. The sender
// takes all 256 sends before any completes; the 257th is NULL; then everything completes.
TEST_F(FifoEngine, TwoHundredFiftySixOutstandingThenNullThenAllComplete) {
  FifoPair p(fake_);
  std::vector<int> tags = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<Request*> recvs;
  std::vector<std::vector<Buffer*>> bufs(32);
  for (int g = 0; g < 32; ++g) {
    recvs.push_back(postRecv(p, tags, 64, &bufs[g]));
    ASSERT_NE(recvs.back(), nullptr) << "receive " << g;
  }
  EXPECT_EQ(postRecv(p, tags, 64), nullptr) << "a 33rd grouped receive has no FIFO slot";
  fake_.run();
  std::vector<Request*> sends;
  for (int g = 0; g < 32; ++g) {
    for (int t = 0; t < 8; ++t) {
      Request* s = nullptr;
      ASSERT_EQ(isend(p, 64, t, g * 8 + t, &s), ncclSuccess)
          << "send " << sends.size() << ": " << warnings_.last();
      ASSERT_NE(s, nullptr) << "send " << sends.size();
      sends.push_back(s);
    }
  }
  Request* extra = nullptr;
  EXPECT_EQ(isend(p, 64, 0, 999, &extra), ncclSuccess);
  EXPECT_EQ(extra, nullptr) << "send 257 has no slot";
  // 288 WRs (32 groups x (8 writes + the sizes write)) exceed the send queue: the sender
  // posts the rest as completions return its credits, which its test() calls poll.
  for (Request* s : sends) ASSERT_TRUE(p.waitDone(s));
  for (int g = 0; g < 32; ++g) {
    size_t got[kGroupMax] = {};
    ASSERT_TRUE(p.waitDone(recvs[g], got)) << "receive " << g;
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(got[t], 64u);
      EXPECT_TRUE(matchesPattern(bufs[g][t]->data(), 64, g * 8 + t)) << g << "/" << t;
    }
  }
  EXPECT_TRUE(warnings_.lines().empty()) << warnings_.lines().front();
}

// NCCL 2.28.9 net_ib.cc ncclIbPostFifo: the receiver signals only some of its FIFO slot
// writes (one in 32 per device there, one in kFifoSignalEvery here); the unsignaled ones'
// send-queue slots come back with the next signaled completion. Receives one at a time and
// 32 at once (the FIFO full, round after round) never find the queue full, and only one
// write in kFifoSignalEvery costs a completion.
TEST_F(FifoEngine, TheReceiverSignalsOneFifoWriteInSixteenAndNeverRunsOutOfSlots) {
  FifoPair p(fake_);
  auto count = [&](uint64_t* posted, uint64_t* signaled) {
    *posted = *signaled = 0;
    for (uint32_t q : fake_.qpnsOn("b0")) {
      *posted += fake_.sendsPosted(q);
      *signaled += fake_.signaledPosted(q);
    }
  };
  for (int i = 0; i < 160; ++i) {
    std::vector<Buffer*> bufs;
    Request* r = postRecv(p, {0}, 64, &bufs);
    ASSERT_NE(r, nullptr) << "receive " << i;
    fake_.run();
    Request* s = nullptr;
    ASSERT_EQ(isend(p, 64, 0, i, &s), ncclSuccess) << warnings_.last();
    ASSERT_NE(s, nullptr) << "send " << i;
    size_t got[kGroupMax] = {};
    ASSERT_TRUE(p.waitDone(s));
    ASSERT_TRUE(p.waitDone(r, got)) << "receive " << i;
    EXPECT_EQ(got[0], 64u);
    EXPECT_TRUE(matchesPattern(bufs[0]->data(), 64, i)) << i;
  }
  uint64_t posted = 0, signaled = 0;
  count(&posted, &signaled);
  EXPECT_EQ(posted, 160u);
  EXPECT_EQ(signaled, 160u / kFifoSignalEvery);
  for (int round = 0; round < 20; ++round) {
    std::vector<Request*> recvs;
    std::vector<Buffer*> bufs;
    for (int g = 0; g < kFifoDepth; ++g) {
      recvs.push_back(postRecv(p, {g}, 64, &bufs));
      ASSERT_NE(recvs.back(), nullptr) << "round " << round << ", receive " << g;
    }
    fake_.run();
    std::vector<Request*> sends;
    for (int g = 0; g < kFifoDepth; ++g) {
      Request* s = nullptr;
      ASSERT_EQ(isend(p, 64, g, round * kFifoDepth + g, &s), ncclSuccess) << warnings_.last();
      ASSERT_NE(s, nullptr) << "round " << round << ", send " << g;
      sends.push_back(s);
    }
    for (Request* s : sends) ASSERT_TRUE(p.waitDone(s));
    for (int g = 0; g < kFifoDepth; ++g) {
      ASSERT_TRUE(p.waitDone(recvs[g])) << "round " << round << ", receive " << g;
      EXPECT_TRUE(matchesPattern(bufs[g]->data(), 64, round * kFifoDepth + g));
    }
  }
  count(&posted, &signaled);
  EXPECT_EQ(posted, 160u + 20u * kFifoDepth);
  EXPECT_EQ(signaled, posted / kFifoSignalEvery);
  EXPECT_TRUE(warnings_.lines().empty()) << warnings_.lines().front();
}

// The slot of round k+1 reuses the memory of round k: the old contents (seq of round k)
// must not be taken for the new slot, nor a slot whose first half has landed and whose
// last word (seqTail) has not.
TEST_F(FifoEngine, StaleOrHalfWrittenSlotIsNotAccepted) {
  FifoPair p(fake_);
  for (int i = 0; i < kFifoDepth; ++i) {
    Request* recv = postRecv(p, {0}, 32);
    fake_.run();
    Request* s = nullptr;
    ASSERT_EQ(isend(p, 32, 0, i, &s), ncclSuccess);
    ASSERT_NE(s, nullptr) << i;
    ASSERT_TRUE(p.waitDone(recv));
    ASSERT_TRUE(p.waitDone(s));
  }
  // Slot 0 still holds round 1's {seq 1, tag 0}: the next send must wait for seq 33.
  Request* s = nullptr;
  EXPECT_EQ(isend(p, 32, 0, 77, &s), ncclSuccess);
  EXPECT_EQ(s, nullptr) << "took the previous round's slot";
  // Now the receiver posts; its slot write lands in two halves.
  std::vector<Buffer*> bufs;
  Request* recv = postRecv(p, {0}, 32, &bufs);
  uint32_t ctrlQpn = fake_.qpnsOn("b0").front();
  fake_.splitNextWrite(ctrlQpn, 32);
  ASSERT_TRUE(fake_.step(ctrlQpn));
  EXPECT_EQ(isend(p, 32, 0, 77, &s), ncclSuccess);
  EXPECT_EQ(s, nullptr) << "took a slot whose seqTail had not landed";
  ASSERT_TRUE(fake_.step(ctrlQpn));
  EXPECT_EQ(isend(p, 32, 0, 77, &s), ncclSuccess);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(p.waitDone(recv));
  EXPECT_TRUE(matchesPattern(bufs[0]->data(), 32, 77));
}

// Two links x two QPs, messages split over all four; the wire runs the QPs in a random
// order, so one QP's immediate of message k+1 arrives before another's of message k.
TEST_F(FifoEngine, CompletionsOutOfOrderAcrossQpsStayByteExact) {
  PairOptions o;
  o.links = 2;
  o.qpsPerLink = 2;
  o.splitMin = 1024;
  o.maxWrBytes = 4096;  // several WRs per QP share
  FifoPair p(fake_, o);
  std::mt19937 rng(11);
  const int kMessages = 24;
  std::vector<Request*> recvs, sends;
  std::vector<std::vector<Buffer*>> bufs(kMessages);
  for (int m = 0; m < kMessages; ++m) {
    int n = 1 + m % 3;
    std::vector<int> tags(n);
    std::iota(tags.begin(), tags.end(), 0);
    recvs.push_back(postRecv(p, tags, 48000, &bufs[m]));
    ASSERT_NE(recvs.back(), nullptr);
    fake_.run(&rng, 3);  // the slot writes trickle in
    for (int t = n - 1; t >= 0; --t) {
      Request* s = nullptr;
      size_t size = 20000 + 1000 * m + 7 * t;
      while (s == nullptr) {
        ASSERT_EQ(isend(p, size, t, m * 8 + t, &s), ncclSuccess);
        if (s == nullptr) {
          ASSERT_GT(fake_.run(&rng, 1), 0u) << "message " << m << " tag " << t << " never matched";
        }
      }
      sends.push_back(s);
    }
    fake_.run(&rng, 5);
  }
  // One wire step at a time; a receive that test() reports done must have all its bytes
  // and sizes in place at that moment, whatever QP delivered last.
  std::vector<bool> recvDone(kMessages, false), sendDone(sends.size(), false);
  size_t remaining = kMessages + sends.size();
  for (int idle = 0; remaining > 0 && idle < 3;) {
    bool moved = fake_.run(&rng, 1) > 0;
    for (int m = 0; m < kMessages; ++m) {
      if (recvDone[m]) continue;
      int done = 0;
      size_t got[kGroupMax] = {};
      ASSERT_EQ(p.receiver()->test(recvs[m], &done, got), ncclSuccess);
      if (!done) continue;
      recvDone[m] = true;
      --remaining;
      moved = true;
      for (size_t t = 0; t < bufs[m].size(); ++t) {
        size_t size = 20000 + 1000 * m + 7 * t;
        EXPECT_EQ(got[t], size);
        EXPECT_TRUE(matchesPattern(bufs[m][t]->data(), size, m * 8 + t)) << "message " << m << " tag " << t
                                                                           << " reported done before all its data landed";
      }
    }
    for (size_t i = 0; i < sends.size(); ++i) {
      int done = 0;
      if (sendDone[i]) continue;
      ASSERT_EQ(p.sender()->test(sends[i], &done, nullptr), ncclSuccess);
      if (done) {
        sendDone[i] = true;
        --remaining;
        moved = true;
      }
    }
    idle = moved ? 0 : idle + 1;
  }
  EXPECT_EQ(remaining, 0u) << "requests never completed";
  for (const char* dev : {"b0", "b1"}) {
    for (uint32_t qpn : fake_.qpnsOn(dev)) EXPECT_EQ(fake_.destQpn(fake_.destQpn(qpn)), qpn);
  }
}

// Zero-byte messages are legal (DESIGN "Semantics"): alone, the send still posts its final
// WRITE_WITH_IMM (nothing else tells the receiver), and in a group beside a non-empty one.
// (A mutation that skipped the final write for 0 bytes was caught only by the fabric tier,
// after its 60 s deadline.)
TEST_F(FifoEngine, ZeroByteSendsCompleteAloneAndInAGroup) {
  FifoPair p(fake_);
  std::vector<Buffer*> bufs;
  Request* r = postRecv(p, {3}, 4096, &bufs);
  ASSERT_NE(r, nullptr);
  fake_.run();
  Request* s = nullptr;
  ASSERT_EQ(isend(p, 0, 3, 1, &s), ncclSuccess);
  ASSERT_NE(s, nullptr);
  size_t got[kGroupMax] = {7, 7};
  ASSERT_TRUE(p.waitDone(r, got)) << "a 0-byte receive never completed";
  EXPECT_EQ(got[0], 0u);
  EXPECT_TRUE(p.waitDone(s));
  EXPECT_EQ(bufs[0]->bytes[0], 0xee) << "a 0-byte message wrote into the buffer";
  bufs.clear();
  r = postRecv(p, {0, 1}, 4096, &bufs);
  ASSERT_NE(r, nullptr);
  fake_.run();
  Request* s0 = nullptr;
  Request* s1 = nullptr;
  ASSERT_EQ(isend(p, 100, 1, 2, &s1), ncclSuccess);
  ASSERT_EQ(isend(p, 0, 0, 3, &s0), ncclSuccess);
  ASSERT_NE(s0, nullptr);
  ASSERT_NE(s1, nullptr);
  got[0] = got[1] = 7;
  ASSERT_TRUE(p.waitDone(r, got)) << "a group with a 0-byte member never completed";
  EXPECT_EQ(got[0], 0u);
  EXPECT_EQ(got[1], 100u);
  EXPECT_TRUE(matchesPattern(bufs[1]->data(), 100, 2));
  EXPECT_TRUE(p.waitDone(s0));
  EXPECT_TRUE(p.waitDone(s1));
}

// Messages below NCCL_MESH_SPLIT_MIN are not split; they take turns over the connection's QPs
// (one per FIFO slot), so small traffic uses every link and both functions of a Spark cable,
// as NCCL's IB transport rotates its QPs. (A mutation that put every small message on QP 0
// passed the whole suite: the fabric's functions scenario has too few small bytes to show it.)
TEST_F(FifoEngine, MessagesBelowTheSplitSizeTakeTurnsOverEveryQp) {
  PairOptions o;
  o.links = 2;
  o.qpsPerLink = 2;
  FifoPair p(fake_, o);
  const int kMessages = 32;
  const size_t kSize = 4096;  // below splitMin (64 KiB): one QP per message
  for (int m = 0; m < kMessages; ++m) {
    Request* r = postRecv(p, {0}, kSize);
    ASSERT_NE(r, nullptr);
    fake_.run();
    Request* s = nullptr;
    ASSERT_EQ(isend(p, kSize, 0, m, &s), ncclSuccess);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(p.waitDone(r));
    ASSERT_TRUE(p.waitDone(s));
  }
  std::vector<uint32_t> qps;
  for (const char* dev : {"a0", "a1"}) {
    for (uint32_t qpn : fake_.qpnsOn(dev)) qps.push_back(qpn);
  }
  ASSERT_EQ(qps.size(), 4u) << "two links of two QPs on the sender";
  for (uint32_t qpn : qps) {
    uint64_t share = fake_.bytesWritten(qpn) / kSize;
    EXPECT_GE(share, kMessages / 4 - 1u) << "QP " << qpn << " carried " << share << " of " << kMessages;
    EXPECT_LE(share, kMessages / 4 + 1u) << "QP " << qpn << " carried " << share << " of " << kMessages;
  }
}

// A memory handle covers the devices of the comm it was registered through (mr_cache.h,
// issue 32); using it on a comm over other devices is a clear error, never a send with a
// zero key. NCCL registers through the comm that uses a buffer.
TEST_F(FifoEngine, HandleFromAnotherCommsDevicesIsRefused) {
  FifoPair p(fake_);
  Buffer* dst = p.buffer(false, 64, 0xee);
  Buffer* src = p.buffer(true, 64, 1);
  dst->mh.regs[0] = nullptr;  // as if registered through a comm on another device
  void* data[1] = {dst->data()};
  size_t sizes[1] = {64};
  int tags[1] = {0};
  MrHandle* mh[1] = {&dst->mh};
  Request* r = nullptr;
  EXPECT_EQ(p.receiver()->irecv(1, data, sizes, tags, mh, &r), ncclInvalidUsage);
  EXPECT_EQ(r, nullptr);
  EXPECT_NE(warnings_.last().find("registered through another comm"), std::string::npos) << warnings_.last();
  dst->mh.regs[0] = &dst->regs[0];
  ASSERT_EQ(p.receiver()->irecv(1, data, sizes, tags, mh, &r), ncclSuccess);
  fake_.run();
  src->mh.regs[0] = nullptr;
  Request* s = nullptr;
  EXPECT_EQ(p.sender()->isend(src->data(), 64, 0, &src->mh, &s), ncclInvalidUsage);
  EXPECT_EQ(s, nullptr);
}

// ibv_post_send refuses part of a batch (bad_wr): the comm fails, and nothing more may be
// posted on it. It went on: the next completion pumped the group again past the refused
// WRs (its cursor had moved when the batch was built) and posted the final immediate, so
// the receiver, another process that never sees the sender's error, reported the message
// done with 22 of its 64 pieces never written.
TEST(FifoPostFailure, ABatchThePostRefusesFailsTheCommAndNothingIsPostedAfter) {
  FakeRdma fake;
  PairOptions o;
  o.maxWrBytes = 4096;  // B is 64 WRs, posted in batches of 32
  FifoPair p(fake, o);
  const size_t kA = 4096, kB = 64 * 4096;
  Buffer* ra = p.buffer(false, kA, 0xee);
  Buffer* rb = p.buffer(false, kB, 0xee);
  Buffer* sa = p.buffer(true, kA, 0x11);
  Buffer* sb = p.buffer(true, kB, 0x22);
  int tag = 0;
  Request* recvA = nullptr;
  Request* recvB = nullptr;
  auto post = [&](Buffer* b, size_t size, Request** out) {
    void* d = b->data();
    MrHandle* m = &b->mh;
    return p.receiver()->irecv(1, &d, &size, &tag, &m, out);
  };
  ASSERT_EQ(post(ra, kA, &recvA), ncclSuccess);
  ASSERT_EQ(post(rb, kB, &recvB), ncclSuccess);
  ASSERT_NE(recvA, nullptr);
  ASSERT_NE(recvB, nullptr);
  fake.run();  // both FIFO slots reach the sender
  Request* sendA = nullptr;
  Request* sendB = nullptr;
  ASSERT_EQ(p.sender()->isend(sa->data(), kA, 0, &sa->mh, &sendA), ncclSuccess);
  ASSERT_EQ(p.sender()->isend(sb->data(), kB, 0, &sb->mh, &sendB), ncclSuccess);  // B's WRs 0..31
  ASSERT_NE(sendA, nullptr);
  ASSERT_NE(sendB, nullptr);
  fake.run();  // A's final and B's first batch run: two completions wait on the sender's CQ

  fake.postAcceptsThenRefuses = 10;  // B's WRs 32..63: the 11th is refused
  int done = 0;
  size_t sz[kGroupMax] = {};
  EXPECT_EQ(p.sender()->test(sendB, &done, sz), ncclSystemError) << "the refused post fails the send comm";
  EXPECT_EQ(done, 0);
  fake.run();  // whatever the sender posted after the failure runs
  for (int i = 0; i < 4; ++i) {
    done = 0;
    ASSERT_EQ(p.receiver()->test(recvB, &done, sz), ncclSuccess);
    EXPECT_EQ(done, 0) << "the receiver completed a message the sender never finished";
    fake.run();
  }
  done = 0;
  EXPECT_NE(p.sender()->test(sendB, &done, sz), ncclSuccess);
  EXPECT_EQ(done, 0) << "the sender reported the torn send done";
}

}  // namespace
}  // namespace fake
}  // namespace mesh
