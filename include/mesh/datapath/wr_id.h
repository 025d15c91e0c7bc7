// SPDX-License-Identifier: Apache-2.0
// wr_id encoding: completions are mapped back to requests by index + generation, never by
// raw pointer, so a stale completion for a recycled request is recognized and dropped.
//   bits  0..7   kind (WrKind)
//   bits  8..15  QP index within the comm (data QPs), or device slot (flush QPs)
//   bits 16..31  request index (recv, flush) or FIFO slot (send, ctrl)
//   bits 32..47  request generation
// The field widths are constants so that comm.h can bind its pool sizes, FIFO depth and
// QP counts to them with static_assert.
#pragma once

#include <cstdint>

namespace mesh {

constexpr int kWrIdQpBits = 8;
constexpr int kWrIdIndexBits = 16;
constexpr int kWrIdGenBits = 16;

enum class WrKind : uint8_t { SendBatch = 1, SendFinal = 2, Recv = 3, Ctrl = 4, Flush = 5 };

struct WrId {
  WrKind kind;
  uint8_t qp;
  uint16_t index;
  uint16_t gen;
};
static_assert(sizeof(WrId::qp) * 8 == kWrIdQpBits, "wr_id qp field");
static_assert(sizeof(WrId::index) * 8 == kWrIdIndexBits, "wr_id index field");
static_assert(sizeof(WrId::gen) * 8 == kWrIdGenBits, "wr_id generation field");

constexpr uint64_t encodeWrId(WrId w) {
  return uint64_t{static_cast<uint8_t>(w.kind)} | (uint64_t{w.qp} << 8) | (uint64_t{w.index} << 16) |
         (uint64_t{w.gen} << 32);
}

constexpr WrId decodeWrId(uint64_t v) {
  return WrId{static_cast<WrKind>(v & 0xff), static_cast<uint8_t>((v >> 8) & 0xff),
              static_cast<uint16_t>((v >> 16) & 0xffff), static_cast<uint16_t>((v >> 32) & 0xffff)};
}

static_assert(decodeWrId(encodeWrId(WrId{WrKind::Flush, 63, 65535, 4242})).gen == 4242, "wr_id gen");
static_assert(decodeWrId(encodeWrId(WrId{WrKind::Recv, 63, 65535, 1})).index == 65535, "wr_id index");
static_assert(decodeWrId(encodeWrId(WrId{WrKind::Ctrl, 200, 3, 1})).qp == 200, "wr_id qp");

}  // namespace mesh
