// SPDX-License-Identifier: Apache-2.0
// TwinComm (mesh/relay/relay_twin.h), the data path of a two-relay connection, over two
// in-process pairs of the fake RDMA (fifo_pair.h) standing in for its two legs: what NCCL
// sees when one leg fails while a part of a message is still owed to it.
#include <gtest/gtest.h>

#include <infiniband/verbs.h>

#include <memory>

#include "fifo_pair.h"
#include "mesh/relay/relay_twin.h"

namespace mesh {
namespace fake {
namespace {

// The TwinComm borrows the pairs' comms (the pairs close them); it is taken apart before them.
struct Twin {
  Twin(Comm* first, Comm* second) : comm(new TwinComm(first, std::unique_ptr<Comm>(second))) {}
  ~Twin() {
    Comm* a = comm->leg(0);
    Comm* b = comm->leg(1);
    comm->releaseSecond().release();  // the pair owns it
    a->setTwin(nullptr);
    b->setTwin(nullptr);
    delete comm;
  }
  TwinComm* comm;
};

void closeAll(std::unique_ptr<Twin>* twin, FifoPair* a, FifoPair* b) {
  twin->reset();  // before the comms it borrows
  a->closeComms();
  b->closeComms();
}

// test() as NCCL's proxy calls it, the wire running between calls, until it fails or
// completes (100 calls at most: the wire has long gone quiet by then).
ncclResult_t testAsNcclDoes(FakeRdma& fake, TwinComm* twin, Request* req, int* done) {
  ncclResult_t rc = ncclSuccess;
  *done = 0;
  for (int i = 0; i < 100 && rc == ncclSuccess && !*done; ++i) {
    fake.run();
    size_t got[1] = {};
    rc = twin->test(req, done, got);
  }
  return rc;
}

// A send's data goes on one leg; its zero-byte partner on the other leg waits for that
// leg's FIFO slot (it reaches the sender through another relay, later). If that leg fails
// then (its relay died), the whole send can never complete: NCCL must get an error from
// test() and from the next isend, not "not done" forever. The error was dropped, and the
// sender's NCCL spun with nothing to end it.
TEST(TwinComm, ASendWhosePartIsOwedToAFailedLegFails) {
  FakeRdma fake;
  FifoPair legA(fake), legB(fake);
  Buffer* src = legA.buffer(true, 4096, 7);
  Buffer* dst = legA.buffer(false, 4096, 0);
  void* data[1] = {dst->data()};
  size_t sizes[1] = {4096};
  int tags[1] = {5};
  MrHandle* mh[1] = {&dst->mh};
  Request* posted = nullptr;  // the receive reached leg A's sender only
  ASSERT_EQ(legA.receiver()->irecv(1, data, sizes, tags, mh, &posted), ncclSuccess);
  ASSERT_NE(posted, nullptr);
  fake.run();
  auto twin = std::make_unique<Twin>(legA.sender(), legB.sender());
  Request* whole = nullptr;
  for (int i = 0; i < 4 && whole == nullptr; ++i) {
    ASSERT_EQ(twin->comm->isend(src->data(), 4096, 5, &src->mh, &whole), ncclSuccess);
  }
  ASSERT_NE(whole, nullptr) << "leg A has the slot: the send is taken";
  ASSERT_EQ(twin->comm->leg(0), legA.sender());

  legB.sender()->markAsyncError(IBV_EVENT_QP_FATAL);  // leg B's relay is gone
  int done = 0;
  ncclResult_t rc = testAsNcclDoes(fake, twin->comm, whole, &done);
  EXPECT_EQ(done, 0);
  EXPECT_NE(rc, ncclSuccess) << "test() neither failed nor completed: NCCL would spin forever";
  Request* next = nullptr;
  EXPECT_NE(twin->comm->isend(src->data(), 4096, 6, &src->mh, &next), ncclSuccess)
      << "the next isend said \"not now\" instead of the failure";
  EXPECT_EQ(next, nullptr);
  closeAll(&twin, &legA, &legB);
}

// The receiving side: leg B has every FIFO slot in use, so the second half of a receive is
// owed to it; leg B then fails. The next irecv and the receive's test() report it.
TEST(TwinComm, AReceiveWhosePartIsOwedToAFailedLegFails) {
  FakeRdma fake;
  FifoPair legA(fake), legB(fake);
  Buffer* dst = legA.buffer(false, 4096, 0);
  Buffer* dstB = legB.buffer(false, 4096, 0);
  void* dataB[1] = {dstB->data()};
  size_t sizes[1] = {4096};
  int tags[1] = {9};
  MrHandle* mhB[1] = {&dstB->mh};
  int filled = 0;
  for (int i = 0; i < 2 * kFifoDepth; ++i) {  // until leg B says "not now"
    Request* r = nullptr;
    ASSERT_EQ(legB.receiver()->irecv(1, dataB, sizes, tags, mhB, &r), ncclSuccess);
    if (r == nullptr) break;
    ++filled;
  }
  ASSERT_GT(filled, 0);
  ASSERT_LT(filled, 2 * kFifoDepth) << "leg B never ran out of slots";
  auto twin = std::make_unique<Twin>(legA.receiver(), legB.receiver());
  void* data[1] = {dst->data()};
  MrHandle* mh[1] = {&dst->mh};
  Request* whole = nullptr;
  ASSERT_EQ(twin->comm->irecv(1, data, sizes, tags, mh, &whole), ncclSuccess);
  ASSERT_NE(whole, nullptr) << "leg A takes the receive; its leg B half is owed";

  legB.receiver()->markAsyncError(IBV_EVENT_QP_FATAL);
  int done = 0;
  ncclResult_t rc = testAsNcclDoes(fake, twin->comm, whole, &done);
  EXPECT_EQ(done, 0);
  EXPECT_NE(rc, ncclSuccess) << "test() neither failed nor completed";
  Request* next = nullptr;
  EXPECT_NE(twin->comm->irecv(1, data, sizes, tags, mh, &next), ncclSuccess);
  EXPECT_EQ(next, nullptr);
  closeAll(&twin, &legA, &legB);
}

}  // namespace
}  // namespace fake
}  // namespace mesh
