// SPDX-License-Identifier: Apache-2.0
// Little-endian field packing shared by the wire formats (listen handle, handshake, relay).
// Header-only and dependency-free, so the codecs still build standalone for the fuzzers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mesh {

inline void putLe(uint8_t* p, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(value >> (8 * i));
}

inline uint64_t getLe(const uint8_t* p, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(p[i]) << (8 * i);
  return value;
}

// The 16 bytes both control protocols (handshake_proto.h, relay_proto.h) open every message
// with: magic u32 | version u16 | type u16 | length u32 (the whole message) | reserved u32.
// Each protocol checks the values itself (its own magic, version, types and limits).
struct MessageHeader {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t type = 0;
  uint32_t length = 0;
  uint32_t reserved = 0;
};
constexpr size_t kMessageHeaderSize = 16;

inline MessageHeader getMessageHeader(const uint8_t* p) {
  MessageHeader h;
  h.magic = static_cast<uint32_t>(getLe(p, 4));
  h.version = static_cast<uint16_t>(getLe(p + 4, 2));
  h.type = static_cast<uint16_t>(getLe(p + 6, 2));
  h.length = static_cast<uint32_t>(getLe(p + 8, 4));
  h.reserved = static_cast<uint32_t>(getLe(p + 12, 4));
  return h;
}

inline void putMessageHeader(uint8_t* p, const MessageHeader& h) {
  putLe(p, h.magic, 4);
  putLe(p + 4, h.version, 2);
  putLe(p + 6, h.type, 2);
  putLe(p + 8, h.length, 4);
  putLe(p + 12, h.reserved, 4);
}

}  // namespace mesh
