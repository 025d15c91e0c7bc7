// SPDX-License-Identifier: Apache-2.0
// How one message is divided over a comm's QPs and into work requests. Pure arithmetic,
// shared by the send path and its unit tests (which cover sizes beyond 2 GiB).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mesh {

constexpr size_t kChunkAlignBytes = 128;

struct Span {
  size_t lo = 0;
  size_t hi = 0;  // exclusive
  size_t size() const { return hi - lo; }
};

// The bytes of a `size`-byte message that QP q (of nqps) carries. Below splitMin, or with
// one QP, QP `owner` (taken modulo nqps) carries everything: the sender rotates it from
// message to message, so that small messages too spread over every link and function of a
// comm (NCCL's IB transport rotates its QPs per message the same way); otherwise
// consecutive 128-byte-aligned shares, the last one shorter (possibly empty for tiny
// remainders).
inline Span qpShare(size_t size, int q, int nqps, size_t splitMin, int owner = 0) {
  if (nqps <= 1) return q == 0 ? Span{0, size} : Span{0, 0};
  if (size < splitMin) return q == owner % nqps ? Span{0, size} : Span{0, 0};
  size_t chunk = (size + static_cast<size_t>(nqps) - 1) / static_cast<size_t>(nqps);
  chunk = (chunk + kChunkAlignBytes - 1) / kChunkAlignBytes * kChunkAlignBytes;
  size_t lo = chunk * static_cast<size_t>(q);
  if (lo > size) lo = size;
  size_t hi = lo + chunk > size ? size : lo + chunk;
  return Span{lo, hi};
}

// Work requests needed for `len` bytes when one WR carries at most maxWr bytes.
inline size_t wrCount(size_t len, size_t maxWr) { return len == 0 ? 0 : (len + maxWr - 1) / maxWr; }

}  // namespace mesh
