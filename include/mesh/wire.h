// Little-endian field packing shared by the wire formats (listen handle, handshake).
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

}  // namespace mesh
