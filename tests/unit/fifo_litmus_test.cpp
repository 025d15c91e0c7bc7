// SPDX-License-Identifier: Apache-2.0
// Litmus test of the FIFO slot publish/consume protocol (comm.h, fifoSlotArrived) between two
// threads: a writer that stands in for the receiver's NIC, placing each slot in order (seqHead,
// the fields, seqTail last, as the bytes of one RDMA WRITE land), and a reader that runs the
// sender's check and then reads the fields, which must all belong to the sequence it accepted.
//
// What catches a missing barrier: under TSan (the sanitize tier runs FifoLitmus*), a
// fifoSlotArrived without its acquire loads leaves the field reads unordered with the writer's
// plain stores, and TSan reports the race on every run, x86 included. On an aarch64 machine the
// field check itself fails when the loads are reordered. Under qemu-aarch64 (arm64 tier) the
// test runs but cannot fail that way: the emulator runs guest threads on the x86 host's
// stronger memory model.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "mesh/datapath/comm.h"

namespace mesh {
namespace {

constexpr uint64_t kRounds = 20000;

// What the receiver would post as sequence `seq` (0-based) in entry `pos`: every field a
// function of both, so a field from another sequence is caught.
uint64_t addrOf(uint64_t seq, int pos) { return 0x7f0000000000ull + seq * 0x10000 + static_cast<uint64_t>(pos) * 0x100; }
uint64_t sizeOf(uint64_t seq, int pos) { return (seq * 8 + static_cast<uint64_t>(pos)) % 1000003; }
int32_t tagOf(uint64_t seq, int pos) { return static_cast<int32_t>(seq * 8 + static_cast<uint64_t>(pos)); }
uint32_t rkeyOf(uint64_t seq, int link) { return static_cast<uint32_t>(seq * 31 + static_cast<uint64_t>(link)); }
int nreqsOf(uint64_t seq) { return 1 + static_cast<int>(seq % kGroupMax); }

// The NIC's side: in-order placement of one WRITE. seqTail is stored last with release, the
// ordering PCIe and the NIC give a DMA write as seen by the CPU's acquire load.
void place(FifoSlot* slot, uint64_t seq, int pos) {
  __atomic_store_n(&slot->seqHead, seq + 1, __ATOMIC_RELAXED);
  slot->addr = addrOf(seq, pos);
  for (int l = 0; l < kMaxLinks; ++l) slot->rkeys[l] = rkeyOf(seq, l);
  slot->size = sizeOf(seq, pos);
  slot->tag = tagOf(seq, pos);
  slot->nreqs = nreqsOf(seq);
  __atomic_store_n(&slot->seqTail, seq + 1, __ATOMIC_RELEASE);
}

TEST(FifoLitmus, AcceptedSlotsNeverShowFieldsOfAnotherSequence) {
  // A heap SendCtrl, as in production (whole pages; zero = no slot posted).
  auto ctrl = std::make_unique<SendCtrl>();
  std::memset(ctrl.get(), 0, sizeof(SendCtrl));
  // The sender consumes in order and tells the "receiver" (writer) how far it got: the
  // writer reuses a FIFO slot only once the sender is done with its previous sequence, as
  // the receiver only reuses a slot whose receive completed.
  std::atomic<uint64_t> consumed{0};
  std::atomic<int> errors{0};

  std::thread writer([&] {
    for (uint64_t seq = 0; seq < kRounds; ++seq) {
      while (seq >= consumed.load(std::memory_order_acquire) + kFifoDepth) std::this_thread::yield();
      FifoSlot* group = ctrl->fifo[seq % kFifoDepth];
      for (int pos = 0; pos < nreqsOf(seq); ++pos) place(&group[pos], seq, pos);
    }
  });

  for (uint64_t seq = 0; seq < kRounds; ++seq) {
    const FifoSlot* group = ctrl->fifo[seq % kFifoDepth];
    while (!fifoSlotArrived(group[0], seq + 1)) std::this_thread::yield();
    int n = group[0].nreqs;
    if (n != nreqsOf(seq)) {
      errors.fetch_add(1);
      ADD_FAILURE() << "seq " << seq << ": nreqs " << n << " after the sequence words matched";
      n = 1;
    }
    for (int pos = 0; pos < n; ++pos) {
      while (!fifoSlotArrived(group[pos], seq + 1)) std::this_thread::yield();
      const FifoSlot& s = group[pos];
      bool ok = s.addr == addrOf(seq, pos) && s.size == sizeOf(seq, pos) && s.tag == tagOf(seq, pos);
      for (int l = 0; l < kMaxLinks; ++l) ok = ok && s.rkeys[l] == rkeyOf(seq, l);
      if (!ok && errors.fetch_add(1) < 5) {
        ADD_FAILURE() << "seq " << seq << " entry " << pos << ": a field from another sequence "
                      << "(addr " << std::hex << s.addr << ", tag " << std::dec << s.tag << ")";
      }
    }
    consumed.store(seq + 1, std::memory_order_release);
  }
  writer.join();
  EXPECT_EQ(errors.load(), 0);
}

// The same check refuses what the protocol must never accept.
TEST(FifoLitmus, HalfPlacedSlotsDoNotValidate) {
  FifoSlot s{};
  EXPECT_FALSE(fifoSlotArrived(s, 1));
  s.seqHead = 5;  // the first bytes landed, the last not yet
  EXPECT_FALSE(fifoSlotArrived(s, 5));
  s.seqHead = 4;
  s.seqTail = 5;  // the other way round (RDMA does not promise placement order)
  EXPECT_FALSE(fifoSlotArrived(s, 5));
  s.seqHead = 5;
  EXPECT_TRUE(fifoSlotArrived(s, 5));
  EXPECT_FALSE(fifoSlotArrived(s, 5 + kFifoDepth));  // a stale slot is not the next lap's
}

}  // namespace
}  // namespace mesh
