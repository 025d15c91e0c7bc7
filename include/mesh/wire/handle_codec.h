// SPDX-License-Identifier: Apache-2.0
// The listen handle NCCL carries between ranks out of band (at most 128 bytes).
// It tells a connecting peer where our handshake listener is (every mesh address of this
// node, so the peer can route to the one it is cabled to), and a random token the peer
// must present. Pure code: encode/decode are unit-tested and fuzzed.
//
// Wire layout (little-endian, fixed width):
//   off size field
//     0    4 magic      kHandleMagic
//     4    2 version    kHandleVersion
//     6    2 port       TCP port of the handshake listener
//     8    8 token      random, chosen per listen comm
//    16    1 count      number of addresses that follow (1..kHandleMaxAddresses)
//    17    1 flags      0 (reserved, must be 0)
//    18    2 reserved   0
//    20  6*n addresses: ipv4 (4 bytes, network order), prefixLen (1), nic (1)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mesh {

constexpr size_t kHandleSize = 128;  // NCCL_NET_HANDLE_MAXSIZE
constexpr uint32_t kHandleMagic = 0x4853454du;  // "MESH" when read as little-endian bytes
constexpr uint16_t kHandleVersion = 1;
constexpr size_t kHandleHeaderSize = 20;
constexpr size_t kHandleAddressSize = 6;
constexpr size_t kHandleMaxAddresses = (kHandleSize - kHandleHeaderSize) / kHandleAddressSize;
static_assert(kHandleHeaderSize + kHandleMaxAddresses * kHandleAddressSize <= kHandleSize,
              "handle must fit NCCL_NET_HANDLE_MAXSIZE");
static_assert(kHandleMaxAddresses == 18, "wire format: 18 addresses per handle");

struct HandleAddress {
  uint32_t addr = 0;      // host byte order
  uint8_t prefixLen = 0;  // 0..32
  uint8_t nic = 0;        // listener-side NIC index: addresses with the same nic share a cable
  bool operator==(const HandleAddress& o) const {
    return addr == o.addr && prefixLen == o.prefixLen && nic == o.nic;
  }
};

struct Handle {
  uint64_t token = 0;
  uint16_t port = 0;
  std::vector<HandleAddress> addrs;
};

// Writes exactly kHandleSize bytes (unused tail zeroed). Fails, with a message a user can
// act on, when there are no addresses, more than kHandleMaxAddresses, or a prefix > 32.
bool encodeHandle(const Handle& handle, uint8_t* out, std::string* error);
// Reads a handle from len bytes. Rejects bad magic, unknown version, count 0 or above the
// maximum, non-zero flags/reserved, prefix > 32, a non-zero byte after the last address,
// and truncation, with a message.
// Never reads beyond in[len).
bool decodeHandle(const uint8_t* in, size_t len, Handle* out, std::string* error);

}  // namespace mesh
