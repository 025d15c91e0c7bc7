// SPDX-License-Identifier: Apache-2.0
// The chunk plan: shares over QPs tile the message exactly, are 128-byte aligned, and WR
// counts respect the per-WR limit — including sizes beyond 2 GiB (v9+ sends).
#include <gtest/gtest.h>

#include "mesh/datapath/chunk_plan.h"

namespace mesh {
namespace {

void expectTiles(size_t size, int nqps, size_t splitMin) {
  size_t next = 0;
  for (int q = 0; q < nqps; ++q) {
    Span s = qpShare(size, q, nqps, splitMin);
    if (s.size() == 0) continue;
    EXPECT_EQ(s.lo, next) << "gap or overlap at QP " << q << " of size " << size;
    if (q > 0) {
      EXPECT_EQ(s.lo % kChunkAlignBytes, 0u);
    }
    next = s.hi;
  }
  EXPECT_EQ(next, size) << "shares must cover the whole message";
}

TEST(ChunkPlan, SmallMessagesGoWholeOnTheOwnerQp) {
  EXPECT_EQ(qpShare(4096, 0, 4, 65536).size(), 4096u);  // owner 0 by default
  EXPECT_EQ(qpShare(4096, 1, 4, 65536).size(), 0u);
  EXPECT_EQ(qpShare(0, 0, 4, 0).size(), 0u);
  // The sender rotates the owner (the FIFO slot): over 32 slots every QP of 2 (a Spark
  // cable's two functions) carries exactly half of the unsplit messages.
  int carried[2] = {0, 0};
  for (int slot = 0; slot < 32; ++slot) {
    for (int q = 0; q < 2; ++q) {
      Span s = qpShare(4096, q, 2, 65536, slot);
      if (s.size() != 0) {
        EXPECT_EQ(s.size(), 4096u);
        ++carried[q];
      }
    }
  }
  EXPECT_EQ(carried[0], 16);
  EXPECT_EQ(carried[1], 16);
  // One QP: always QP 0, whatever the owner.
  EXPECT_EQ(qpShare(4096, 0, 1, 65536, 5).size(), 4096u);
  // Split messages ignore the owner.
  EXPECT_EQ(qpShare(1 << 20, 0, 2, 65536, 1).size(), size_t{1} << 19);
}

TEST(ChunkPlan, SharesTileTheMessage) {
  for (size_t size : {size_t{65536}, size_t{65537}, size_t{1} << 20, (size_t{1} << 20) + 13, size_t{1000003}}) {
    for (int nqps : {1, 2, 3, 4, 7, 16}) expectTiles(size, nqps, 65536);
  }
}

TEST(ChunkPlan, SizesBeyondTwoGiB) {
  const size_t sizes[] = {(size_t{2} << 30) + 1, size_t{5} << 30, (size_t{17} << 30) + 12345};
  for (size_t size : sizes) {
    for (int nqps : {1, 2, 3, 16}) expectTiles(size, nqps, 65536);
    // One QP, 8 MiB per WR (rxe's max message): the WR count covers every byte.
    size_t wrs = wrCount(qpShare(size, 0, 1, 65536).size(), size_t{8} << 20);
    EXPECT_GE(wrs * (size_t{8} << 20), size);
    EXPECT_LT((wrs - 1) * (size_t{8} << 20), size);
  }
  // A 4 MiB + 1 byte send with a 64 KiB WR limit: 65 WRs.
  EXPECT_EQ(wrCount((size_t{4} << 20) + 1, 65536), 65u);
  EXPECT_EQ(wrCount(0, 65536), 0u);
}

}  // namespace
}  // namespace mesh
